// Live views: the page's <main id="live" data-live="..."> names its SSE topic; on each
// "changed" event, fetch this page again and swap <main> in place (htmx keeps elements marked
// hx-preserve, so a half-typed answer survives). Without JavaScript the page is simply static.
(function () {
  "use strict";
  function start() {
    var main = document.getElementById("live");
    if (!main || !main.dataset.live || !window.EventSource || !window.htmx) return;
    var source = new EventSource(main.dataset.live);
    var busy = false, again = false;
    function refresh() {
      if (busy) { again = true; return; }
      busy = true;
      // A page shown for a refused action sits at its POST URL: it fetches its view instead.
      var url = main.dataset.view || window.location.href;
      htmx.ajax("GET", url, {target: "#live", select: "#live", swap: "outerHTML"})
        .finally(function () {
          busy = false;
          if (again) { again = false; refresh(); }
        });
    }
    source.addEventListener("changed", refresh);
    document.body.dataset.live = "connected";
    source.addEventListener("error", function () { document.body.dataset.live = "reconnecting"; });
    source.addEventListener("open", function () { document.body.dataset.live = "connected"; });
    window.addEventListener("pagehide", function () { source.close(); });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();

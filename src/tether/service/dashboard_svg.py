"""Charts and the agent graph drawn on the server as inline SVG: no script and no library,
so a page reads the same with JavaScript off. Every name drawn is escaped; every figure is also
in the SVG's <title> elements (a hover shows it, a screen reader reads it)."""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

END = "(end)"
"""The graph's node for "the run finished here" (a step whose next node is None)."""


def _n(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def _clock(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%H:%M")


def bars(counts: Sequence[int], *, since: float, width_s: float, label: str,
         kind: str = "steps", w: int = 720, h: int = 140) -> Markup:
    """A bar per bucket of `width_s` seconds from `since`, scaled to the largest, with the
    largest value and the window's first and last times on its axes (UTC)."""
    top = max([*counts, 1])
    pad_l, pad_b, pad_t = 44, 18, 8
    plot_w, plot_h = w - pad_l - 4, h - pad_b - pad_t
    step = plot_w / max(len(counts), 1)
    parts = [f'<svg class="chart bars {kind}" role="img" viewBox="0 0 {w} {h}" '
             f'width="100%" preserveAspectRatio="xMinYMin meet" data-total="{sum(counts)}" '
             f'aria-label="{escape(label)}: {sum(counts)} in all">',
             f"<title>{escape(label)}: {sum(counts)} in all</title>",
             f'<line class="axis" x1="{pad_l}" y1="{pad_t + plot_h}" x2="{w - 4}" '
             f'y2="{pad_t + plot_h}"/>',
             f'<text class="tick" x="{pad_l - 4}" y="{pad_t + 8}" text-anchor="end">{top}</text>',
             f'<text class="tick" x="{pad_l - 4}" y="{pad_t + plot_h}" text-anchor="end">0</text>',
             f'<text class="tick" x="{pad_l}" y="{h - 4}">{_clock(since)} UTC</text>',
             f'<text class="tick" x="{w - 4}" y="{h - 4}" text-anchor="end">'
             f"{_clock(since + width_s * len(counts))}</text>"]
    for i, c in enumerate(counts):
        if not c:
            continue
        bh = max(1.0, plot_h * c / top)
        x = pad_l + i * step
        parts.append(f'<rect class="bar" x="{_n(x + 0.5)}" y="{_n(pad_t + plot_h - bh)}" '
                     f'width="{_n(max(step - 1, 0.5))}" height="{_n(bh)}" data-n="{c}">'
                     f"<title>{_clock(since + i * width_s)}: {c}</title></rect>")
    parts.append("</svg>")
    return Markup("".join(parts))


def sparkline(counts: Sequence[int], *, label: str, w: int = 180, h: int = 32) -> Markup:
    """A small line of `counts` (the overview's throughput)."""
    top = max([*counts, 1])
    n = max(len(counts) - 1, 1)
    pts = " ".join(f"{_n(2 + i * (w - 4) / n)},{_n(h - 2 - (h - 4) * c / top)}"
                   for i, c in enumerate(counts))
    return Markup(f'<svg class="spark" role="img" viewBox="0 0 {w} {h}" width="{w}" '
                  f'height="{h}" data-total="{sum(counts)}" aria-label="{escape(label)}">'
                  f"<title>{escape(label)}</title>"
                  f'<polyline points="{pts}"/></svg>')


# -- the agent graph ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Placed:
    name: str
    x: float
    y: float


def layout(nodes: Sequence[str], edges: Mapping[tuple[str, str], int],
           start: str | None) -> dict[str, Placed]:
    """Columns by distance from the start node along the edges (breadth first; nodes no edge
    reaches after the reached ones, the end last), rows in the order `nodes` gives."""
    order = list(dict.fromkeys(nodes))
    depth: dict[str, int] = {}
    if start is not None and start in order:
        depth[start] = 0
        frontier = [start]
        while frontier:
            nxt = []
            for a in frontier:
                for b in [b for (x, b) in edges if x == a and b not in depth]:
                    depth[b] = depth[a] + 1
                    nxt.append(b)
            frontier = nxt
    last = max(depth.values(), default=-1)
    for name in order:
        if name not in depth and name != END:
            last += 1
            depth[name] = last
    if END in order:
        depth[END] = max([d for n, d in depth.items() if n != END], default=-1) + 1
    rows: dict[int, int] = {}
    placed: dict[str, Placed] = {}
    for name in order:
        col = depth[name]
        row = rows.get(col, 0)
        rows[col] = row + 1
        placed[name] = Placed(name, 20 + col * 240, 50 + row * 90)
    return placed


def graph(nodes: Sequence[str], edges: Mapping[tuple[str, str], int], start: str | None,
          on: frozenset[tuple[str, str]] = frozenset()) -> Markup:
    """The agent's nodes as boxes and the edges seen as arrows, each labelled with its count
    (and width growing with it); edges in `on` (one run's path) and their nodes highlighted."""
    places = layout(nodes, edges, start)
    bw, bh = 150, 36
    wide = max((p.x for p in places.values()), default=0) + bw + 40
    high = max((p.y for p in places.values()), default=0) + bh + 40
    top = max([*edges.values(), 1])
    lit = {n for e in on for n in e}
    out = [f'<svg class="graph" role="img" viewBox="0 0 {_n(wide)} {_n(high)}" '
           f'width="{_n(wide)}" height="{_n(high)}" aria-label="agent graph">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="14" '
           'markerHeight="14" markerUnits="userSpaceOnUse" orient="auto">'
           '<path d="M0,0 L10,5 L0,10 z"/></marker></defs>']
    for (a, b), count in edges.items():
        if a not in places or b not in places:
            continue
        pa, pb = places[a], places[b]
        sw = 1.5 + 4.5 * math.sqrt(count / top)
        cls = "edge on" if (a, b) in on else "edge"
        if a == b:  # a loop: an arc above the box
            x, y = pa.x + bw / 2, pa.y
            d = f"M{_n(x - 20)},{_n(y)} C{_n(x - 30)},{_n(y - 40)} {_n(x + 30)},{_n(y - 40)} " \
                f"{_n(x + 20)},{_n(y)}"
            lx, ly = x, y - 32
        else:
            x1, y1 = pa.x + bw, pa.y + bh / 2
            x2, y2 = pb.x, pb.y + bh / 2
            if pb.x <= pa.x:  # backwards: from the box's bottom, around below
                x1, y1, x2, y2 = pa.x + bw / 2, pa.y + bh, pb.x + bw / 2, pb.y + bh
                mid = max(y1, y2) + 30
                d = f"M{_n(x1)},{_n(y1)} C{_n(x1)},{_n(mid)} {_n(x2)},{_n(mid)} {_n(x2)},{_n(y2)}"
                lx, ly = (x1 + x2) / 2, mid - 4
            else:
                cx = (x1 + x2) / 2
                d = f"M{_n(x1)},{_n(y1)} C{_n(cx)},{_n(y1)} {_n(cx)},{_n(y2)} {_n(x2)},{_n(y2)}"
                lx, ly = cx, (y1 + y2) / 2 - 6
        out.append(f'<g class="{cls}" data-from="{escape(a)}" data-to="{escape(b)}" '
                   f'data-count="{count}"><title>{escape(a)} → {escape(b)}: {count}</title>'
                   f'<path d="{d}" stroke-width="{_n(sw)}" marker-end="url(#arrow)"/>'
                   f'<text x="{_n(lx)}" y="{_n(ly)}" text-anchor="middle">{count}</text></g>')
    for p in places.values():
        cls = "node" + (" end" if p.name == END else "") + (" start" if p.name == start else "")
        cls += " on" if p.name in lit else ""
        label = p.name if len(p.name) <= 20 else p.name[:19] + "…"
        out.append(f'<g class="{cls}" data-node="{escape(p.name)}"><title>{escape(p.name)}'
                   f'</title><rect x="{_n(p.x)}" y="{_n(p.y)}" width="{bw}" height="{bh}" '
                   f'rx="6"/><text x="{_n(p.x + bw / 2)}" y="{_n(p.y + bh / 2 + 5)}" '
                   f'text-anchor="middle">{escape(label)}</text></g>')
    out.append("</svg>")
    return Markup("".join(out))

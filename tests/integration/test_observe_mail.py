"""Mail in the metrics: messages sent by committed steps and messages delivered to (consumed
by) steps, scraped, equal what the runs themselves recorded."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from apps import mail_app
from apps.inprocess import WAIT, working
from tether.observe import enable_metrics


def counters(text: str, name: str) -> dict[str, float]:
    return {s.labels["agent"]: s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == name}


async def test_mail_sent_and_delivered_equal_the_runs_records(db_url: str) -> None:
    rt = mail_app.make_runtime().with_db(db_url)
    metrics = enable_metrics(rt)
    async with working(rt):
        actor = await rt.start(mail_app.actor, mail_app.actor_input(expect=8), thread_id="act")
        for n in (100, 101):  # from outside: delivered, not sent by a step
            await rt.send(actor.thread_id, {"sender": None, "n": n})
        sender = await rt.start(mail_app.sender,
                                mail_app.sender_input([actor.thread_id], k=6, per_step=2),
                                thread_id="snd")
        sent = await rt.wait(sender.thread_id, timeout=WAIT)
        got = await rt.wait(actor.thread_id, timeout=WAIT)
    text = generate_latest(metrics.registry()).decode()
    assert sent.status == got.status == "completed"
    assert sent.state["steps"] == [1, 2, 3]  # 2 messages per step
    assert sorted(n for _, _, n, _ in got.state["got"]) == [0, 1, 2, 3, 4, 5, 100, 101]
    assert counters(text, "tether_mail_sent_total") == {"sender": 6}
    assert counters(text, "tether_mail_delivered_total") == {"actor": got.state["count"]} == {
        "actor": 8}

"""SQLite: what a claim's runs read before their first step (Store.load_claimed), as one
read job on one snapshot: which runs have mail and the journals of all of them in one
statement each; checkpoints and inboxes run by run, only for the runs that have them."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence

import orjson

from .base import INBOX_LIMIT, ClaimedReads, MessageRecord, RunRecord, never_ran
from .step_types import CheckpointRecord, JournalRecord

ALL_STEPS = 2**62  # the checkpoint reads' upper bound: every step


def claimed_reads(q: Mapping[str, str], runs: Sequence[RunRecord]
                  ) -> Callable[[sqlite3.Connection], dict[str, ClaimedReads]]:
    """The read job of Store.load_claimed for `runs`."""
    ids = orjson.dumps([r.thread_id for r in runs]).decode()
    ran = orjson.dumps([[r.thread_id, r.step + 1] for r in runs if not never_ran(r)])

    def read(c: sqlite3.Connection) -> dict[str, ClaimedReads]:
        mail = {row[0] for row in c.execute(q["with_mail"], {"ids": ids})}
        journals: dict[str, list[JournalRecord]] = {}
        for tid, idx, name, result, args in c.execute(q["load_journals"], (ran,)):
            journals.setdefault(tid, []).append(JournalRecord(idx, name, result, args))
        return {r.thread_id: ClaimedReads(
            [CheckpointRecord(*row) for row in c.execute(q["load_checkpoints"], {
                "thread_id": r.thread_id, "upto": ALL_STEPS})] if r.step > 0 else [],
            journals.get(r.thread_id, []),
            [MessageRecord(*row) for row in c.execute(q["load_inbox"], {
                "thread_id": r.thread_id, "limit": INBOX_LIMIT})] if r.thread_id in mail else [])
            for r in runs}

    return read

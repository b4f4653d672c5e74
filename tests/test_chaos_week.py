"""A lab's day under faults, short: ``bench/chaos_week.py --short`` as a person runs it (a
fixed seed, each kind of fault once), and no promise broken (docs/faults.md), but for a third
of the bookings promise 5 covers, on a machine the other tests share.

Needs root (network namespaces) and PostgreSQL's server programs (the run makes a cluster of
its own, which it restarts); elsewhere it says why and skips. CI runs it in its PostgreSQL
pass, as the cluster test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.cluster import namespaces_work

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.alone  # a lab of its own judged by its timing: ./slotserve test runs it after the others
def test_a_short_day_under_every_kind_of_fault_breaks_no_promise(tmp_path):
    why = namespaces_work()
    if why:
        pytest.skip(why)
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        pytest.skip(
            "the lab runs on PostgreSQL: it runs in the PostgreSQL pass (DATABASE_URL=postgres://...)"
        )
    if not list(Path("/usr/lib/postgresql").glob("*/bin/initdb")) or not shutil.which("runuser"):
        pytest.skip("PostgreSQL's server programs (initdb, pg_ctl) are not installed")
    results = tmp_path / "chaos.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLOTSERVE_", "DATABASE_URL", "DJANGO_"))}
    done = subprocess.run(
        [sys.executable, "bench/chaos_week.py", "--short", "--seed", "1", "--json", str(results)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    report = done.stdout[-6000:] + done.stderr[-3000:]
    assert results.exists(), report
    found = json.loads(results.read_text())
    kinds = {fault["kind"] for fault in found["faults"]}
    assert len(kinds) == 10, report  # every kind of fault, once
    assert all(fault["recovered_after"] is not None for fault in found["faults"]), report
    # Promise 5 (ready at the start) is judged against each booking's own measured load. Alone
    # on the 2-core machine every covered booking was ready in the last runs, even beside three
    # busy loops; a slower machine makes the decisions and switches later, and a third of the
    # bookings may miss (docs/faults.md). Every other promise holds, every time.
    assert [v for v in found["violations"] if v["promise"] != 5] == [], report
    ready = found["ready_at_start"]
    assert ready["covered"] >= 5 and ready["ready"] >= 0.6 * ready["covered"], report
    # The web process killed costs no booking: the others answer while it starts again (when
    # the killed one took the whole web part with it, a slower machine answered no one for
    # 27-48 s and the people gave up 12-17 of 48 bookings, leaving 2-6 covered ones to judge).
    assert "given up at its start, the control host away" not in found["refused"], report
    # Each promise was checked, and on more than a handful of cases.
    assert all(found["checks"].get(str(promise), 0) > 0 for promise in (1, 2, 3, 4, 5, 6, 7)), report
    assert found["webhooks"]["deliveries"] > 100, report
    assert found["requests"] > 500 and found["bookings_confirmed"] > 20, report
    # Lent slots were borrowed all through (docs/gateway.md, "Lending"), and promise 1 held there.
    assert found["log"]["borrowed"] > 10, report

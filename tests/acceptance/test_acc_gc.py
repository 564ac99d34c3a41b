"""The real daemon keeps its start-up objects out of full garbage collections and says
what those collections cost in ``/metrics`` (README "Behaviour", ``jobcontrol/gcpause.py``).
"""

from __future__ import annotations

import pytest

from tests.acceptance.harness import JobControl
from tests.acceptance.test_acc_full_disk import metrics

pytestmark = pytest.mark.timeout(120)


def test_the_daemon_freezes_its_start_up_objects_and_times_full_collections(
    jc_sqlite: JobControl,
) -> None:
    jc = jc_sqlite
    jc.upgraded()
    jc.ok("daemon", "start")
    m = metrics(jc)
    # Its modules, classes and functions, and those of its libraries: tens of thousands.
    assert m["jobcontrol_gc_frozen_objects"] > 10_000, m
    # The collection just before the freeze is the first one timed.
    assert m["jobcontrol_gc_full_collections_total"] >= 1, m
    # The build of the job tree held the collector off; it runs again once started.
    assert m["jobcontrol_gc_collector_running"] == 1, m
    longest = m["jobcontrol_gc_full_pause_seconds_max"]
    assert 0 < longest <= m["jobcontrol_gc_full_pause_seconds_total"], m

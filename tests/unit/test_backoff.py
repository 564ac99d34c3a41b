"""The waits between tries at a database that does not answer (``outage.Backoff``),
shared by the dispatcher, the worker, its log upload and the PostgreSQL relay."""

from __future__ import annotations

from jobcontrol.outage import RETRY_FIRST, RETRY_MAX, Backoff


def test_waits_double_up_to_the_cap_and_start_again_once_a_try_went_through() -> None:
    backoff = Backoff(0.05, 0.4)
    assert [backoff.next() for _ in range(6)] == [0.05, 0.1, 0.2, 0.4, 0.4, 0.4]
    backoff.reset()
    assert backoff.next() == 0.05


def test_the_default_waits_go_from_the_first_retry_to_the_cap() -> None:
    backoff = Backoff()
    waits = [backoff.next() for _ in range(12)]
    assert waits[0] == RETRY_FIRST
    assert waits[-1] == RETRY_MAX
    assert waits == sorted(waits)

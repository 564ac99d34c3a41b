"""The waits between tries at a database that does not answer (``outage.Backoff``),
shared by the dispatcher, the worker, its log upload and the PostgreSQL relay."""

from __future__ import annotations

import logging

import pytest

from jobcontrol.outage import RETRY_FIRST, RETRY_MAX, Backoff, Outage


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


def test_an_outage_says_a_drivers_error_of_several_lines_on_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # psycopg's "server closed the connection unexpectedly" comes with a tabbed second line:
    # a log record of its own in a one-record-per-line log, and a reason in another form.
    outage = Outage("notifications (daemon)")
    error = OSError(
        "consuming input failed: server closed the connection unexpectedly\n"
        "\tThis probably means the server terminated abnormally\n"
    )
    with caplog.at_level(logging.WARNING, logger="jobcontrol.outage"):
        outage.failed(error)
    said = (
        "consuming input failed: server closed the connection unexpectedly; "
        "This probably means the server terminated abnormally"
    )
    assert outage.state().error == said
    (record,) = caplog.records
    assert "\n" not in record.getMessage()
    assert "\t" not in record.getMessage()
    assert record.getMessage().endswith(said)

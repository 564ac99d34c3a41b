"""bench/bench_claims.py keeps working: its self-check drains a few hundred runs on each side.

The benchmark starts its own PostgreSQL server and, the first time, creates its own
virtualenv with the pinned procrastinate (``bench/.venv-procrastinate``, from PyPI). The
self-check judges correctness, not speed: every run finished exactly once on both sides
and no worker ever held more runs than its slots (from the run rows' claim intervals).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pgserver import PostgresServer

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.postgres
@pytest.mark.timeout(900)  # the first run installs procrastinate into the bench's venv
def test_bench_claims_self_check() -> None:
    if PostgresServer.available() is None:
        pytest.skip("PostgreSQL server binaries not found")
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_claims.py"), "--self-check", "--json"],
        capture_output=True,
        text=True,
        timeout=840,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    line = next(x for x in result.stdout.splitlines() if x.startswith("BENCH-JSON "))
    report = json.loads(line.removeprefix("BENCH-JSON "))
    figures = report["figures"]
    assert figures["jobcontrol jobs/s"]["value"] > 0
    assert figures["procrastinate jobs/s"]["value"] > 0
    assert not [n for n in report["notes"] if n.startswith("ERROR")]
    assert "jobcontrol: " in " ".join(report["notes"])  # its claims, statements, times

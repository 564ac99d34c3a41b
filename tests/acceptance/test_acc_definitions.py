"""The offline commands as a user runs them: db upgrade, load, ls, export, history, on both stores."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable

import pytest
import yaml

from jobcontrol.daemon import DatabaseLease
from jobcontrol.store import Store
from tests.acceptance.harness import (
    TESTSETUP,
    JobControl,
    describe,
    normalised_defs,
    write,
)

pytestmark = pytest.mark.timeout(120)

LS_KEYS = {
    "id",
    "name",
    "parent",
    "kind",
    "active",
    "state",
    "last_ran",
    "last_duration_ms",
    "exit_status",
    "next_runs",
    "timer",
    "command",
}
TESTSETUP_TREE = [
    # (name, parent, kind, timer, command)
    ("Periodic", None, "box", "every 10s", None),
    ("Box", "Periodic", "box", None, None),
    ("gcc error", "Box", "task", None, "gcc fred.c"),
    ("no-op ok", "Box", "task", None, "true"),
    ("Absolute", None, "box", None, None),
    ("foo", "Absolute", "task", "daily 22:56", "ls -l && sleep 6"),
    ("bar", "Absolute", "task", "daily 22:59", "true"),
]


def test_db_upgrade_creates_the_schema_and_is_idempotent(jc: JobControl) -> None:
    first = jc.ok("db", "upgrade")
    match = re.fullmatch(r"schema of (\S+) is at revision (\S+)\n", first.stdout)
    assert match, describe(first)
    assert match.group(2) not in ("None", ""), describe(first)

    second = jc.ok("db", "upgrade")
    assert second.stdout == first.stdout, "a second upgrade must find the same revision"
    assert jc.json("ls") == []


def test_errors_name_the_job_or_say_to_upgrade(jc: JobControl) -> None:
    # A SQLite file that is not there is not made by a read or a load (a mistyped --db);
    # an existing database without the schema is told to upgrade.
    said = (
        "`jobcontrol db upgrade` creates one"
        if jc.url.startswith("sqlite")
        else "has no Job Control schema yet: run `jobcontrol db upgrade`"
    )
    for refused in jc.run_all(jc.argv("ls"), jc.argv("load", str(TESTSETUP))):
        assert refused.returncode != 0, describe(refused)
        assert said in refused.stderr, describe(refused)
        assert "Traceback" not in refused.stderr, describe(refused)

    jc.upgraded()
    for refused in jc.run_all(jc.argv("history", "NO-SUCH-JOB"), jc.argv("export", "NO-SUCH-JOB")):
        assert refused.returncode != 0, describe(refused)
        assert refused.stderr == "jobcontrol: job 'NO-SUCH-JOB': no such job\n", describe(refused)
        assert refused.stdout == "", describe(refused)

    # A job written as its path in the tree, as a newcomer may: told its name alone.
    jc.load(TESTSETUP)
    refused = jc.run("history", "Periodic/Box")
    assert refused.returncode != 0, describe(refused)
    assert refused.stderr == (
        "jobcontrol: job 'Periodic/Box': no such job; job names are unique across all "
        "trees, so a job is named alone: 'Box'\n"
    ), describe(refused)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, describe(result)
    return result.stdout


def test_load_ls_export_round_trip(
    other_db_url: str, jc: JobControl, make_jc: Callable[[str], JobControl]
) -> None:
    # other_db_url comes first so that it is dropped after make_jc's cleanup.
    fresh = make_jc(other_db_url)
    for upgraded in jc.run_all(jc.argv("db", "upgrade"), fresh.argv("db", "upgrade")):
        ok(upgraded)
    loaded = jc.load(TESTSETUP)
    assert loaded.stdout == f"loaded {TESTSETUP}: 7 created, 0 changed, 0 deleted\n"

    box_file = jc.base / "box.yaml"
    listing, table, exported, box, box_to_file = map(
        ok,
        jc.run_all(
            jc.argv("ls", "--json"),
            jc.argv("ls"),
            jc.argv("export"),
            jc.argv("export", "Box"),
            jc.argv("export", "Box", "-o", str(box_file)),
        ),
    )
    jobs = json.loads(listing)
    for job in jobs:
        assert job.keys() >= LS_KEYS, f"{job['name']}: missing {LS_KEYS - job.keys()}"
    names = {job["id"]: job["name"] for job in jobs}
    assert [
        (j["name"], names.get(j["parent"]), j["kind"], j["timer"], j["command"]) for j in jobs
    ] == TESTSETUP_TREE
    for job in jobs:  # inactive as in Inq's testSetup, never ran, nothing scheduled
        assert (job["active"], job["state"], job["last_ran"], job["next_runs"]) == (
            False,
            "idle",
            None,
            None,
        )
        assert job["last_duration_ms"] is None
    rows = table.splitlines()
    assert rows[0].split()[:4] == ["NAME", "KIND", "ACTIVE", "STATE"]
    assert len(rows) == 1 + len(jobs)
    for line, job in zip(rows[1:], jobs, strict=True):  # names indented by depth
        assert line.startswith("  " * job["depth"] + job["name"] + "  "), line

    assert normalised_defs(exported) == normalised_defs(TESTSETUP.read_text())

    # export JOB: only that sub-tree, rooted at the job, which says the box it sits in.
    periodic = yaml.safe_load(exported)["jobs"][0]
    inner = periodic["children"][0]
    assert yaml.safe_load(box) == {"jobs": [{"name": "Box", "parent": "Periodic", **inner}]}
    assert [d[0] for d in normalised_defs(box)] == ["Box", "gcc error", "no-op ok"]
    assert box_to_file == ""
    assert box_file.read_text() == box
    # Loaded back, it stays where it is and nothing changes: not a tree of its own.
    assert jc.load(box_file).stdout == f"loaded {box_file}: 0 created, 0 changed, 0 deleted\n"
    assert jc.ok("export").stdout == exported
    # Trees loaded from files of their own, then the whole export reloaded: nothing
    # changes (the top level's order is the dispatcher's, not the file's).
    for name in ("RA", "RB"):
        one = write(jc.base / f"{name}.yaml", f"jobs:\n  - name: {name}\n    command: 'true'\n")
        jc.load(one)
    everything = ok(jc.run("export"))
    again = write(jc.base / "again.yaml", everything)
    assert jc.load(again).stdout == f"loaded {again}: 0 created, 0 changed, 0 deleted\n"

    # The export loads into a fresh database and exports the same.
    export_file = write(jc.base / "exported.yaml", exported)
    into_fresh = fresh.load(export_file).stdout
    assert into_fresh == f"loaded {export_file}: 7 created, 0 changed, 0 deleted\n"
    assert fresh.ok("export").stdout == exported


# (file text, line of the problem, what stderr must say). Several files change a job
# that exists (Periodic's timer) before the problem: the load must still change nothing.
BAD_FILES = {
    "parent-of-a-nested-job": (
        """\
jobs:
  - name: New tree
    children:
      - name: t
        parent: Periodic
        command: "true"
""",
        5,
        "'parent' is for a job at the top of the file",
    ),
    "unknown-parent": (
        """\
jobs:
  - name: Periodic
    timer: every 5s
    children: []
  - name: Lost
    parent: Nowhere
    command: "true"
""",
        5,
        "Nowhere",
    ),
    "parent-cycle": (
        """\
jobs:
  - name: Periodic
    timer: every 5s
    children: []
  - name: Left
    parent: Right
    children: []
  - name: Right
    parent: Left
    children: []
""",
        5,
        "job 'Left': 'parent' makes a cycle in this file ('Left' under 'Right' -> 'Right' under 'Left')",
    ),
    "bad-schedule": (
        """\
jobs:
  - name: Periodic
    timer: every 5s
    children:
      - name: Brand new
        timer: every banana
        children: []
""",
        6,
        "invalid schedule 'every banana'",
    ),
    "unknown-key": (
        """\
jobs:
  - name: New tree
    children:
      - name: t
        command: "true"
        colour: red
""",
        6,
        "unknown key 'colour'",
    ),
    "duplicate-name": (
        """\
jobs:
  - name: Periodic
    timer: every 5s
    children:
      - name: Periodic
        command: "true"
""",
        5,
        "duplicate job name",
    ),
    "task-with-children": (
        """\
jobs:
  - name: Parent
    children:
      - name: Lonely task
        command: "true"
        children:
          - name: kid
            command: "true"
""",
        4,
        "not both",
    ),
    "bad-command": (
        """\
jobs:
  - name: Parent
    children:
      - name: quoting
        command: "echo 'unterminated"
""",
        5,
        "invalid command",
    ),
    "yaml-syntax": (
        """\
jobs:
  - name: Broken
    children: [
  - name: x
""",
        4,
        "invalid YAML",
    ),
    "box-in-db-as-task": (
        """\
jobs:
  - name: New root
    timer: every 5s
    children:
      - name: Periodic
        command: "true"
""",
        5,
        "is a box in the database",
    ),
}


def test_bad_files_are_refused_whole_with_file_and_line(jc_sqlite: JobControl) -> None:
    # SQLite only: every refusal comes before the batch's transaction, whatever the store.
    jc = jc_sqlite
    jc.upgraded().load(TESTSETUP)
    before = [r.stdout for r in jc.run_all(jc.argv("export"), jc.argv("ls", "--json"))]
    paths = {
        name: write(jc.base / f"{name}.yaml", text) for name, (text, _, _) in BAD_FILES.items()
    }
    # All at once: loads may overlap (each is refused on its own file's problem).
    results = jc.run_all(*(jc.argv("load", str(path)) for path in paths.values()))
    for (name, (_, line, reason)), refused in zip(BAD_FILES.items(), results, strict=True):
        assert refused.returncode != 0, describe(refused)
        assert "Traceback" not in refused.stderr, describe(refused)
        assert (
            f"{paths[name]}:{line}: " in refused.stderr
        ), f"{name}: wrong place\n{describe(refused)}"
        assert reason in refused.stderr, f"{name}: wrong reason\n{describe(refused)}"
        assert refused.stdout == "", describe(refused)
    after = [r.stdout for r in jc.run_all(jc.argv("export"), jc.argv("ls", "--json"))]
    assert before[0].startswith("jobs:\n"), before[0]
    assert before[1].startswith("["), before[1]
    assert after == before, "a refused load changed the database"


REDUCED = """\
jobs:
  - name: Periodic
    timer: every 10s
    children:
      - name: Box
        on_error: abort
        children:
          - name: gcc error
            command: gcc fred.c
"""


def test_load_replace_deletes_what_the_file_no_longer_has(jc: JobControl) -> None:
    jc.upgraded().load(TESTSETUP)
    reduced = write(jc.base / "reduced.yaml", REDUCED)

    kept = jc.load(reduced)
    assert "0 created, 0 changed, 0 deleted" in kept.stdout
    assert [j["name"] for j in jc.json("ls")] == [t[0] for t in TESTSETUP_TREE]

    replaced = jc.load(reduced, "--replace")
    assert "0 created, 0 changed, 1 deleted" in replaced.stdout
    # Only the file's trees are replaced: Absolute, not in the file, stays whole.
    assert [j["name"] for j in jc.json("ls")] == [
        t[0] for t in TESTSETUP_TREE if t[0] != "no-op ok"
    ]


def test_load_from_standard_input_missing_files_and_closed_pipes(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite.upgraded()
    missing = jc.fails("load", str(jc.base / "nowhere.yaml"))
    assert f"cannot read {jc.base / 'nowhere.yaml'}" in missing.stderr, describe(missing)
    assert jc.json("ls") == []
    latin = jc.base / "latin1.yaml"  # saved by an editor in Latin-1: one line, no traceback
    latin.write_bytes(b'jobs:\n  - name: caf\xe9\n    command: "true"\n')
    refused = jc.fails("load", str(latin))
    assert refused.stderr == (
        f"jobcontrol: {latin}:2: not UTF-8 text (byte 0xe9): save the file as UTF-8\n"
    ), describe(refused)
    assert jc.json("ls") == []

    piped = jc.ok("load", "-", input=TESTSETUP.read_text())
    assert piped.stdout == "loaded <stdin>: 7 created, 0 changed, 0 deleted\n"
    assert normalised_defs(jc.ok("export").stdout) == normalised_defs(TESTSETUP.read_text())

    # `jobcontrol ls --json | head -1`: the reader goes away; no traceback.
    reader_gone = subprocess.Popen(
        jc.argv("ls", "--json"),
        cwd=jc.base,
        env=jc.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert reader_gone.stdout is not None
    reader_gone.stdout.close()
    _, errors = reader_gone.communicate(timeout=60)
    assert errors == b""
    assert reader_gone.returncode == 141  # 128 + SIGPIPE, as a shell reports it


def test_a_daemon_does_not_start_in_the_middle_of_a_load(jc: JobControl) -> None:
    jc.upgraded()
    # A load in progress holds the database's lease shared, as `jobcontrol load` does.
    store = Store(jc.url)
    lease = DatabaseLease(store)
    lease.acquire(shared=True)
    try:
        start, load = jc.run_all(jc.argv("daemon", "start"), jc.argv("load", str(TESTSETUP)))
    finally:
        lease.release()
        store.dispose()
    assert start.returncode != 0, describe(start)
    assert "another Job Control daemon" in start.stderr, describe(start)
    assert jc.live_daemons() == []
    assert "7 created" in ok(load), "another load may run alongside"

"""Users and the audit trail from the command line, on both stores.

`jobcontrol user add|list|remove|token` and `jobcontrol audit` go straight to
the database (like `ls`); a token is printed once, a refusal exits non-zero
with its message on stderr, and user management is audited as 'local:<login>'.
"""

from __future__ import annotations

import os
import pwd
import re

import pytest

from jobcontrol.service import users
from jobcontrol.store import Store
from tests.acceptance.harness import TESTSETUP, JobControl, describe

pytestmark = pytest.mark.timeout(120)

TOKEN = re.compile(r"^jc_[A-Za-z0-9_-]{43}$", re.MULTILINE)
LOCAL = f"local:{pwd.getpwuid(os.getuid()).pw_name}"


def token_of(stdout: str) -> str:
    found = TOKEN.findall(stdout)
    assert len(found) == 1, stdout
    assert "will not be shown again" in stdout, stdout
    return found[0]


def authenticates_as(url: str, token: str) -> str | None:
    store = Store(url)
    try:
        user = users.authenticate(store, token)
        return None if user is None else f"{user.name}/{user.role}"
    finally:
        store.dispose()


def test_user_commands_end_to_end(jc: JobControl) -> None:
    jc.upgraded()
    alice = token_of(jc.ok("user", "add", "alice", "--role", "operator").stdout)
    assert authenticates_as(jc.url, alice) == "alice/operator"

    listed = jc.json("user", "list")
    assert [(u["name"], u["role"]) for u in listed] == [("alice", "operator")]
    assert listed[0]["last_seen"] is not None  # the token was just used
    assert set(listed[0]) == {"name", "role", "created", "token_created", "last_seen"}
    table = jc.ok("user", "list").stdout
    assert table.splitlines()[0].split() == ["NAME", "ROLE", "CREATED", "LAST", "SEEN"]
    assert alice not in table

    fresh = token_of(jc.ok("user", "token", "alice").stdout)
    assert fresh != alice
    assert authenticates_as(jc.url, alice) is None
    assert authenticates_as(jc.url, fresh) == "alice/operator"

    removed = jc.ok("user", "remove", "alice")
    assert removed.stdout == "removed user 'alice'\n"
    assert authenticates_as(jc.url, fresh) is None
    assert jc.ok("user", "list").stdout == "no users\n"

    trail = jc.json("audit")
    assert [(e["user"], e["operation"], e["result"]) for e in trail] == [
        (LOCAL, "user.remove", "ok"),
        (LOCAL, "user.token", "ok"),
        (LOCAL, "user.add", "ok"),
    ]
    assert alice not in str(trail)
    assert fresh not in str(trail)


def test_refusals_exit_non_zero_with_the_message_and_are_audited(jc: JobControl) -> None:
    jc.upgraded()
    jc.ok("user", "add", "bob", "--role", "viewer")
    refusals = {
        ("user", "add", "bob", "--role", "admin"): "user 'bob': a user with this name already exists",
        ("user", "add", "carl", "--role", "boss"): "user 'carl': unknown role 'boss' (one of viewer, operator, admin)",
        ("user", "remove", "nobody"): "user 'nobody': no such user",
        ("user", "token", "nobody"): "user 'nobody': no such user",
    }  # fmt: skip
    results = jc.run_all(*(jc.argv(*argv) for argv in refusals))
    for (argv, message), result in zip(refusals.items(), results, strict=True):
        assert result.returncode == 1, describe(result)
        assert result.stderr == f"jobcontrol: {message}\n", describe(result)
        assert result.stdout == "", describe(result)
        assert "jc_" not in result.stdout, argv

    assert [u["name"] for u in jc.json("user", "list")] == ["bob"]  # nothing written
    refused = jc.json("audit", "--user", LOCAL)
    assert sorted(e["detail"] for e in refused if e["result"] == "refused") == sorted(
        refusals.values()
    )


def test_audit_lists_loads_newest_first_in_pages(jc: JobControl) -> None:
    jc.upgraded().load(TESTSETUP)
    bad = jc.base / "bad.yaml"
    bad.write_text("jobs:\n  - name: Periodic\n    command: 'true'\n")
    refused = jc.fails("load", str(bad))
    jc.ok("user", "add", "viewer1", "--role", "viewer")

    everything = jc.json("audit")
    assert [(e["operation"], e["result"]) for e in everything] == [
        ("user.add", "ok"),
        ("definitions.load", "refused"),
        ("definitions.load", "ok"),
    ]
    assert everything[1]["detail"] == refused.stderr.removeprefix("jobcontrol: ").strip()
    assert "foo" in everything[2]["jobs"]

    page = jc.json("audit", "--limit", "2")
    assert [e["id"] for e in page] == [e["id"] for e in everything[:2]]
    rest = jc.json("audit", "--limit", "2", "--before", str(page[-1]["id"]))
    assert [e["id"] for e in rest] == [everything[2]["id"]]

    by_job = jc.json("audit", "--job", "gcc error")
    assert [e["id"] for e in by_job] == [everything[2]["id"]]
    table = jc.ok("audit", "--limit", "1").stdout.splitlines()
    assert table[0].split()[:5] == ["ID", "AT", "USER", "OPERATION", "RESULT"]
    assert LOCAL in table[1]
    assert "user.add" in table[1]
    # An offline load is the local user's, as every other offline change: no API user
    # named like the login could pass for it.
    assert {e["user"] for e in everything if e["operation"] == "definitions.load"} == {LOCAL}


def test_audit_reads_through_the_daemon_and_prints_what_could_forge_a_line_escaped(
    jc: JobControl,
) -> None:
    jc.upgraded().load(TESTSETUP)
    jc.ok("daemon", "start")
    try:
        added = jc.ok("lane", "add", "gpu")
        assert "gpu" in added.stdout
        # A value that reached the trail before names were checked: shown as its escapes.
        store = Store(jc.url)
        try:
            from jobcontrol.service import audit

            audit.record(store, "admin", "lane.add", ["ln\x1b[2J"], "ok", "row\n999 forged")
        finally:
            store.dispose()
        online = jc.json("audit", "--limit", "2")
        assert [e["operation"] for e in online] == ["lane.add", "lane.add"]
        table = jc.ok("audit", "--limit", "2").stdout.splitlines()
        assert len(table) == 3, table
        assert "ln\\x1b[2J" in table[1]
        assert "row\\n999 forged" in table[1]
        assert "\x1b" not in "\n".join(table)
        # So does `show`: a description's line break cannot forge a field's line.
        forged = "line1\nexit_status:      0 \x1b[31mRED\x1b[0m"
        jc.ok("set", "Periodic", f"description={forged}")
        shown = jc.ok("show", "Periodic").stdout
        [line] = [x for x in shown.splitlines() if x.startswith("description:")]
        assert line.endswith("line1\\nexit_status:      0 \\x1b[31mRED\\x1b[0m"), line
        assert "\x1b" not in shown
        # Its own exit_status line only (empty: it never ran), none forged.
        assert [x for x in shown.splitlines() if x.startswith("exit_status:")] == ["exit_status:"]
        assert jc.json("show", "Periodic")["description"] == forged  # as it is, in JSON
    finally:
        jc.ok("daemon", "stop")

"""Two databases on one machine, used by one user (issue 9, item 9): two real daemons side
by side, each CLI reaching its own daemon with its own token, and nothing of one database
overwritten by the other."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from jobcontrol import places
from tests.acceptance.harness import JobControl, describe, write

TREE = """\
jobs:
  - name: {name}
    timer: every 1h
    active: true
    children:
      - name: {name} task
        active: true
        command: echo {name}
"""


@pytest.fixture
def one_user(tmp_path: Path) -> Iterator[tuple[JobControl, JobControl]]:
    """One user (one HOME, one state directory) with two SQLite databases, and the
    environment a user has: no $JOBCONTROL_PORT, so both daemons want the default port."""
    base = tmp_path / "user"
    first = JobControl(f"sqlite:///{tmp_path}/first.db", base)
    second = JobControl(f"sqlite:///{tmp_path}/second.db", base)
    env = {k: v for k, v in first.env.items() if k != "JOBCONTROL_PORT"}
    first.env = second.env = env
    try:
        yield first, second
    finally:
        # They share the state directory: stop both daemons before either one's cleanup
        # looks for daemons left in it.
        for jc in (first, second):
            jc.run("daemon", "stop", "--kill", "--timeout", "30")
        problems = first.cleanup() + second.cleanup()
    assert not problems, "\n".join(problems)


def config_dir(jc: JobControl) -> Path:
    return jc.base / "home" / ".config" / "jobcontrol"


def token_file(jc: JobControl) -> Path:
    return places.token_file(config_dir(jc), jc.url)


def api_url(jc: JobControl) -> str:
    return places.url_file(jc.state_dir, jc.url).read_text().strip()


def names(jc: JobControl) -> list[str]:
    return [j["name"] for j in jc.json("ls")]


def test_two_daemons_on_two_databases_side_by_side(
    one_user: tuple[JobControl, JobControl], tmp_path: Path
) -> None:
    first, second = one_user
    for jc, name in ((first, "First"), (second, "Second")):
        jc.upgraded()
        jc.load(write(tmp_path / f"{name}.yaml", TREE.format(name=name)))

    started = first.ok("daemon", "start")
    assert "admin API: http://127.0.0.1:" in started.stdout, describe(started)
    first_token = token_file(first).read_text()
    started = second.ok("daemon", "start")
    assert "admin API: http://127.0.0.1:" in started.stdout, describe(started)

    # Both run, each on its own port, each with its own token file (0600).
    assert len(first.live_daemons()) == 2
    assert api_url(first) != api_url(second)
    if api_url(first).endswith(":8640"):  # (unless something else on the machine held it)
        log = next(second.state_dir.glob(f"daemon-{places.daemon_tag(second.url)}.log"))
        assert "port 8640 is in use" in log.read_text()
    assert token_file(first) != token_file(second)
    assert token_file(first).read_text() == first_token, "the second start overwrote it"
    for jc in (first, second):
        assert stat.S_IMODE(token_file(jc).stat().st_mode) == 0o600
    assert not (config_dir(first) / places.TOKEN_FILE).exists()  # no shared file any more

    # Each CLI reaches its own daemon with its own token (status needs the daemon).
    for jc, name in ((first, "First"), (second, "Second")):
        status = jc.json("status")
        assert [t["job"] for t in status["next_timers"]] == [name]
        assert names(jc) == [name, f"{name} task"]
        daemon = json.loads(jc.ok("daemon", "status", "--json").stdout)
        assert daemon["api"] == api_url(jc) + "/api/v1"
    # ... and one database's token opens nothing of the other's.
    with httpx.Client(timeout=10) as http:
        other = http.get(
            api_url(second) + "/api/v1/status",
            headers={"Authorization": f"Bearer {first_token.strip()}"},
        )
    assert other.status_code == 401


def test_a_taken_port_given_explicitly_is_refused_before_anything_changes(
    one_user: tuple[JobControl, JobControl],
) -> None:
    first, second = one_user
    first.upgraded()
    first.ok("daemon", "start")
    port = api_url(first).rsplit(":", 1)[1]
    first_token = token_file(first).read_text()
    second_db = Path(second.url.removeprefix("sqlite:///"))
    config_before = sorted(p.name for p in config_dir(first).iterdir())
    state_before = sorted(p.name for p in first.state_dir.iterdir())

    for refused in (
        second.fails("daemon", "start", "--port", port),
        second.fails("daemon", "start", env={**second.env, "JOBCONTROL_PORT": port}),
    ):
        assert f"port {port}: it is in use" in refused.stderr, describe(refused)
        assert len(refused.stderr.strip().splitlines()) == 1, describe(refused)

    assert not second_db.exists(), "the refused start created its database"
    assert sorted(p.name for p in config_dir(first).iterdir()) == config_before
    assert token_file(first).read_text() == first_token
    assert sorted(p.name for p in first.state_dir.iterdir()) == state_before
    assert first.json("status")["tree_state"]  # the first daemon's CLI still gets in


def test_user_token_write_refreshes_the_token_file(
    one_user: tuple[JobControl, JobControl],
) -> None:
    first, second = one_user
    for jc in (first, second):
        jc.upgraded()
        jc.ok("daemon", "start")
    old = token_file(first).read_text().strip()
    second_token = token_file(second).read_text()

    result = first.ok("user", "token", "admin", "--write")
    new = token_file(first).read_text().strip()
    assert new != old
    assert new not in result.stdout + result.stderr, "--write must not print the token"
    assert str(token_file(first)) in result.stdout, describe(result)
    assert stat.S_IMODE(token_file(first).stat().st_mode) == 0o600
    assert token_file(second).read_text() == second_token  # the other database's is left alone

    assert first.json("status")["tree_state"]  # the CLI uses the new token at once
    stale = first.run("status", env={**first.env, "JOBCONTROL_TOKEN": old})
    assert stale.returncode == 1, describe(stale)
    assert "HTTP 401" in stale.stderr, describe(stale)
    assert second.json("status")["tree_state"]

    # Bad input changes nothing: an unknown user leaves the file as it was.
    refused = first.fails("user", "token", "nobody", "--write")
    assert "user 'nobody': no such user" in refused.stderr, describe(refused)
    assert token_file(first).read_text().strip() == new


def test_the_one_token_file_of_older_versions_stays_with_its_database(
    one_user: tuple[JobControl, JobControl],
) -> None:
    """Before, every database's first start wrote ``~/.config/jobcontrol/token``."""
    first, second = one_user
    first.upgraded()
    first.ok("daemon", "start")
    first.ok("daemon", "stop")
    legacy = config_dir(first) / places.TOKEN_FILE
    os.replace(token_file(first), legacy)  # as an older version left it
    legacy_token = legacy.read_text()

    # A running daemon that has not been restarted since: the CLI reads the old file.
    first.ok("daemon", "start")
    assert token_file(first).read_text() == legacy_token, "the start adopted its own token"
    token_file(first).unlink()
    assert first.json("status")["tree_state"], "the CLI falls back to the old file"

    # Another database's first start writes its own file and leaves the old one alone;
    # it does not adopt a token that is not one of its users'.
    second.upgraded()
    second.ok("daemon", "start")
    assert legacy.read_text() == legacy_token
    assert token_file(second).read_text() != legacy_token
    assert second.json("status")["tree_state"]

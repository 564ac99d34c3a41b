"""The pass-through list: which of the daemon's variables a task gets.

The real daemon is checked end to end in tests/acceptance/test_acc_secrets.py;
these pin the rules of the list itself, one environment at a time.
"""

from __future__ import annotations

import pytest

from jobcontrol.errors import OptionError
from jobcontrol.taskenv import PassEnv, resolve

pytestmark = pytest.mark.timeout(30)

DAEMON_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/home/ops",
    "LANG": "C.UTF-8",
    "LC_TIME": "en_GB.UTF-8",
    "LC_ALL": "C",
    "TZ": "Europe/London",
    "USER": "ops",
    "LOGNAME": "ops",
    "SHELL": "/bin/bash",
    "JOBCONTROL_DB": "postgresql+psycopg://jc:hunter2@db/jc",
    "JOBCONTROL_TOKEN": "jc_secret",
    "JOBCONTROL_PASS_ENV": "PATH",
    "NOTIFY_SOCKET": "/run/systemd/notify",
    "LISTEN_FDS": "1",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI",
    "PGPASSWORD": "hunter2",
    "ORACLE_HOME": "/opt/oracle",
}


def test_the_default_list_passes_the_basics_and_no_secret() -> None:
    passed = PassEnv().select(DAEMON_ENV)
    assert passed == {
        "PATH": "/usr/bin:/bin",
        "HOME": "/home/ops",
        "LANG": "C.UTF-8",
        "LC_TIME": "en_GB.UTF-8",
        "LC_ALL": "C",
        "TZ": "Europe/London",
        "USER": "ops",
        "LOGNAME": "ops",
        "SHELL": "/bin/bash",
    }


def test_a_list_replaces_the_default_and_never_passes_the_daemons_own() -> None:
    listed = PassEnv.parse(
        ["ORACLE_HOME,PG*", "JOBCONTROL_TOKEN, NOTIFY_SOCKET,JOBCONTROL_*"], source="--pass-env"
    )
    assert listed.select(DAEMON_ENV) == {"ORACLE_HOME": "/opt/oracle", "PGPASSWORD": "hunter2"}
    # Said at start, so an operator learns why the listed names did not arrive.
    assert listed.ignored() == ["JOBCONTROL_TOKEN", "NOTIFY_SOCKET"]
    assert listed.text == "ORACLE_HOME,PG*,JOBCONTROL_TOKEN,NOTIFY_SOCKET,JOBCONTROL_*"


def test_star_passes_everything_but_the_daemons_own() -> None:
    everything = PassEnv.parse(["*"], source="--pass-env").select(DAEMON_ENV)
    assert set(everything) == set(DAEMON_ENV) - {
        "JOBCONTROL_DB",
        "JOBCONTROL_TOKEN",
        "JOBCONTROL_PASS_ENV",
        "NOTIFY_SOCKET",
        "LISTEN_FDS",
    }


def test_an_empty_list_passes_nothing() -> None:
    assert PassEnv.parse([""], source="--pass-env").select(DAEMON_ENV) == {}


@pytest.mark.parametrize("entry", ["FOO-BAR", "PATH=x", "*FOO", "LC_*_X", "1ABC", "a b"])
def test_a_bad_entry_is_refused_naming_it_and_where_it_came_from(entry: str) -> None:
    with pytest.raises(OptionError) as refused:
        PassEnv.parse([f"PATH,{entry}"], source="JOBCONTROL_PASS_ENV")
    message = str(refused.value)
    assert message.startswith("JOBCONTROL_PASS_ENV: "), message
    assert repr(entry) in message, message
    assert "neither a variable name nor a PREFIX* pattern" in message


def test_the_option_wins_over_the_variable_which_wins_over_the_default() -> None:
    env = {"JOBCONTROL_PASS_ENV": "HOME"}
    assert resolve(["PATH"], env).entries == ("PATH",)
    assert resolve(None, env).entries == ("HOME",)
    assert resolve(None, {}) == PassEnv()
    with pytest.raises(OptionError, match="^--pass-env: 'a-b'"):
        resolve(["a-b"], env)


def test_patterns_that_cover_variables_never_passed_are_said_with_what_they_cover() -> None:
    listed = PassEnv.parse(
        ["PATH,JOBCONTROL_*,WATCHDOG*,J*,JOBCONTROL_D*,PG*,LISTEN_FD*"], source="--pass-env"
    )
    assert listed.withheld() == [
        ("JOBCONTROL_*", ["JOBCONTROL_*"]),
        ("WATCHDOG*", ["WATCHDOG_PID", "WATCHDOG_USEC"]),
        ("J*", ["JOBCONTROL_*"]),
        ("JOBCONTROL_D*", ["JOBCONTROL_D*"]),
        ("LISTEN_FD*", ["LISTEN_FDNAMES", "LISTEN_FDS"]),
    ]
    assert PassEnv().withheld() == []
    assert [entry for entry, _ in PassEnv.parse(["*"], source="x").withheld()] == ["*"]

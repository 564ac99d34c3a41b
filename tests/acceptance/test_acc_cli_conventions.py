"""The command line's conventions, checked the way a user meets them: the real
``jobcontrol`` command in a subprocess (issue 9, item 10)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from jobcontrol import __version__
from tests.acceptance.harness import JobControl, describe, write

ONE_TREE = """\
jobs:
  - name: Hourly
    timer: every 1h
    active: true
    children:
      - name: hello
        active: true
        command: echo hi
"""


def one_line_refusal(result: subprocess.CompletedProcess[str]) -> str:
    """A refusal as a user should see it: non-zero, one line on stderr, no traceback."""
    assert result.returncode != 0, describe(result)
    assert "Traceback" not in result.stderr, describe(result)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, describe(result)
    assert lines[0].startswith("jobcontrol: "), describe(result)
    return lines[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def listing(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


# ---------------------------------------------------------------- global options


def test_global_options_work_after_the_subcommand(jc_sqlite: JobControl, tmp_path: Path) -> None:
    jc = jc_sqlite.upgraded()
    jc.load(write(tmp_path / "one.yaml", ONE_TREE))
    db, state = jc.url, str(jc.state_dir)

    listed = jc.bare("ls", "--json", "--db", db, "--state-dir", state)
    assert listed.returncode == 0, describe(listed)
    assert [j["name"] for j in json.loads(listed.stdout)] == ["Hourly", "hello"]

    # Nested commands take them too, and -v (a logged command still answers).
    status = jc.bare("daemon", "status", "--db", db, "--state-dir", state)
    assert status.returncode == 3, describe(status)
    assert f"no daemon is running for {db}" in status.stdout
    verbose = jc.bare("history", "hello", "-v", "--db", db)
    assert verbose.returncode == 0, describe(verbose)
    assert "no runs" in verbose.stdout or verbose.stdout.startswith("RUN"), describe(verbose)

    # Given on both sides, the one nearer the command wins (it is the one the user added last).
    both = jc.bare("--db", str(tmp_path / "elsewhere.db"), "ls", "--json", "--db", db)
    assert both.returncode == 0, describe(both)
    assert [j["name"] for j in json.loads(both.stdout)] == ["Hourly", "hello"]

    # --url and --token after the command reach the daemon.
    jc.ok("daemon", "start")
    url = next(jc.state_dir.glob("daemon-*.url")).read_text().strip()
    token = jc.token_file.read_text().strip()
    online = jc.bare("status", "--json", "--url", url, "--token", token)
    assert online.returncode == 0, describe(online)
    assert json.loads(online.stdout)["timers_armed"] == 1
    assert "warning: --token puts the token on the command line" in online.stderr


def test_version(jc_sqlite: JobControl) -> None:
    result = jc_sqlite.bare("--version")
    assert result.returncode == 0, describe(result)
    assert result.stdout.strip() == f"jobcontrol {__version__}"


# ---------------------------------------------------------------- daemon status --json


def test_daemon_status_of_a_database_that_does_not_answer_does_not_say_none_runs(
    jc_sqlite: JobControl, tmp_path: Path
) -> None:
    """No daemon of this state directory, and a PostgreSQL server that refuses the
    connection: a daemon of another state directory, or of another host, may hold the
    database, which cannot say. ``daemon status`` says so, with the reason, rather than
    that no daemon runs for the database."""
    url = f"postgresql+psycopg://nobody@127.0.0.1:{free_port()}/jobs"
    state = tmp_path / "state"
    text = jc_sqlite.bare("--db", url, "--state-dir", state, "daemon", "status")
    assert text.returncode == 3, describe(text)  # none runs here
    assert "no daemon is running for" not in text.stdout, describe(text)
    assert f"no daemon of state directory {state} is running" in text.stdout, describe(text)
    assert f"whether another holds {url} is not known" in text.stdout, describe(text)
    assert "cannot reach the database: connection failed" in text.stdout, describe(text)
    reply = jc_sqlite.bare("--db", url, "--state-dir", state, "daemon", "status", "--json")
    assert reply.returncode == 3, describe(reply)
    status = json.loads(reply.stdout)
    assert status["running"] is False, status
    assert "connection failed" in status["database_problem"], status


def test_daemon_status_json(jc_sqlite: JobControl, tmp_path: Path) -> None:
    jc = jc_sqlite.upgraded()
    jc.load(write(tmp_path / "one.yaml", ONE_TREE))
    stopped = jc.run("daemon", "status", "--json")
    assert stopped.returncode == 3, describe(stopped)  # LSB: not running, as without --json
    assert json.loads(stopped.stdout) == {"running": False, "database": jc.url}

    jc.ok("daemon", "start")
    [pid] = jc.live_daemons()
    status = json.loads(jc.ok("daemon", "status", "--json").stdout)
    url = next(jc.state_dir.glob("daemon-*.url")).read_text().strip()
    assert status["running"] is True
    assert status["pid"] == pid
    assert status["database"] == jc.url
    assert status["api"] == f"{url}/api/v1"
    assert status["log"] == str(next(jc.state_dir.glob("daemon-*.log")))
    assert status["runs_in_flight"] == []
    assert status["trees_scheduled"] == ["Hourly"]


# ---------------------------------------------------------------- a database that does not answer


def test_an_unreachable_postgresql_is_one_clear_line(jc_sqlite: JobControl, tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    url = f"postgresql+psycopg://jc:hunter2@127.0.0.1:{port}/jobcontrol"
    env = {**jc_sqlite.env, "JOBCONTROL_DB": url}  # the password stays off the command line
    defs = write(tmp_path / "one.yaml", ONE_TREE)
    state = str(tmp_path / "state")
    for args in (
        ["ls"],
        ["history", "hello"],
        ["user", "list"],
        ["load", str(defs)],
        ["db", "upgrade"],
        ["daemon", "start"],
    ):
        line = one_line_refusal(jc_sqlite.bare("--state-dir", state, *args, env=env))
        assert f"127.0.0.1:{port}" in line, line
        assert "hunter2" not in line, line
        assert "Connection refused" in line or "connection" in line.lower(), line
    assert not jc_sqlite.live_daemons(Path(state))


def test_a_file_that_is_not_a_database_is_one_clear_line(
    jc_sqlite: JobControl, tmp_path: Path
) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    path = folder / "notes.txt"
    path.write_bytes(b"shopping list: eggs, flour, milk\n" * 200)
    before = listing(folder)
    defs = write(tmp_path / "one.yaml", ONE_TREE)
    state = str(tmp_path / "state")
    for args in (
        ["ls"],
        ["user", "list"],
        ["load", str(defs)],
        ["db", "upgrade"],
        ["daemon", "start"],
    ):
        line = one_line_refusal(jc_sqlite.bare("--db", path, "--state-dir", state, *args))
        assert str(path) in line, line
        assert "not a database" in line, line
    assert listing(folder) == before  # nothing written beside it, nothing changed in it
    assert not jc_sqlite.live_daemons(Path(state))


# ---------------------------------------------------------------- a mistyped --db


@pytest.mark.parametrize(
    "args",
    [
        ["ls"],
        ["ls", "--json"],
        ["history", "hello"],
        ["export"],
        ["workers"],
        ["user", "list"],
        ["user", "add", "alice", "--role", "viewer"],
        ["user", "token", "admin"],
        ["audit"],
        ["load", "DEFS"],
    ],
    ids=lambda a: "-".join(a),
)
def test_a_mistyped_db_creates_no_database(
    jc_sqlite: JobControl, tmp_path: Path, args: list[str]
) -> None:
    jc = jc_sqlite.upgraded()  # the user's real database, next to the typo
    defs = write(tmp_path / "one.yaml", ONE_TREE)
    args = [str(defs) if a == "DEFS" else a for a in args]
    real = Path(jc.url.removeprefix("sqlite:///"))
    typo = real.with_name("jobcontorl.db")
    in_new_dir = real.parent / "nowhere" / "jobcontrol.db"
    before = sorted(p.name for p in real.parent.iterdir())
    for path in (typo, in_new_dir):
        line = one_line_refusal(jc.bare("--db", path, "--state-dir", jc.state_dir, *args))
        assert f"no database at {path}" in line, line
        assert "jobcontrol db upgrade" in line, line
        assert not path.exists()
    assert not in_new_dir.parent.exists()
    # An empty variable (`--db "$DB"`) is refused, not taken for the default database.
    for empty in ("", " "):
        line = one_line_refusal(jc.bare("--db", empty, "--state-dir", jc.state_dir, *args))
        assert line == "jobcontrol: --db is empty: give a SQLite file's path or a database URL"
        # The same for the variable (`JOBCONTROL_DB="$(cat worker.url)"`, the file not there).
        env = {**jc.env, "JOBCONTROL_DB": empty}
        line = one_line_refusal(jc.bare("--state-dir", jc.state_dir, *args, env=env))
        assert line.startswith("jobcontrol: $JOBCONTROL_DB is set but empty: "), line
    assert sorted(p.name for p in real.parent.iterdir()) == before
    # No default database was made in its stead.
    assert not list(jc.base.glob("home/**/*.db")), list(jc.base.glob("home/**/*"))
    assert not list(jc.base.glob("xdg-state/**/*.db")), list(jc.base.glob("xdg-state/**/*"))


# ---------------------------------------------------------------- shell completion

# (words typed, the word being completed last) -> what must be offered
COMPLETIONS = [
    (["jobcontrol", ""], {"ls", "load", "daemon", "user", "completion", "history"}),
    (["jobcontrol", "daemon", "st"], {"start", "stop", "status"}),
    (["jobcontrol", "--db", "x.db", "daemon", "status", "--j"], {"--json"}),
    (["jobcontrol", "ls", "--"], {"--json", "--db", "--state-dir", "--url", "--token"}),
    (["jobcontrol", "user", "token", "admin", "--w"], {"--write"}),
    (["jobcontrol", "completion", ""], {"bash", "zsh"}),
    (["jobcontrol", "load", "defs/tr"], {"defs/trees.yaml"}),
    (["jobcontrol", "ls", "--db", "defs/"], {"defs/trees.yaml"}),
]


def completion_script(jc: JobControl, shell: str) -> str:
    result = jc.bare("completion", shell)
    assert result.returncode == 0, describe(result)
    assert result.stderr == "", describe(result)
    return result.stdout


def test_bash_completion(jc_sqlite: JobControl, tmp_path: Path) -> None:
    script = write(tmp_path / "jobcontrol.bash", completion_script(jc_sqlite, "bash"))
    write(tmp_path / "defs" / "trees.yaml", ONE_TREE)
    for words, wanted in COMPLETIONS:
        probe = (
            f"source {script}\n"
            'COMP_WORDS=("$@"); COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))\n'
            '_jobcontrol; printf "%s\\n" "${COMPREPLY[@]}"\n'
        )
        result = subprocess.run(
            ["bash", "--norc", "-c", probe, "bash", *words],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert result.returncode == 0, describe(result)
        assert result.stderr == "", describe(result)
        offered = set(result.stdout.split())
        assert wanted <= offered, f"{words}: offered {sorted(offered)}"
        if words[-1]:  # a started word: only what it starts
            assert all(w.startswith(words[-1]) for w in offered), f"{words}: {offered}"
    # The value of an option that is no file is not guessed.
    probe = f"source {script}; COMP_WORDS=(jobcontrol history --limit ''); COMP_CWORD=3; _jobcontrol; echo ${{#COMPREPLY[@]}}"
    result = subprocess.run(
        ["bash", "--norc", "-c", probe], capture_output=True, text=True, check=False
    )
    assert result.stdout.strip() == "0", describe(result)


ZSH_PROBE = """\
fpath=({funcs} $fpath)
autoload -U compinit && compinit -u -D
compadd() {{ [[ $1 == -- ]] && shift; print -rl -- "$@"; }}
_files() {{ print -rl -- {funcs_parent}/defs/*(N); }}
words=("$@"); CURRENT=$#words
_jobcontrol
"""


def test_zsh_completion(jc_sqlite: JobControl, tmp_path: Path) -> None:
    zsh = shutil.which("zsh")
    if zsh is None:
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail("CI=true but zsh is not installed (.ci/run installs it)")
        pytest.skip("zsh is not installed")
    # Installed the way the README says: a file _jobcontrol in a directory of $fpath.
    write(tmp_path / "zfunc" / "_jobcontrol", completion_script(jc_sqlite, "zsh"))
    write(tmp_path / "defs" / "trees.yaml", ONE_TREE)
    probe = ZSH_PROBE.format(funcs=tmp_path / "zfunc", funcs_parent=tmp_path)
    for words, wanted in COMPLETIONS:
        result = subprocess.run(
            [zsh, "-f", "-c", probe, "zsh", *words],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert result.returncode == 0, describe(result)
        offered = {Path(w).name if "defs" in w else w for w in result.stdout.split()}
        wanted = {Path(w).name if "defs" in w else w for w in wanted}
        assert wanted <= offered, f"{words}: offered {sorted(offered)}"


# ---------------------------------------------------------------- jobcontrol-admin without Qt

NO_QT = '''\
"""Stands for an install without the gui extra: PySide6 is not there."""
raise ModuleNotFoundError("No module named 'PySide6'", name="PySide6")
'''


def test_jobcontrol_admin_without_the_gui_extra_says_how_to_install_it(
    jc_sqlite: JobControl, tmp_path: Path
) -> None:
    write(tmp_path / "no-qt" / "PySide6" / "__init__.py", NO_QT)
    env = {**jc_sqlite.env, "PYTHONPATH": str(tmp_path / "no-qt")}
    script = Path(sys.executable).parent / "jobcontrol-admin"
    for argv in ([str(script)], [sys.executable, "-m", "jobcontrol_admin"]):
        result = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode == 1, describe(result)
        assert "Traceback" not in result.stderr, describe(result)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, describe(result)
        assert "the gui extra" in lines[0], describe(result)
        assert "pip install 'jobcontrol[gui]'" in lines[0], describe(result)


def test_a_bad_log_level_starts_nothing(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite.upgraded()
    for command in (("daemon", "start"), ("daemon", "run"), ("worker", "start")):
        refused = jc.run(*command, "--log-level", "loud")
        assert refused.returncode == 2, describe(refused)
        assert (
            "argument --log-level: 'loud' is not a log level: use DEBUG, INFO, WARNING or ERROR"
            in refused.stderr
        ), refused.stderr
        assert "Traceback" not in refused.stderr, refused.stderr
    assert jc.live_daemons() == []
    assert not jc.state_dir.exists(), "nothing is created for a refused start"


def test_a_mistake_in_the_command_line_is_one_line_that_names_it(
    jc_sqlite: JobControl, tmp_path: Path
) -> None:
    db = tmp_path / "none.db"
    cases = [
        (("daemon", "start", "--slots", "abc"), "argument --slots: invalid int value: 'abc'"),
        # A value that starts with '-' is taken for an option: the line says how to give it.
        (
            ("worker", "start", "--drain-timeout", "-5s"),
            "argument --drain-timeout: expected one argument (a value that starts with '-' "
            "is given as --OPTION=VALUE)",
        ),
        (("bogus",), "argument COMMAND: invalid choice: 'bogus'"),
    ]
    for args, said in cases:
        refused = jc_sqlite.bare(*args, "--db", db)
        assert refused.returncode == 2, describe(refused)
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1, f"one line, not the whole usage: {refused.stderr}"
        assert lines[0].startswith(f"jobcontrol {args[0]}" if args[0] != "bogus" else "jobcontrol:")
        assert said in lines[0], lines[0]
    # A command left out: the usage, which lists them, comes with the error.
    bare = jc_sqlite.bare("daemon", "--db", db)
    assert bare.returncode == 2, describe(bare)
    assert bare.stderr.startswith("usage: jobcontrol daemon"), bare.stderr
    assert "{run,start,unit,stop,status}" in bare.stderr, bare.stderr
    # Given as the line says, the value reaches the option's own check.
    refused = jc_sqlite.bare("worker", "start", "--drain-timeout=-5s", "--db", db)
    assert "cannot read '-5s' as a duration" in refused.stderr, describe(refused)
    assert not db.exists()
    assert jc_sqlite.live_daemons() == []


def test_a_limit_under_one_is_refused_before_anything_is_read(
    jc_sqlite: JobControl, tmp_path: Path
) -> None:
    db = tmp_path / "none.db"  # not there: any read would say so first
    for command in ("history", "audit"):
        args = [command, "hello"] if command == "history" else [command]
        for limit, said in (("0", "must be at least 1, not 0"), ("ten", "'ten' is not a whole")):
            refused = jc_sqlite.bare(*args, "--limit", limit, "--db", db)
            assert refused.returncode == 2, describe(refused)
            last = refused.stderr.strip().splitlines()[-1]
            assert last.startswith(f"jobcontrol {command}: error: argument --limit: {said}"), last
    assert not db.exists()


def test_a_kill_wait_that_is_not_a_number_of_seconds_is_refused_before_anything_is_asked(
    jc_sqlite: JobControl, tmp_path: Path
) -> None:
    db = tmp_path / "none.db"  # not there: any read would say so first
    for wait, said in (
        ("-1", "must be from 0 to 86400 seconds, not -1"),
        ("nan", "must be from 0 to 86400 seconds, not nan"),
        ("soon", "'soon' is not a number"),
    ):
        refused = jc_sqlite.bare("kill", "hello", "--wait", wait, "--db", db)
        assert refused.returncode == 2, describe(refused)
        last = refused.stderr.strip().splitlines()[-1]
        assert last == f"jobcontrol kill: error: argument --wait: {said}", last
    assert not db.exists()


def test_ids_and_limits_past_what_a_database_holds(jc_sqlite: JobControl, tmp_path: Path) -> None:
    # A number past the largest id a database column holds is refused as an id, and as a
    # count asks for every row: never the driver's overflow and a traceback.
    jc = jc_sqlite.upgraded()
    jc.load(write(tmp_path / "one.yaml", ONE_TREE))
    huge = str(2**64)
    for args in (
        ["history", "hello", "--before", huge],
        ["audit", "--before", huge],
        ["reprioritize", huge, "5"],
    ):
        refused = jc.run(*args)
        assert refused.returncode == 2, describe(refused)
        assert "Traceback" not in refused.stderr, describe(refused)
        last = refused.stderr.strip().splitlines()[-1]
        said = f"must be from 1 to {2**63 - 1}, not {huge}"
        assert last.endswith(f"argument {'run' if 'reprioritize' in args else '--before'}: {said}")
    assert jc.json("history", "hello", "--limit", huge) == []
    [loaded] = jc.json("audit", "--limit", huge)
    assert loaded["operation"] == "definitions.load", loaded


def test_a_history_longer_than_an_api_page_is_read_page_after_page(
    jc_sqlite: JobControl, tmp_path: Path
) -> None:
    # 1,005 past runs of one task, and the daemon up: `history` reads them through the
    # admin API, whose pages hold at most 1,000 runs.
    jc = jc_sqlite.upgraded()
    jc.load(write(tmp_path / "one.yaml", ONE_TREE))
    path = jc.url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:
        [(job_id,)] = db.execute("SELECT id FROM job WHERE name = 'hello'").fetchall()
        db.executemany(
            "INSERT INTO run (job_id, job_name, kind, trigger, state, queue, priority,"
            " exit_status, created, started, ended, duration_ms, kill_requested, attempt)"
            " VALUES (?, 'hello', 'task', 'manual', 'succeeded', 'default', 0, 0, ?, ?, ?,"
            " 0, 0, 1)",
            [
                (job_id, *[f"2026-11-01 {i // 3600:02}:{i // 60 % 60:02}:{i % 60:02}"] * 3)
                for i in range(1005)
            ],
        )
    db.close()
    jc.ok("daemon", "start")
    assert jc.live_daemons()

    runs = jc.json("history", "hello", "--limit", "1003")
    ids = [r["id"] for r in runs]
    assert len(ids) == 1003
    assert ids == sorted(set(ids), reverse=True)  # newest first, none twice
    every = [r["id"] for r in jc.json("history", "hello", "--limit", "5000")]
    assert len(every) == 1005
    assert every[:1003] == ids
    # A page after a run id goes on from there, across the API's pages too.
    rest = [
        r["id"] for r in jc.json("history", "hello", "--limit", "1002", "--before", str(every[2]))
    ]
    assert rest == every[3:]


def test_a_port_out_of_range_is_refused_before_the_daemon_starts(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite.upgraded()
    refused = jc.run("daemon", "start", "--port", "99999")
    assert refused.returncode == 2, describe(refused)
    last = refused.stderr.strip().splitlines()[-1]
    assert last.endswith("argument --port: must be from 0 (any free port) to 65535, not 99999")
    for value in ("70000", "-1", "http"):
        env = {**jc.env, "JOBCONTROL_PORT": value}
        line = one_line_refusal(jc.run("daemon", "start", env=env))
        assert line == f"jobcontrol: $JOBCONTROL_PORT='{value}' is not a port number (0 to 65535)"
    assert not jc.live_daemons()


def test_tls_and_the_listen_address_are_refused_before_anything_is_made(
    jc_sqlite: JobControl,
) -> None:
    """A certificate without its key was dropped silently (the API served plain HTTP);
    a bad pair, or an address this host cannot listen on, was refused only after the
    database, the state directory and a log had been made."""
    jc = jc_sqlite  # no database yet
    (jc.base / "junk.pem").write_text("not a certificate\n")
    junk = str(jc.base / "junk.pem")
    alone = one_line_refusal(jc.run("daemon", "start", "--port", "0", "--tls-cert", junk))
    assert alone == (
        "jobcontrol: --tls-cert without --tls-key: TLS needs both the certificate and its key "
        "(nothing was started)"
    ), alone
    key_alone = one_line_refusal(jc.run("daemon", "start", "--port", "0", "--tls-key", junk))
    assert key_alone.startswith("jobcontrol: --tls-key without --tls-cert: "), key_alone
    bad = one_line_refusal(
        jc.run("daemon", "start", "--port", "0", "--tls-cert", junk, "--tls-key", junk)
    )
    assert "not a PEM certificate and its private key" in bad, bad
    missing = one_line_refusal(
        jc.run("daemon", "run", "--port", "0", "--tls-cert", "/nonexistent", "--tls-key", junk)
    )
    assert "could not be read: No such file or directory" in missing, missing
    listen = one_line_refusal(jc.run("daemon", "start", "--port", "0", "--listen", "999.1.1.1"))
    assert listen.startswith(
        "jobcontrol: the admin API cannot listen on 999.1.1.1 port 0: "
    ), listen
    assert not jc.live_daemons()
    assert not jc.state_dir.exists(), "nothing is created for a refused start"
    assert not Path(jc.url.removeprefix("sqlite:///")).exists(), "no database either"


def test_daemon_slots_out_of_range_or_none_on_sqlite_start_nothing(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite.upgraded()
    for value in ("-1", "1025"):
        line = one_line_refusal(jc.run("daemon", "start", "--slots", value))
        assert line == (
            f"jobcontrol: --slots must be from 0 (workers of their own run the tasks) to 1024, "
            f"not {value}"
        ), line
    # No worker can serve a SQLite database: a daemon without slots would run nothing.
    line = one_line_refusal(jc.run("daemon", "start", "--slots", "0"))
    assert line.startswith("jobcontrol: --slots 0 on SQLite: nothing would run the tasks"), line
    assert not jc.live_daemons()


def test_an_empty_file_is_refused_and_left_empty(jc_sqlite: JobControl, tmp_path: Path) -> None:
    """``: > jobs.db`` then a command that only reads or edits: refused in one line, and
    the file stays empty (opening it would have written a SQLite header and WAL files)."""
    folder = tmp_path / "data"
    folder.mkdir()
    path = folder / "jobs.db"
    path.touch()
    defs = write(tmp_path / "one.yaml", ONE_TREE)
    state = str(tmp_path / "state")
    for args in (
        ["ls"],
        ["history", "hello"],
        ["export"],
        ["workers"],
        ["lanes"],
        ["load", str(defs)],
        ["db", "backup", str(tmp_path / "copy.db")],
    ):
        line = one_line_refusal(jc_sqlite.bare("--db", path, "--state-dir", state, *args))
        assert f"{path} is an empty file" in line, line
        assert "jobcontrol db upgrade" in line, line
    assert listing(folder) == {"jobs.db": b""}, "no header written, no WAL files beside it"
    assert path.stat().st_size == 0
    assert not (tmp_path / "copy.db").exists()

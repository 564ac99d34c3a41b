"""The online commands of ``jobcontrol``: everything said to a running daemon over its admin API.

The daemon is found by ``--url`` (or ``$JOBCONTROL_URL``), else by the URL
file the daemon of ``--db`` left in the state directory while its pid file is
live. The token is ``--token``, else ``$JOBCONTROL_TOKEN``, else the token file
in the config directory (written by the daemon's first start). ``ls``,
``history``, ``workers``, ``load`` and ``export`` fall back to the database
when no daemon runs; the other commands need one.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, BinaryIO

from jobcontrol import places
from jobcontrol.cli import argtypes
from jobcontrol.cli import lanes as cli_lanes
from jobcontrol.cli import output as out
from jobcontrol.client.locate import Target, find_token
from jobcontrol.errors import JobControlError, clip
from jobcontrol.model import DEFAULT_MAX_LOG_FILES, RUNS_PAGE_MAX, RunState
from jobcontrol.store import redact

if TYPE_CHECKING:
    from jobcontrol.client import Client

# Commands that only exist online, and those that also work on the database alone.
DAEMON_ONLY = frozenset(
    "show run kill restart activate deactivate set rm logs status events pause resume".split()
)
COMMANDS = (
    DAEMON_ONLY | {"ls", "history", "workers", "load", "export", "audit"} | cli_lanes.COMMANDS
)
AUDIT_PAGE_MAX = 500  # the API's largest page of the audit trail

# `set` sends JSON of the type each field has; a value given empty clears a text field.
_BOOL_FIELDS = {"active"}
_INT_FIELDS = {"priority", "max_log_files", "retries", "job_order"}
_CLEARABLE = {
    "description",
    "command",
    "timer",
    "cwd",
    "box_type",
    "timeout",
    "parent",
    "max_log_files",  # back to the default (5)
}
_TRUE, _FALSE = {"true", "yes", "y", "1", "on"}, {"false", "no", "n", "0", "off"}
# Fields that cannot be empty: `set JOB field=` puts them back to a new job's value.
_DEFAULTED = {"queue": "default", "priority": 0, "retries": 0, "misfire": "run-once"}
# How long `kill` waits for the run to be recorded killed: the kill grace (5 s by default:
# a TERM, then a KILL), and a remote worker's hearing of it at its next beat at worst.
KILL_WAIT_S = 15.0
# The order `show` lists a job's fields in (the rest follow).
SHOW_ORDER = (
    "name id kind parent state started run_id active description command timer box_type "
    "on_error queue priority timeout retries misfire max_log_files cwd env job_order last_ran "
    "last_duration_ms exit_status next_runs version last_updated updated_by"
).split()


# ---------------------------------------------------------------- arguments


def add_global_options(p: argparse._ActionsContainer, *, default: Any = None) -> None:
    p.add_argument(
        "--url",
        default=default,
        help="the daemon's admin API (env JOBCONTROL_URL; default: the URL the daemon "
        "of --db left in the state dir)",
    )
    p.add_argument(
        "--token",
        default=default,
        help="API token (env JOBCONTROL_TOKEN; default: the token file in the config dir)",
    )


def add_parsers(sub: Any) -> None:
    def command(name: str, text: str, *, data: bool = True) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = sub.add_parser(name, help=f"{text} (needs the daemon)")
        if data:
            parser.add_argument("--json", action="store_true", help="JSON for scripts")
        return parser

    command("show", "every field and the live state of a job").add_argument("job")
    command("run", "run a job and its sub-tree now").add_argument("job")
    kill = command("kill", "kill the run a job is part of")
    kill.add_argument("job")
    kill.add_argument(
        "--wait",
        type=argtypes.seconds,
        default=KILL_WAIT_S,
        metavar="SECONDS",
        help="how long to wait until the run is recorded killed; a run not ended by then "
        f"exits 1, naming the workers asked to kill it (default {KILL_WAIT_S:g}; 0: only ask)",
    )
    command("restart", "re-arm a top-level job's timer").add_argument("job")
    command("activate", "activate jobs (one batch)").add_argument("jobs", nargs="+")
    command("deactivate", "deactivate jobs (one batch)").add_argument("jobs", nargs="+")
    edit = command("set", "change fields of a job in one batch (field=value; empty clears)")
    edit.add_argument("job")
    edit.add_argument("changes", nargs="+", metavar="field=value")
    command("rm", "delete jobs with their sub-trees").add_argument("jobs", nargs="+")
    logs = command("logs", "the log of a job's newest run (or of --run N)", data=False)
    logs.add_argument("job")
    logs.add_argument("--run", type=argtypes.row_id, default=None, help="this run's log (a run id)")
    logs.add_argument("-f", "--follow", action="store_true", help="follow until the run ends")
    command("status", "the dispatcher: tree state, timers, runs in flight")
    events = command(
        "events", "the live event stream, one line per event, until Ctrl-C", data=False
    )
    events.add_argument("--after", type=int, default=None, help="start after this event's seq")
    command("pause", "stop timers firing (runs in flight go on)")
    command("resume", "re-arm the timers")


# ---------------------------------------------------------------- finding the daemon


def _no_daemon(args: argparse.Namespace) -> str:
    state_dir = args.state_dir or places.state_dir_default()
    needs = f"`jobcontrol {args.command}` needs the daemon's admin API"
    if places.live_pid(places.pid_file(state_dir, args.db)) is not None:
        return f"the daemon of {redact(args.db)} runs without its admin API (--no-api): {needs}"
    from jobcontrol.daemon import lease_holder

    holder = lease_holder(args.db)
    if holder is not None:
        return (
            f"no daemon of state directory {state_dir} is running, but another holds "
            f"{redact(args.db)} ({holder}): give its --state-dir, or --url: {needs}"
        )
    return (
        f"no daemon is running for {redact(args.db)} and no --url was given: {needs} "
        "(start the daemon with `jobcontrol daemon start`)"
    )


def refuse_unnamed_jobs(args: argparse.Namespace) -> None:
    """A job name no job can have, whatever the command and wherever it would be looked
    up: a line break (the API's path would drop it, or not match at all) or bytes that
    are not UTF-8 (no name can hold them). Answered as every unknown name is."""
    names = getattr(args, "jobs", None) or [getattr(args, "job", None)]
    for name in names:
        if isinstance(name, str) and (_undecodable(name) or "\n" in name):
            raise JobControlError(f"job {_quoted(name)}: no such job")


def _undecodable(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _quoted(name: str) -> str:
    """``name`` as a refusal repeats it, as ``repr`` would, with each byte of the command
    line that was not UTF-8 written as that byte (``'\\xff'``), not as the surrogate
    Python read it as."""
    shown = (
        f"\\x{ord(ch) - 0xDC00:02x}" if "\udc80" <= ch <= "\udcff" else repr(ch)[1:-1]
        for ch in name
    )
    return clip(f"'{''.join(shown)}'")


def read_source(file: str) -> tuple[str, str]:
    """(text, source name) of a definition file; ``-`` is standard input."""
    if file == "-":
        return _utf8(_capped(sys.stdin.buffer, "<stdin>"), "<stdin>"), "<stdin>"
    try:
        with open(file, "rb") as f:
            data = _capped(f, file)
    except OSError as exc:
        raise JobControlError(f"cannot read {file}: {exc.strerror}") from None
    return _utf8(data, file), file


# The most a definition file may hold: the admin API's limit on a request (its
# MAX_BODY_BYTES), so a file and a request are held to the same limits, on or offline.
DEFINITIONS_MAX_BYTES = 10 * 1024 * 1024


def _capped(stream: BinaryIO, source: str) -> bytes:
    """The bytes of ``stream``, refused past the limit without reading on (an endless
    ``/dev/zero`` is not read until memory runs out)."""
    data = stream.read(DEFINITIONS_MAX_BYTES + 1)
    if len(data) > DEFINITIONS_MAX_BYTES:
        raise JobControlError(
            f"{source} is larger than {DEFINITIONS_MAX_BYTES} bytes (10 MiB), the most a "
            "definition file may hold (as a request to the admin API): nothing was loaded"
        )
    return data


def _utf8(data: bytes, source: str) -> str:
    """Definition files are UTF-8 (YAML's and JSON's own default)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise JobControlError(
            f"{source}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}): "
            "save the file as UTF-8"
        ) from None


# ---------------------------------------------------------------- running a command


def run(args: argparse.Namespace, target: Target | None) -> int:
    """Run an online command against ``target``; refusals are raised as JobControlError."""
    if target is None:
        raise JobControlError(_no_daemon(args))
    from jobcontrol.client import ApiError, Client, DaemonUnreachableError

    token = find_token(args.token, args.db)
    try:
        with Client(target.url, token.value) as client:
            return COMMAND_HANDLERS[args.command](client, args)
    except ApiError as exc:
        if exc.status in (401, 403):
            used = f"using {token.source}" if token.value else token.source
            raise JobControlError(f"{exc} (HTTP {exc.status}, {used})") from None
        raise
    except DaemonUnreachableError as exc:
        raise JobControlError(f"{exc} (URL from {target.source})") from None


def _emit(args: argparse.Namespace, data: Any, human: str) -> int:
    print(json.dumps(data, indent=2) if getattr(args, "json", False) else human)
    return 0


def _ls(client: Client, args: argparse.Namespace) -> int:
    jobs = client.tree()["jobs"]
    return _emit(args, jobs, out.table_jobs(jobs))


def _show(client: Client, args: argparse.Namespace) -> int:
    job = client.job(args.job)
    shown = dict(job)
    if job.get("parent") is not None:
        shown["parent"] = client.job(job["parent"])["name"]
        if shown.get("misfire"):  # only a top-level job's misfire counts
            shown["misfire"] = f"{shown['misfire']} (no effect inside a box)"
    if "max_log_files" in shown and shown["max_log_files"] is None:
        shown["max_log_files"] = f"{DEFAULT_MAX_LOG_FILES} (default)"
    return _emit(args, job, out.fields(shown, SHOW_ORDER))


def _run(client: Client, args: argparse.Namespace) -> int:
    run_id = client.run_now(args.job)
    return _emit(args, {"run_id": run_id}, f"started run {run_id} of {args.job}")


def _kill(client: Client, args: argparse.Namespace) -> int:
    """A kill is a request: a task's worker kills its processes (a TERM, the grace, a
    KILL) and records the end. Said "killed" once the run is recorded so; after
    ``--wait`` without it, exit 1 naming who was asked (a worker cut off from the
    database kills it when it hears, or its lease lapses and the run is recorded lost)."""
    reply = client.kill_run(args.job)
    run_id, whose = reply["run_id"], reply.get("job") or args.job
    part = f" (the run {args.job} is part of)" if whose != args.job else ""
    run, holders = _wait_ended(client, run_id, args.wait)
    reply["state"] = run["state"]
    if run["state"] == RunState.KILLED:
        return _emit(args, reply, f"killed run {run_id} of {whose}{part}")
    if RunState(run["state"]).is_final:  # its end came first: what it records is its own
        text = f"run {run_id} of {whose}{part} ended {run['state']} before the kill reached it"
        return _emit(args, reply, text)
    reply["workers"] = holders
    asked = f"its worker{'s' if len(holders) > 1 else ''} {', '.join(holders)}" if holders else "it"
    if args.wait == 0:
        return _emit(args, reply, f"asked to kill run {run_id} of {whose}{part}: {asked} kills it")
    _emit(
        args,
        reply,
        f"asked to kill run {run_id} of {whose}{part}: not ended after {args.wait:g} s; "
        f"{asked} kills it on hearing the request (`jobcontrol history {whose}` shows the end)",
    )
    return 1


def _wait_ended(client: Client, run_id: int, wait: float) -> tuple[dict[str, Any], list[str]]:
    """The run once it ended or ``wait`` seconds passed, and the workers holding its task
    runs still running."""
    deadline = time.monotonic() + wait
    delay = 0.02
    while True:
        got = client.get_run(run_id)
        run = got["run"]
        if RunState(run["state"]).is_final or time.monotonic() >= deadline:
            break
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.5)
    holders = sorted(
        {r["worker"] for r in [run, *got["children"]] if r["state"] == "running" and r["worker"]}
    )
    return run, holders


def _restart(client: Client, args: argparse.Namespace) -> int:
    reply = client.rearm(args.job)
    when = reply.get("next_runs")
    if when:
        text = f"re-armed {args.job}: next run {out.when(when)}"
        if reply.get("held"):
            text += " (timers are paused: it fires once they are resumed)"
    elif reply.get("armed") is False and (timerless := _timerless(client, args.job)):
        text = f"{args.job} not armed: {timerless}"
    else:
        text = f"{args.job} not armed: {reply.get('reason') or 'no next run'}"
    return _emit(args, reply, text)


def _timerless(client: Client, job: str) -> str:
    """Why ``job`` is not armed when no job of its tree has a timer, else "" (the
    daemon's reason, "no schedule gives a time after now", reads as if one had)."""
    jobs = client.tree()["jobs"]
    top = next((j for j in jobs if j["name"] == job or str(j["id"]) == job), None)
    if top is None:
        return ""
    tree = {top["id"]}
    grew = True
    while grew:
        inside = {j["id"] for j in jobs if j["parent"] in tree}
        grew = not inside <= tree
        tree |= inside
    if any(j["timer"] is not None for j in jobs if j["id"] in tree):
        return ""
    return "it has no timer" if len(tree) == 1 else "no job of its tree has a timer"


def _activate(client: Client, args: argparse.Namespace) -> int:
    active = args.command == "activate"
    result = client.activate(args.jobs, active)
    return _emit(args, result, f"{args.command}d: {', '.join(j['name'] for j in result['jobs'])}")


def parse_changes(job: str, pairs: list[str]) -> dict[str, Any]:
    """``field=value`` arguments as the JSON the API takes (each field in its own type)."""
    fields: dict[str, Any] = {}
    for pair in pairs:
        key, eq, text = pair.partition("=")
        key = key.strip()
        if not eq or not key:
            raise JobControlError(f"job {job!r}: {pair!r} is not field=value")
        fields[key] = _field_value(job, key, text)
    return fields


def _field_value(job: str, key: str, text: str) -> Any:
    if key in _BOOL_FIELDS:
        if text.strip().lower() not in _TRUE | _FALSE:
            raise JobControlError(f"job {job!r}: {key} must be true or false, not {text!r}")
        return text.strip().lower() in _TRUE
    if key in _CLEARABLE and text == "":
        return None
    if key in _DEFAULTED and text == "":
        return _DEFAULTED[key]
    if key in _INT_FIELDS:
        try:
            return int(text)
        except ValueError:
            raise JobControlError(
                f"job {job!r}: {key} must be a whole number, not {text!r}"
            ) from None
    if key == "env":
        try:
            return json.loads(text) if text.strip() else {}
        except ValueError:
            raise JobControlError(
                f'job {job!r}: env must be a JSON object, like env=\'{{"A": "1"}}\''
            ) from None
    return text


def _set(client: Client, args: argparse.Namespace) -> int:
    fields = parse_changes(args.job, args.changes)
    current = client.job(args.job)
    # The version just read: a change made since by someone else is refused (409), not overwritten.
    change = {"job": current["name"], "version": current["version"], "fields": fields}
    from jobcontrol.client import ApiError

    try:
        result = client.modify([change])
    except ApiError as exc:  # the request's shape, as the body's path names it: say the job
        if exc.status != 422 or not str(exc).startswith("changes.0.fields."):
            raise
        problems = str(exc).replace("changes.0.fields.", "")
        raise JobControlError(f"job {args.job!r}: {problems}") from None
    new = next((j for j in result["jobs"] if j["id"] == current["id"]), None)
    if new is None:  # every field already had its value: nothing written, no reaction
        return _emit(args, result, f"{args.job}: nothing changed (already so)")
    human = f"modified {args.job} (version {current['version']} -> {new['version']})"
    return _emit(args, result, human)


def _rm(client: Client, args: argparse.Namespace) -> int:
    result = client.delete(args.jobs)
    count = result.get("deleted_jobs", len(result["deleted"]))  # a daemon from before it
    return _emit(args, result, f"deleted {out.count(count, 'job')}")


def _history(client: Client, args: argparse.Namespace) -> int:
    # A --limit past one API page is read a page after another, as the database's own
    # read gives it whole.
    runs: list[dict[str, Any]] = []
    before = args.before
    while len(runs) < args.limit:
        page = client.runs(
            args.job, limit=min(args.limit - len(runs), RUNS_PAGE_MAX), before=before
        )
        runs.extend(page["runs"])
        before = page.get("next")
        if before is None or not page["runs"]:
            break
    return _emit(args, runs, out.table_runs(runs))


def _audit(client: Client, args: argparse.Namespace) -> int:
    entries: list[dict[str, Any]] = []
    before = args.before
    while len(entries) < args.limit:
        page = client.audit(
            limit=min(args.limit - len(entries), AUDIT_PAGE_MAX),
            before=before,
            user=args.user,
            job=args.job,
        )
        entries.extend(page["entries"])
        before = page.get("next")
        if before is None or not page["entries"]:
            break
    return _emit(args, entries, out.table_audit(entries))


def _workers(client: Client, args: argparse.Namespace) -> int:
    workers = client.workers()
    return _emit(args, workers, out.table_workers(workers))


def _logs(client: Client, args: argparse.Namespace) -> int:
    if args.run is not None:
        run = client.get_run(args.run)["run"]
        if args.job not in (run["job_name"], str(run["job_id"])):
            raise JobControlError(
                f"run {args.run} is a run of {run['job_name']!r}, not {args.job!r}"
            )
    else:
        runs = client.runs(args.job, limit=1)["runs"]
        if not runs:
            raise JobControlError(f"job {args.job!r} has not run yet")
        run = runs[0]
    if run["kind"] == "box":
        if args.follow:
            raise JobControlError(
                f"{args.job} is a box: follow one of its tasks (jobcontrol logs TASK -f)"
            )
        return _box_logs(client, run)
    if not args.follow:
        for chunk in client.whole_log(run["id"]):
            sys.stdout.buffer.write(chunk)
        return 0
    with _interrupt_ends_the_stream():
        for chunk in client.follow_log(run["id"]):
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
    return 0


@contextmanager
def _interrupt_ends_the_stream() -> Iterator[None]:
    """Ctrl-C (SIGINT) ends a followed stream at once, with exit status 130.

    Not by KeyboardInterrupt: raised wherever the main thread happens to be, inside
    the HTTP library's locked sections among them, it can leave a lock held that the
    connection's close then waits on for good, and Ctrl-C seems not to work. What was
    printed is out already: each line or chunk is flushed as it is printed."""

    def stop(_signum: int, _frame: object) -> None:
        try:
            sys.stdout.flush()
        except (OSError, RuntimeError, ValueError):
            pass  # interrupted mid-write, or the reader went: nothing more to save
        os._exit(130)

    previous = signal.signal(signal.SIGINT, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _box_logs(client: Client, run: dict[str, Any]) -> int:
    """The logs of a box run's task runs, each under a header."""
    from jobcontrol.client import ApiError

    for child in client.get_run(run["id"])["children"]:
        if child["kind"] != "task":
            continue
        print(f"==> {child['job_name']} (run {child['id']}, {child['state']}) <==", flush=True)
        try:
            for chunk in client.whole_log(child["id"]):
                sys.stdout.buffer.write(chunk)
        except ApiError as exc:
            print(f"({exc})")
        sys.stdout.buffer.flush()
    return 0


def _status(client: Client, args: argparse.Namespace) -> int:
    s = client.status()
    db = s.get("database") or {"ok": True}
    timers = f"timers: {'paused' if s['paused'] else 'running'}, {s['timers_armed']} armed"
    due = s.get("timers_due", 0)
    if due:
        timers += f", {due} come due and not started"
    lines = [
        f"daemon version {s['version']}, up {s['uptime_s']:.0f}s, tree state {s['tree_state']}"
    ]
    if s.get("containment"):
        lines.append(f"task containment: {s['containment']}")
    if not db["ok"]:
        lines.append(
            f"database: UNAVAILABLE since {out.when(db['since'])}: {db['error']} "
            "(the daemon retries until it answers; nothing is lost meanwhile)"
        )
    elif db.get("not_answering"):
        lines.append(f"database: NOT ANSWERING: {db['not_answering']}")
    elif db.get("slow_write"):
        slow = db["slow_write"]
        lines.append(
            f"database: SLOW to answer: a write of {slow['thread']} under way for "
            f"{slow['seconds']:.1f}s (runs wait for it; past its timeout it is an outage)"
        )
    for space in (s.get("disk") or {}).values():
        if space["error"]:
            lines.append(f"{space['what']} {space['path']}: cannot be read: {space['error']}")
        elif space["low"]:
            lines.append(
                f"{space['what']} {space['path']}: LOW ON SPACE, {out.size(space['free_bytes'])} "
                f"free (low below {out.size(space['low_below_bytes'])})"
            )
    unlogged = s.get("daemon_log") or {}
    if unlogged.get("losing_since"):
        lines.append(
            f"daemon log: NOT WRITTEN since {out.when(unlogged['losing_since'])}, "
            f"{unlogged['lines_lost_since']} lines lost: {unlogged['error']}"
        )
    lines.append(timers)
    waits = (
        "waiting for the database"
        if not db["ok"]
        else "held while timers are paused"
        if s["paused"]
        else "starting"
    )
    due_timers = s.get("due_timers", [])
    lines += [f"  {t['job']} due at {out.when(t['at'])}, {waits}" for t in due_timers]
    lines += _more(due, len(due_timers))
    lines += [f"  {t['job']} at {out.when(t['at'])}" for t in s["next_timers"]]
    lines += _more(s["timers_armed"], len(s["next_timers"]))
    lines.append(f"runs in flight: {len(s['runs_in_flight'])}")
    lines += [
        f"  run {r['run_id']} {r['job']} ({r['trigger']}) since {out.when(r['started'])}"
        for r in s["runs_in_flight"]
    ]
    lines += [f"lane {x['name']} STOPPED: {x['reason']}" for x in s.get("stopped_lanes", [])]
    for u in s.get("unserved_queues") or []:
        last = u["last_worker"]
        heard = (
            "no worker has served it"
            if last is None
            else f"last worker {last['name']}, heard of {out.when(last['heartbeat'])}"
        )
        lines.append(
            f"queue {u['queue']}: {u['runs']} run(s) waiting since {out.when(u['oldest'])}, "
            f"no live worker serves it ({heard})"
        )
    lines.append(f"last event: {s['event_seq']}")
    return _emit(args, s, "\n".join(lines))


def _more(counted: int, listed: int) -> list[str]:
    """The line saying a list of timers the daemon cut short has more than it shows."""
    return [f"  ... and {counted - listed} more"] if counted > listed else []


def _events(client: Client, args: argparse.Namespace) -> int:
    with _interrupt_ends_the_stream():
        return _print_events(client, args)


def _print_events(client: Client, args: argparse.Namespace) -> int:
    for event in client.events(args.after):
        data = json.dumps(event.data, separators=(",", ":"), default=str)
        print(f"{'-' if event.seq is None else event.seq} {event.type} {data}", flush=True)
        if event.type == "resync":
            # The daemon's reason, which says a snapshot is wanted in its own words.
            why = str(event.data.get("reason") or "the events asked for are not kept")
            raise JobControlError(
                f"{why.split('; take a fresh', 1)[0]}: take a fresh `jobcontrol ls` and "
                "follow `jobcontrol events` from now"
            )
    # The stream has no end of its own: the daemon ended it, stopping.
    raise JobControlError(
        f"the daemon at {client.url} ended the event stream: it stopped (follow it again "
        "once it runs, with --after the last number above)"
    )


def _timers(client: Client, args: argparse.Namespace) -> int:
    result = client.pause() if args.command == "pause" else client.resume()
    verb = "held" if args.command == "pause" else "armed"
    human = f"timers {args.command}d ({result['timers_armed']} {verb})"
    return _emit(args, result, human)


def _load(client: Client, args: argparse.Namespace) -> int:
    text, source = read_source(args.file)
    result = client.load(text, source, replace=args.replace)
    print(
        f"loaded {source}: {len(result['created'])} created, {len(result['modified'])} changed, "
        f"{result.get('deleted_jobs', len(result['deleted']))} deleted"
    )
    return 0


def _export(client: Client, args: argparse.Namespace) -> int:
    write_export(client.export(args.job), args.output)
    return 0


def write_export(text: str, output: str | None) -> None:
    """``export``'s YAML to standard output or ``-o FILE``; a file that cannot be written
    is refused in one line, as ``load`` refuses one it cannot read."""
    if not output:
        sys.stdout.write(text)
        return
    try:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise JobControlError(f"cannot write {output}: {exc.strerror}") from None


COMMAND_HANDLERS = {
    "ls": _ls,
    "show": _show,
    "run": _run,
    "kill": _kill,
    "restart": _restart,
    "activate": _activate,
    "deactivate": _activate,
    "set": _set,
    "rm": _rm,
    "history": _history,
    "audit": _audit,
    "workers": _workers,
    "logs": _logs,
    "status": _status,
    "events": _events,
    "pause": _timers,
    "resume": _timers,
    "load": _load,
    "export": _export,
    **{name: cli_lanes.run_online for name in cli_lanes.COMMANDS},
}

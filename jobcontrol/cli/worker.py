"""``jobcontrol worker [run|start|stop|status]`` and ``jobcontrol worker-credentials``.

A worker is its own process (``workerd``), started on any host that reaches the
PostgreSQL database. The database URL comes from ``--db`` or, better (a command
line is public), ``$JOBCONTROL_DB``; ``worker start`` hands it to the detached
process in its environment, never on its command line.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import select
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from jobcontrol import cgroups, cpupin, slotgroups, taskenv
from jobcontrol.cli import unit
from jobcontrol.errors import JobControlError, OptionError
from jobcontrol.filemodes import LogAccess
from jobcontrol.places import live_pid, state_dir_default
from jobcontrol.store import redact

COMMANDS = frozenset({"worker", "worker-credentials"})


# The daemon's and a worker process's log levels (the admin API's ``LogLevel``).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_LEVEL_HELP = "DEBUG, INFO, WARNING or ERROR (default %(default)s)"


def log_level(text: str) -> str:
    """``--log-level``'s value, any case; refused before anything starts otherwise."""
    if text.upper() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a log level: use {', '.join(LOG_LEVELS[:-1])} or {LOG_LEVELS[-1]}"
        )
    return text.upper()


def add_parsers(sub: Any) -> None:
    w = sub.add_parser(
        "worker",
        help="a worker process on this host, claiming task runs from a PostgreSQL database",
        description="Runs task runs of the database's run queue on this host. Without an "
        "action it runs in the foreground (Type=notify under systemd); start/stop/status "
        "work like the daemon's.",
    )
    w.add_argument(
        "action", nargs="?", default="run", choices=("run", "start", "stop", "status", "unit")
    )
    w.add_argument(
        "--name", default=None, help="the worker's name, unique in the database (default: host)"
    )
    w.add_argument(
        "--queues",
        default=None,
        metavar="SPEC",
        help='slot groups, e.g. "fast_lane:1 manual,*:4" (default: "*:SLOTS", every queue)',
    )
    w.add_argument("--slots", type=int, default=None, help="one group of N slots, every queue")
    w.add_argument("--log-root", type=Path, default=None, help="where task logs go")
    w.add_argument("--log-level", type=log_level, default="INFO", help=LOG_LEVEL_HELP)
    w.add_argument("--log-format", choices=("text", "json"), default="text")
    w.add_argument(
        "--pass-env",
        action="append",
        default=None,
        metavar="NAME[,NAME|PREFIX*]",
        help=f"the worker's environment variables tasks get (default "
        f"{','.join(taskenv.DEFAULT_PASS_ENV)}); JOBCONTROL_* never",
    )
    w.add_argument("--log-group", default=None, metavar="GROUP", help="may read task logs")
    w.add_argument(
        "--drain-timeout",
        default=None,
        metavar="DURATION",
        help="after a stop (SIGTERM), kill the runs still in hand this long after it "
        "(255, e.g. 10m; default: wait for them)",
    )
    unit.add_options(w, user_default=None)  # None: refused outside `worker unit`
    w.add_argument("--kill", action="store_true", help="stop: kill the runs in hand (255)")
    w.add_argument("--timeout", type=float, default=60.0, help="stop: how long to wait")
    w.add_argument("--json", action="store_true", help="status: one JSON object")

    c = sub.add_parser(
        "worker-credentials",
        help="PostgreSQL logins for workers: they may claim, heartbeat and report runs only",
    )
    csub = c.add_subparsers(dest="credentials_command", required=True)
    add = csub.add_parser("add", help="create a worker login; prints its URL once (admin)")
    add.add_argument("name", help="the login's name (letters, digits, _)")
    add.add_argument(
        "--output",
        type=Path,
        default=None,
        help="write the worker's database URL to this file (0600) instead of printing it",
    )
    add.add_argument("--host", default=None, help="the database host workers reach")
    rm = csub.add_parser("remove", help="drop a worker login (admin)")
    rm.add_argument("name")
    csub.add_parser("list", help="the worker logins of this database")


def groups_from(args: argparse.Namespace) -> list[slotgroups.SlotGroup]:
    if args.queues is not None and args.slots is not None:
        raise OptionError("give --queues or --slots, not both (--slots N is --queues '*:N')")
    if args.queues is not None:
        return slotgroups.parse(args.queues)
    slots = 8 if args.slots is None else args.slots
    if not 1 <= slots <= slotgroups.MAX_SLOTS:
        raise OptionError(f"--slots must be from 1 to {slotgroups.MAX_SLOTS}, not {slots}")
    return slotgroups.every_queue(slots)


def drain_timeout_from(args: argparse.Namespace) -> float | None:
    if args.drain_timeout is None:
        return None
    from jobcontrol.definitions.durations import parse_duration

    try:
        return parse_duration(args.drain_timeout)
    except ValueError as exc:
        raise OptionError(f"--drain-timeout {args.drain_timeout!r}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    if args.command == "worker-credentials":
        return _credentials(args)
    from jobcontrol.workerd import WorkerOptions, check_name

    if args.action != "unit" and (args.user is not None or args.unit_command is not None):
        raise OptionError("--user and --command are options of `worker unit`")
    # An empty --name (an unset shell variable) is refused, not taken for the host's.
    name = check_name(socket.gethostname() if args.name is None else args.name)
    opts = WorkerOptions(db_url=args.db, name=name, state_dir=args.state_dir or state_dir_default())
    if args.action == "stop":
        return _stop(opts, args)
    if args.action == "status":
        return _status(opts, args)
    opts.groups = groups_from(args)
    opts.drain_timeout = drain_timeout_from(args)
    if args.action == "unit":
        return _unit(opts, args)
    opts.log_root = args.log_root
    opts.pass_env = taskenv.resolve(args.pass_env, os.environ)
    opts.log_access = LogAccess.for_group(args.log_group)
    opts.cgroups = cgroups.resolve_mode(os.environ)
    opts.cpu_pin = cpupin.resolve_mode(os.environ)
    from jobcontrol.daemon import configure_logging, start_detached
    from jobcontrol.store import Store
    from jobcontrol.workerd import RemoteWorker, refuse_unusable

    if args.action == "run":
        configure_logging("DEBUG" if args.verbose else args.log_level, fmt=args.log_format)
        RemoteWorker(opts).run_forever()
        return 0
    running = live_pid(opts.pid_file)
    if running is not None:  # said here: the new process would say it in the live one's log
        raise JobControlError(
            f"worker {name} is running already here (pid {running}, log {opts.log_file})"
        )
    store = Store(opts.db_url)  # refused here in one line, before anything is started
    try:
        refuse_unusable(store)
    finally:
        store.dispose()
    argv = ["--state-dir", str(opts.state_dir), "worker", "run", "--name", name]
    argv += ["--queues", slotgroups.format_groups(opts.groups)]
    argv += ["--log-level", args.log_level, "--log-format", args.log_format]
    argv += ["--log-root", str(opts.log_root)] if opts.log_root else []
    argv += ["--pass-env", opts.pass_env.text]
    argv += ["--log-group", opts.log_access.group] if opts.log_access.group else []
    argv += ["--drain-timeout", f"{opts.drain_timeout!r}"] if opts.drain_timeout else []
    pid = start_detached(opts, argv, what="worker")
    print(f"worker {name} started: pid {pid}, log {opts.log_file}")
    return 0


def _unit(opts: Any, args: argparse.Namespace) -> int:
    """``worker unit``: print a systemd unit running this worker (nothing is started)."""
    from jobcontrol.workerd import needs_postgres

    needs_postgres(opts.db_url)
    made = unit.worker_unit(
        opts.db_url,
        args.state_dir.resolve() if args.state_dir else None,
        name=opts.name,
        groups=slotgroups.format_groups(opts.groups),
        drain_timeout=opts.drain_timeout,
        log_root=opts.log_root,
        pass_env=args.pass_env,
        log_group=args.log_group,
        user=args.user or unit.DEFAULT_USER,
        command=args.unit_command,
    )
    sys.stdout.write(made.text)
    for note in made.notes:
        print(f"jobcontrol: {note}", file=sys.stderr)
    return 0


def _stop(opts: Any, args: argparse.Namespace) -> int:
    """SIGTERM: no new claims, the runs in hand end first; --kill: a second one kills them."""
    pid = live_pid(opts.pid_file)
    if pid is None:
        raise JobControlError(f"no worker {opts.name} is running here for {redact(opts.db_url)}")
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return 0
    try:
        os.kill(pid, signal.SIGTERM)
        if args.kill:
            os.kill(pid, signal.SIGINT)
        if not select.select([pidfd], [], [], args.timeout)[0]:
            why = (
                "its runs are killed; it waits to record their ends (see its log)"
                if args.kill
                else "it waits for its runs to end; use --kill to kill them"
            )
            raise JobControlError(
                f"worker {opts.name} (pid {pid}) did not stop within {args.timeout:g}s: {why}"
            )
    finally:
        os.close(pidfd)
    print(f"worker {opts.name} stopped (pid {pid})")
    return 0


def _status(opts: Any, args: argparse.Namespace) -> int:
    pid = live_pid(opts.pid_file)
    row: dict[str, Any] | None = None
    if pid is not None:
        from jobcontrol.service.engine import Engine
        from jobcontrol.store import Store

        store = Store(opts.db_url)
        try:
            row = next((w for w in Engine(store).workers() if w["name"] == opts.name), None)
        finally:
            store.dispose()
    if args.json:
        from jobcontrol.views import jsonable

        print(json.dumps({"running": pid is not None, "pid": pid, "worker": jsonable(row)}))
        return 0 if pid is not None else 3
    if pid is None:
        print(f"no worker {opts.name} is running here for {redact(opts.db_url)}")
        return 3  # LSB: program is not running
    print(f"worker {opts.name} running: pid {pid}, log {opts.log_file}")
    if row is not None:
        print(
            f"slots {row['used']}/{row['slots']} in use; last heartbeat "
            f"{row['heartbeat_age_s']:.1f}s ago; {row['containment']}"
        )
        for r in row["runs"]:
            print(f"  run {r['run_id']} {r['job']} since {r['since']}")
    return 0


def _credentials(args: argparse.Namespace) -> int:
    from jobcontrol.service import credentials
    from jobcontrol.store import Store

    store = Store(args.db)
    by = f"local:{getpass.getuser()}"
    try:
        if args.credentials_command == "add":
            url = credentials.add(store, args.name, host=args.host, by=by)
            if args.output is not None:
                from jobcontrol import filemodes

                fd = filemodes.open_private(args.output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                with open(fd, "w") as f:
                    f.write(url + "\n")
                print(
                    f"worker login {credentials.role_name(args.name)} created; URL in {args.output}"
                )
            else:
                print(url)
                print(
                    "jobcontrol: keep this URL secret: give it to the worker as $JOBCONTROL_DB "
                    "(or in a 0600 file), never on a command line",
                    file=sys.stderr,
                )
        elif args.credentials_command == "remove":
            credentials.remove(store, args.name, by=by)
            print(f"worker login {credentials.role_name(args.name)} dropped")
        else:
            for name in credentials.names(store):
                print(name)
    finally:
        store.dispose()
    return 0

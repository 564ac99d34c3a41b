"""The ``jobcontrol`` command. The only module that prints."""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from sqlalchemy.exc import SQLAlchemyError

from jobcontrol import cgroups, cpupin, diskspace, procs, slotgroups, taskenv
from jobcontrol.cli import argtypes
from jobcontrol.cli import lanes as cli_lanes
from jobcontrol.cli import online as cli_online
from jobcontrol.cli import output as out
from jobcontrol.cli import unit as cli_unit
from jobcontrol.cli import worker as cli_worker
from jobcontrol.client.locate import find_daemon, token_option_warning
from jobcontrol.errors import AlreadyRunningError, JobControlError, OptionError, UnknownUserError
from jobcontrol.filemodes import LogAccess
from jobcontrol.model import LOG_STORES, TASK_LOGS_ENV, embedded_worker_name
from jobcontrol.places import (
    default_config_dir,
    default_db_path,
    live_pid,
    normalise_url,
    state_dir_default,
    token_file,
)
from jobcontrol.store import Store, check_url, driver_message, redact
from jobcontrol.views import jsonable, run_json

log = logging.getLogger(__name__)


def _global_options(p: argparse.ArgumentParser, *, top: bool) -> None:
    """``--db``, ``--state-dir``, ``-v``, ``--url``, ``--token``: taken before the command
    and after it (on every subcommand). Only the top level has defaults: below, an option
    that is not given leaves the value alone, and one that is given wins."""
    group = p.add_argument_group("global options (before or after the command)")
    unset: Any = None if top else argparse.SUPPRESS
    group.add_argument(
        "--db",
        default=unset,
        help="SQLite path or postgresql+psycopg:// URL (env JOBCONTROL_DB, which keeps a "
        f"password out of `ps`; default {default_db_path()})",
    )
    group.add_argument(
        "--state-dir", type=Path, default=unset, help="pid file, daemon log and task logs"
    )
    group.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="log at DEBUG level",
    )
    cli_online.add_global_options(group, default=unset)


def _subparsers(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every parser below ``p``, depth first."""
    found = []
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found += [child, *_subparsers(child)]
    return found


class _Parser(argparse.ArgumentParser):
    """Its subcommands' parsers are of this class too (``add_subparsers``). A wrong
    argument is said in one line, not after the whole usage of the command (``--help``
    shows that); a command left out still shows the usage, which lists them. Exit
    status 2, as argparse's."""

    def error(self, message: str) -> NoReturn:
        if not message.startswith(("argument ", "unrecognized arguments")):
            super().error(message)  # a command missing: its usage lists them
        if message.endswith("expected one argument"):
            # ``--drain-timeout -5s``: argparse takes the value for an option.
            message += " (a value that starts with '-' is given as --OPTION=VALUE)"
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    from jobcontrol import __version__

    p = _Parser(prog="jobcontrol", description="Job Control: job trees on a schedule.")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _global_options(p, top=True)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _commands(sub)
    for child in _subparsers(p):
        _global_options(child, top=False)
    return p


def _commands(sub: Any) -> None:
    db = sub.add_parser("db", help="the database schema").add_subparsers(
        dest="db_command", required=True
    )
    db.add_parser("upgrade", help="create or migrate the schema to the newest revision")
    backup = db.add_parser(
        "backup",
        help="a consistent copy of the SQLite database in a new file, safe while the "
        "daemon runs (PostgreSQL: pg_dump)",
    )
    backup.add_argument("file", type=Path, help="the new file (refused if it exists)")
    copy = db.add_parser(
        "copy",
        help="copy every table (jobs, runs, users, audit...) into an empty database, "
        "ids kept, in one transaction; e.g. from SQLite to PostgreSQL",
    )
    copy.add_argument(
        "--from", dest="copy_from", default=None, metavar="DB", help="the source (default: --db)"
    )
    copy.add_argument(
        "--to",
        dest="copy_to",
        required=True,
        metavar="DB",
        help="the empty target: a new SQLite file, or a PostgreSQL database made by createdb "
        "(a password: $PGPASSWORD or ~/.pgpass, not the command line)",
    )

    load = sub.add_parser(
        "load", help="create or update jobs from a YAML/JSON definition file (one batch)"
    )
    load.add_argument("file", help="definition file, or - for standard input")
    load.add_argument(
        "--replace",
        action="store_true",
        help="also delete jobs of these trees the file no longer has",
    )

    export = sub.add_parser("export", help="write job trees as YAML")
    export.add_argument("job", nargs="?", help="only the sub-tree of this job")
    export.add_argument("-o", "--output", help="file to write (default: standard output)")

    ls = sub.add_parser("ls", help="the job trees with state, last run and next run")
    ls.add_argument("--json", action="store_true", help="a JSON list, one object per job")

    hist = sub.add_parser("history", help="a job's runs, newest first")
    hist.add_argument("job")
    hist.add_argument("--json", action="store_true")
    hist.add_argument("--limit", type=argtypes.count, default=20, help="how many runs (20)")
    hist.add_argument(
        "--before",
        type=argtypes.row_id,
        default=None,
        help="runs older than this run id (next page)",
    )

    workers = sub.add_parser(
        "workers",
        help="the workers: slots in use, heartbeat, the runs each one holds",
        description="Every registered worker, live ones first. HEARTBEAT says how long ago "
        "it beat, '(late)' when it was not heard of within its lease (stopped by SIGSTOP, "
        "cut off, a host down: its runs are settled as their leases run out) and '(process "
        "gone)' when its process on this host is not running though it never said it "
        "stopped. --json gives each one's 'state': online, late, gone or stopped.",
    )
    workers.add_argument("--json", action="store_true", help="a JSON list, one object per worker")

    _access_parsers(sub)
    cli_online.add_parsers(sub)
    cli_lanes.add_parsers(sub)
    cli_worker.add_parsers(sub)

    daemon = sub.add_parser("daemon", help="run, start, stop the dispatcher daemon")
    dsub = daemon.add_subparsers(dest="daemon_command", required=True)
    for name, text in (("run", "in the foreground"), ("start", "detached, logging to a file")):
        d = dsub.add_parser(name, help=f"start the daemon {text}")
        d.add_argument(
            "--slots", type=int, default=None, help="task slots of the daemon's embedded worker (8)"
        )
        d.add_argument(
            "--queues",
            default=None,
            metavar="SPEC",
            help="the embedded worker's slot groups instead of --slots, e.g. 'fast:1 manual,*:4'",
        )
        d.add_argument("--log-root", type=Path, default=None, help="where task logs go")
        d.add_argument(
            "--log-level",
            type=cli_worker.log_level,
            default="INFO",
            help=cli_worker.LOG_LEVEL_HELP,
        )
        d.add_argument(
            "--log-format",
            choices=("text", "json"),  # daemon.LOG_FORMATS (not imported: CLI start-up)
            default="text",
            help="the daemon's log: text lines, or one JSON object per line (time, level, "
            "logger, message, ...) for a log collector (default %(default)s)",
        )
        d.add_argument(
            "--listen", default="127.0.0.1", help="address of the admin API (default %(default)s)"
        )
        d.add_argument(
            "--port",
            type=argtypes.port,
            default=None,
            help="its port (default $JOBCONTROL_PORT or 8640; 0 picks a free one)",
        )
        d.add_argument(
            "--tls-cert",
            type=Path,
            default=None,
            help="serve the API over TLS with this certificate",
        )
        d.add_argument("--tls-key", type=Path, default=None, help="... and this key")
        d.add_argument("--no-api", action="store_true", help="run without the admin API")
        d.add_argument(
            "--api-max-connections",
            type=int,
            default=None,
            metavar="N",
            help="the most connections the admin API holds open (default: what the "
            "open-files limit leaves after a reserve for task runs, at most 1000)",
        )
        d.add_argument(
            "--api-header-timeout",
            type=float,
            default=10.0,
            metavar="SECONDS",
            help="close a connection whose request headers are not in within this "
            "(default %(default)g)",
        )
        d.add_argument(
            "--pass-env",
            action="append",
            default=None,
            metavar="NAME[,NAME|PREFIX*]",
            help="the daemon's environment variables tasks get (repeatable; env "
            f"{taskenv.ENV_VAR}; default {','.join(taskenv.DEFAULT_PASS_ENV)}); "
            "JOBCONTROL_* and NOTIFY_SOCKET never",
        )
        d.add_argument(
            "--log-group",
            default=None,
            metavar="GROUP",
            help="let this group read task logs (0640 in 0750 directories); "
            "default: the daemon's user alone (0600 in 0700)",
        )
        d.add_argument(
            "--disk-low",
            default=diskspace.DEFAULT_LOW,
            metavar="SIZE|PERCENT",
            help="free space below which /healthz and /metrics report the state directory "
            "or log root as low (e.g. 2G, 500M, 10%%; default %(default)s)",
        )
    unit = dsub.add_parser(
        "unit",
        help="print a systemd unit running the daemon of this --db and --state-dir "
        "(default: /var/lib/jobcontrol)",
    )
    cli_unit.add_options(unit, user_default=cli_unit.DEFAULT_USER)
    stop = dsub.add_parser("stop", help="stop the daemon (refused while jobs run unless --kill)")
    stop.add_argument("--kill", action="store_true", help="kill running jobs (they record 255)")
    stop.add_argument("--timeout", type=float, default=60.0)
    status = dsub.add_parser(
        "status", help="is a daemon running on this database, and what is it doing"
    )
    status.add_argument("--json", action="store_true", help="one JSON object, for scripts")

    completion = sub.add_parser(
        "completion",
        help='a shell completion script: eval "$(jobcontrol completion bash)" (see the README)',
    )
    completion.add_argument("shell", choices=["bash", "zsh"])

    demo = sub.add_parser(
        "demo", help="run the sample trees in the foreground on a scratch SQLite database"
    )
    demo.add_argument("--dir", type=Path, default=None, help="keep the database and logs here")
    demo.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    demo.add_argument("--slots", type=int, default=8)


def _access_parsers(sub: Any) -> None:
    user = sub.add_parser("user", help="users of the admin API and their tokens")
    usub = user.add_subparsers(dest="user_command", required=True)
    add = usub.add_parser("add", help="add a user; prints its token once")
    add.add_argument("name")
    add.add_argument("--role", required=True, help="viewer, operator or admin")
    ulist = usub.add_parser("list", help="name, role, created, last seen")
    ulist.add_argument("--json", action="store_true")
    usub.add_parser("remove", help="remove a user (its token stops working)").add_argument("name")
    token = usub.add_parser("token", help="a new token for a user, replacing the old one")
    token.add_argument("name")
    token.add_argument(
        "--write",
        action="store_true",
        help="write it to this database's token file (mode 0600), where the CLI and the "
        "admin client find it, instead of printing it",
    )
    token.add_argument(
        "--overwrite",
        action="store_true",
        help="with --write: replace the file's token even when it is another user's",
    )

    aud = sub.add_parser("audit", help="the audit trail, newest first")
    aud.add_argument("--limit", type=argtypes.count, default=50, help="how many entries (50)")
    aud.add_argument(
        "--before", type=argtypes.row_id, default=None, help="entries older than this id"
    )
    aud.add_argument("--user", default=None, help="only this user's entries")
    aud.add_argument("--job", default=None, help="only entries naming this job")
    aud.add_argument("--json", action="store_true")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command not in ("daemon", "demo", "worker"):
        logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING)
        logging.getLogger("alembic").setLevel(logging.WARNING)
    # $JOBCONTROL_DB is read once and dropped, so nothing this process starts inherits
    # it: not a detached daemon's command line, not a daemon's tasks.
    from_env = os.environ.pop("JOBCONTROL_DB", None)
    given = args.db
    if given is not None and not given.strip():
        # An empty shell variable (`--db "$DB"`) must not fall back to the default database.
        print(
            "jobcontrol: --db is empty: give a SQLite file's path or a database URL",
            file=sys.stderr,
        )
        return 2
    if given is None and from_env is not None and not from_env.strip():
        # The same for the variable (`JOBCONTROL_DB="$(cat worker.url)"` of a file not there).
        print(
            "jobcontrol: $JOBCONTROL_DB is set but empty: give a SQLite file's path or a "
            "database URL, or unset it for the default database",
            file=sys.stderr,
        )
        return 2
    args.db_given = bool(given or from_env)
    args.db = normalise_url(args.db or from_env or default_db_path())
    _warn_public_secrets(args, given)
    try:
        return int(_dispatch(args) or 0)
    except JobControlError as exc:
        print(f"jobcontrol: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`jobcontrol ls --json | head`): no traceback, and
        # nothing more for the interpreter to fail to flush at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _warn_public_secrets(args: argparse.Namespace, given_db: str | None) -> None:
    """A command line is public (``ps``): say so when it carries a secret."""
    if args.token:
        print(f"jobcontrol: {token_option_warning(args.db)}", file=sys.stderr)
    if given_db and _has_password(given_db):
        print(
            "jobcontrol: warning: --db puts the database password on the command line, where "
            "every local user sees it (ps, /proc); set $JOBCONTROL_DB instead",
            file=sys.stderr,
        )


def _has_password(db: str) -> bool:
    from jobcontrol.store import url_password

    return url_password(db) is not None


def _dispatch(args: argparse.Namespace) -> int | None:
    cli_online.refuse_unnamed_jobs(args)
    if args.command == "completion":
        from jobcontrol.cli.completion import script

        sys.stdout.write(script(_parser(), args.shell))
        return 0
    if args.command == "demo":
        from jobcontrol.cli.demo import run_demo

        return run_demo(args.dir, duration=args.duration, slots=args.slots, verbose=args.verbose)
    if args.command == "daemon":
        return _daemon(args)
    if args.command in cli_worker.COMMANDS:
        return cli_worker.run(args)
    if args.command in cli_online.COMMANDS:
        target = find_daemon(args.url, args.db, args.state_dir)
        if target is not None or args.command in cli_online.DAEMON_ONLY:
            return cli_online.run(args, target)
    if args.command == "db" and args.db_command == "copy":
        return _db_copy(args)
    if args.command == "db" and args.db_command == "backup":
        return _db_backup(args)
    # Only `db upgrade` makes a database: a read or an edit of one that is not there
    # is a mistyped --db, refused before anything is created.
    store = open_store(args.db, create=args.command == "db")
    try:
        return _offline(args, store)
    finally:
        store.dispose()


def _slots(slots: int | None, queues: str | None) -> tuple[int, str | None]:
    """The embedded worker's slots and slot groups (``--queues``, in its own words),
    from ``--slots`` or ``--queues``, never both: refused before anything starts."""
    if queues is None:
        if slots is not None and not 0 <= slots <= slotgroups.MAX_SLOTS:
            raise JobControlError(
                f"--slots must be from 0 (workers of their own run the tasks) to "
                f"{slotgroups.MAX_SLOTS}, not {slots}"
            )
        return (8 if slots is None else slots), None
    if slots is not None:
        raise JobControlError(
            "--slots and --queues: give one, not both (--queues sets the slots: the sum of"
            " its groups')"
        )
    groups = slotgroups.parse(queues)  # OptionError naming the part that is wrong
    return sum(g.slots for g in groups), slotgroups.format_groups(groups)


def _task_logs(environ: Mapping[str, str]) -> str:
    """Where the embedded worker puts task output, from ``$JOBCONTROL_TASK_LOGS``."""
    value = environ.get(TASK_LOGS_ENV, "").strip().lower() or "file"
    if value not in LOG_STORES:
        raise OptionError(
            f"${TASK_LOGS_ENV}={value!r}: expected one of {', '.join(LOG_STORES)} "
            "(where the daemon's own worker keeps task output)"
        )
    return value


def _sqlite_file(db: str) -> Path | None:
    """The file of a SQLite URL (None for PostgreSQL or an in-memory database)."""
    from sqlalchemy.engine import make_url

    url = make_url(db)
    database = url.database
    if url.get_backend_name() != "sqlite" or not database or database == ":memory:":
        return None
    return None if database.startswith("file:") else Path(database)


def open_store(db: str, *, create: bool) -> Store:
    """The database of ``--db``, checked to answer, or a one-line refusal saying why not.

    ``create``: a SQLite file that does not exist yet may be made (else it is refused,
    and nothing, not even its directory, is created).
    """
    check_url(db)
    path = _sqlite_file(db)
    if path is not None and not path.exists():
        if not create:
            raise JobControlError(
                f"no database at {path}: check --db (or $JOBCONTROL_DB); "
                "`jobcontrol db upgrade` creates one"
            )
        return Store(db)  # new: nothing there yet to check
    if path is not None and not create and path.is_file() and path.stat().st_size == 0:
        # Opening it would make it a SQLite database (a header, WAL mode): left as it is.
        raise JobControlError(
            f"{path} is an empty file with no Job Control schema yet: "
            "run `jobcontrol db upgrade`"
        )
    store = Store(db)
    try:
        store.current_revision()  # connects: a server that does not answer, a file that is no database
    except SQLAlchemyError as exc:
        store.dispose()
        raise JobControlError(database_problem(db, path, exc)) from None
    return store


def database_problem(db: str, path: Path | None, exc: Exception) -> str:
    """What went wrong opening the database, in one line (drivers' messages have several)."""
    text = driver_message(exc)
    if path is not None:
        if "not a database" in text:
            return f"{path} is not a Job Control database ({text})"
        return f"cannot open the database {path}: {text}"
    return f"cannot reach the database {redact(db)}: {text}"


def _offline(args: argparse.Namespace, store: Store) -> int | None:
    from jobcontrol.service.engine import Engine

    if args.command == "db":
        return _db_upgrade(store)
    _require_schema(store)
    engine = Engine(store)
    if args.command == "load":
        return _load(args, store, engine)
    if args.command == "export":
        from jobcontrol.service.loader import export_definitions

        cli_online.write_export(export_definitions(engine, args.job), args.output)
        return 0
    if args.command == "ls":
        jobs = engine.list_jobs()
        print(json.dumps(jobs, indent=2) if args.json else out.table_jobs(jobs))
        return 0
    if args.command == "workers":
        return _workers(args, store)
    if args.command in cli_lanes.COMMANDS:
        return cli_lanes.run_offline(engine.lanes, args)
    if args.command == "user":
        return _user(args, store)
    if args.command == "audit":
        return _audit(args, store)
    if args.command == "history":
        runs = [
            run_json(r.as_dict())
            for r in engine.history(args.job, limit=args.limit, before_id=args.before)
        ]
        print(json.dumps(runs, indent=2) if args.json else out.table_runs(runs))
        return 0
    raise AssertionError(args.command)


def _db_upgrade(store: Store) -> int:
    """Migrate the schema; refused while a daemon runs on an older one (its code is for
    that one): stop it, upgrade, start the new version (which would upgrade by itself)."""
    from jobcontrol.service.dbcopy import head_revision

    revision, head = store.current_revision(), head_revision()
    lease = None
    if revision is not None and revision != head:
        from jobcontrol.daemon import DatabaseLease

        lease = DatabaseLease(store)
        try:
            lease.acquire(shared=True)  # held while migrating: no daemon starts meanwhile
        except AlreadyRunningError:
            raise JobControlError(
                f"a daemon is running on {redact(store.url)}, whose schema is at revision "
                f"{revision} (this version's is {head}): stop it (jobcontrol daemon stop), "
                "then upgrade; a daemon of this version upgrades the schema when it starts"
            ) from None
    try:
        store.upgrade()
    finally:
        if lease is not None:
            lease.release()
    print(f"schema of {redact(store.url)} is at revision {store.current_revision()}")
    return 0


def _db_backup(args: argparse.Namespace) -> int:
    from jobcontrol.service.dbcopy import backup_sqlite

    store = open_store(args.db, create=False)
    try:
        pages = backup_sqlite(store, args.file.expanduser().absolute())
    finally:
        store.dispose()
    print(f"backed up {redact(args.db)} to {args.file} ({pages} pages, checked)")
    return 0


def _db_copy(args: argparse.Namespace) -> int:
    from jobcontrol.daemon import DatabaseLease
    from jobcontrol.service.dbcopy import check_source, copy_database

    source_url = normalise_url(args.copy_from) if args.copy_from else args.db
    target_url = normalise_url(args.copy_to)
    for option, url in (("--from", args.copy_from), ("--to", args.copy_to)):
        if url and _has_password(url):
            print(
                f"jobcontrol: warning: {option} puts the database password on the command "
                "line, where every local user sees it (ps, /proc); leave it out of the URL "
                "and set $PGPASSWORD or use ~/.pgpass",
                file=sys.stderr,
            )
    if source_url == target_url:
        raise JobControlError(f"--from and --to are the same database ({redact(source_url)})")
    source = open_store(source_url, create=False)
    target: Store | None = None
    leases: list[DatabaseLease] = []
    try:
        # Held shared for the whole copy (as `load` does): no daemon starts on either.
        leases.append(_no_daemon_on(source, _copy_refusal("source")))
        check_source(source)  # before the target is touched at all
        # A SQLite target is only looked at read-only until it is known to be empty
        # (open_store's first connection would already turn a file to WAL mode).
        target = (
            Store(target_url) if _sqlite_file(target_url) else open_store(target_url, create=True)
        )
        leases.append(_no_daemon_on(target, _copy_refusal("target")))
        copied = copy_database(source, target)
    finally:
        for lease in leases:
            lease.release()
        source.dispose()
        if target is not None:
            target.dispose()
    counts = ", ".join(f"{count} {table}" for table, count in copied.items())
    print(f"copied {redact(source_url)} to {redact(target_url)}: {counts}")
    _share_token_file(source_url, target_url)
    return 0


def _no_daemon_on(store: Store, refusal: Callable[[str], str]) -> Any:
    """The database's lease, held shared (offline work may overlap). While a daemon runs
    on it, ``refusal(where)``: ``where`` names the database and, as far as its lock
    says, the daemon (``pid N on HOST``: one of another state directory is found so)."""
    from jobcontrol.daemon import DatabaseLease

    lease = DatabaseLease(store)
    try:
        lease.acquire(shared=True)
    except AlreadyRunningError:
        holder = lease.holder()
        where = redact(store.url) + (f" ({holder})" if holder else "")
        raise JobControlError(refusal(where)) from None
    return lease


def _copy_refusal(role: str) -> Callable[[str], str]:
    return lambda where: (
        f"a daemon is running on the {role} {where}: stop it first "
        "(jobcontrol daemon stop) so the copy is whole (nothing was copied)"
    )


def _share_token_file(source_url: str, target_url: str) -> None:
    """The copy keeps the users' token hashes, so the source's token file (if any) holds
    a token of the target too: give the target its own copy, as the CLI looks for it."""
    config = default_config_dir()
    source_file, target_file = token_file(config, source_url), token_file(config, target_url)
    if not source_file.exists() or target_file.exists():
        return
    from jobcontrol.filemodes import write_private

    write_private(target_file, source_file.read_text())
    print(f"the token in {source_file} works on the copy too: copied to {target_file}")


def _refuse_unprepared(db: str) -> None:
    from jobcontrol.daemon import refuse_unprepared_file

    store = Store(db)  # connects to nothing until asked
    try:
        refuse_unprepared_file(store)
    finally:
        store.dispose()


def _require_schema(store: Store) -> None:
    from jobcontrol.service.dbcopy import head_revision

    revision = store.current_revision()
    if revision is None:
        raise JobControlError(
            f"{redact(store.url)} has no Job Control schema yet: run `jobcontrol db upgrade`"
        )
    head = head_revision()
    if revision != head:
        # Read with this version's columns, an older schema fails on the first one it
        # lacks ("no such column: job.retries"): said as what it is.
        raise JobControlError(
            f"{redact(store.url)} is at schema revision {revision}, and this version of "
            f"Job Control reads {head}: run `jobcontrol db upgrade` (a daemon's start does "
            "it too), or use the version that made it"
        )


def _workers(args: argparse.Namespace, store: Store) -> int:
    from jobcontrol.service.engine import Engine

    workers = [jsonable(w) for w in Engine(store).workers()]  # as the API gives them
    print(json.dumps(workers, indent=2) if args.json else out.table_workers(workers))
    return 0


def _user(args: argparse.Namespace, store: Store) -> int:
    from jobcontrol.service import users

    by = f"local:{getpass.getuser()}"
    cmd = args.user_command
    if cmd == "list":
        found = users.list_users(store)
        if args.json:
            print(json.dumps([u.as_dict() for u in found], indent=2))
        else:
            rows = [
                [u.name, str(u.role), out.when(u.created), out.when(u.last_seen)] for u in found
            ]
            print(out.table(["NAME", "ROLE", "CREATED", "LAST SEEN"], rows) if rows else "no users")
        return 0
    if cmd == "remove":
        users.remove_user(store, args.name, by=by)
        print(f"removed user {args.name!r}")
        return 0
    if cmd == "add":
        user, token = users.add_user(store, args.name, args.role, by=by)
        print(f"added user {user.name!r} with role {user.role}; token:")
    elif args.write:
        path = token_file(default_config_dir(), store.url)
        if not args.overwrite:
            _refuse_taking_the_token_file(store, path, args.name)
        users.new_token(store, args.name, by=by, write_to=path)
        print(f"new token for user {args.name!r} written to {path} (the old one no longer works)")
        return 0
    else:
        token = users.new_token(store, args.name, by=by)
        print(f"new token for user {args.name!r} (the old one no longer works):")
    print(token)
    print("This token will not be shown again: keep it now.")
    return 0


def _refuse_taking_the_token_file(store: Store, path: Path, name: str) -> None:
    """``user token NAME --write`` would put NAME's token where another user's working
    token is (the admin's, first of all): that token would still work, held by nobody."""
    from jobcontrol.service import users

    try:
        held = path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return  # no file yet, or none that holds a token: nothing to lose
    holder = users.known_tokens(store).get(users.hash_token(held)) if held else None
    if holder is None or holder.name == name:
        return
    try:
        users.get_user(store, name)
    except UnknownUserError:
        return  # refused as such by new_token, which audits it
    raise JobControlError(
        f"the token file {path} holds the token of user {holder.name!r} ({holder.role}): "
        f"writing {name!r}'s there would leave that token working but held by nobody; "
        "drop --write to be shown the new token, or give --overwrite to replace the file's"
    )


def _audit(args: argparse.Namespace, store: Store) -> int:
    from jobcontrol.service import audit

    entries = audit.list_entries(
        store, limit=args.limit, before_id=args.before, user=args.user, job=args.job
    )
    shown = [e.as_dict() for e in entries]
    print(json.dumps(shown, indent=2) if args.json else out.table_audit(shown))
    return 0


def _load(args: argparse.Namespace, store: Store, engine: Any) -> int:
    from jobcontrol.service.loader import load_definitions

    text, source = cli_online.read_source(args.file)
    # Hold the lease for the whole load: a daemon starting meanwhile would build its
    # tree before the batch commits and never see the jobs.
    lease = _no_daemon_on(
        store,
        lambda where: (
            f"a daemon is running on {where}: load through its admin API (give its "
            "--state-dir, or --url), or stop it first (jobcontrol daemon stop), then load"
        ),
    )
    try:
        result = load_definitions(
            engine, text, source, user=f"local:{getpass.getuser()}", replace=args.replace
        )
    finally:
        lease.release()
    print(
        f"loaded {source}: {len(result.created)} created, {len(result.modified)} changed, {result.deleted_jobs} deleted"
    )
    return 0


def _containment(workers: list[dict[str, Any]], pid: int) -> str:
    """How the running daemon (``pid``) contains task runs, as its embedded worker said."""
    import socket

    mine = [w for w in workers if w["name"] == embedded_worker_name(socket.gethostname(), pid)]
    live = [w for w in mine if w["stopped"] is None]
    if not live:
        return "none: this daemon runs no tasks (--slots 0)" if not mine else "unknown"
    return str(live[0].get("containment") or "unknown")


def _status_elsewhere(args: argparse.Namespace, opts: Any, holder: str) -> int:
    """A daemon holds the database, but this state directory has no pid file of it: it
    runs (exit 0, ``running: true``), and what only its state directory holds (its log,
    its API's URL) cannot be told from here."""
    import re

    held = re.fullmatch(r"pid (\d+) on (.+)", holder)
    said = (
        f"daemon running: {holder}, database {redact(args.db)}, but not from state directory "
        f"{opts.state_dir} (no pid file of it there): give its --state-dir for its log, admin "
        "API and runs"
    )
    if args.json:
        reply = {
            "running": True,
            "pid": int(held[1]) if held else None,
            "host": held[2] if held else None,
            "database": redact(args.db),
            "state_dir_differs": True,
            "message": said,
        }
        print(json.dumps(reply, indent=2))
    else:
        print(said)
    return 0


def _daemon(args: argparse.Namespace) -> int:
    from jobcontrol.daemon import (
        Daemon,
        DaemonOptions,
        configure_logging,
        lease_holder,
        start_detached,
        stop_daemon,
    )

    cmd = args.daemon_command
    if cmd == "unit":
        from jobcontrol.cli.unit import service_unit

        state = args.state_dir.resolve() if args.state_dir else None
        unit = service_unit(
            args.db if args.db_given else None, state, user=args.user, command=args.unit_command
        )
        sys.stdout.write(unit.text)
        for note in unit.notes:
            print(f"jobcontrol: {note}", file=sys.stderr)
        return 0
    opts = DaemonOptions(db_url=args.db, state_dir=args.state_dir or state_dir_default())
    if cmd in ("run", "start"):
        opts.slots, opts.queues = _slots(args.slots, args.queues)
        if opts.slots == 0 and args.db.startswith("sqlite"):
            raise JobControlError(
                "--slots 0 on SQLite: nothing would run the tasks (workers of their own "
                "need a PostgreSQL database); give the daemon slots"
            )
        opts.log_root, opts.log_level = args.log_root, args.log_level
        opts.api, opts.host = not args.no_api, args.listen
        opts.tls_cert, opts.tls_key = args.tls_cert, args.tls_key
        if args.api_max_connections is not None and args.api_max_connections < 1:
            raise JobControlError(
                f"--api-max-connections must be at least 1, not {args.api_max_connections}"
            )
        if not 0 < args.api_header_timeout < float("inf"):
            raise JobControlError(
                "--api-header-timeout must be a positive number of seconds, "
                f"not {args.api_header_timeout:g}"
            )
        opts.api_max_connections = args.api_max_connections
        opts.api_header_timeout = args.api_header_timeout
        if args.port is not None:
            opts.port = args.port
        opts.pass_env = taskenv.resolve(args.pass_env, os.environ)
        opts.log_access = LogAccess.for_group(args.log_group)
        opts.cgroups = cgroups.resolve_mode(os.environ)
        opts.cpu_pin = cpupin.resolve_mode(os.environ)
        opts.task_log_store = _task_logs(os.environ)
        opts.disk_low = diskspace.LowMark.parse(args.disk_low)
        # Refused in one line here, before the daemon (or its detached child) touches
        # anything: a port asked for that is taken, a server that does not answer, a
        # file that is no database. (A SQLite file not there yet is the daemon's to make.)
        # A daemon holding the database (its state directory maybe another): refused
        # before a state directory or log is made for one that cannot start.
        # (A daemon of this state directory: refused below, as it always was.)
        holder = None if live_pid(opts.pid_file) else lease_holder(args.db)
        if holder is not None:
            raise JobControlError(
                f"the daemon did not start: another Job Control daemon is running on "
                f"{redact(args.db)} ({holder}); its state directory is not {opts.state_dir} "
                "(nothing was created)"
            )
        if opts.api:
            opts.api_port()
            opts.check_tls()
        sqlite_file = _sqlite_file(args.db)
        if sqlite_file is None or sqlite_file.exists():
            _refuse_unprepared(args.db)  # read-only: a file without the schema stays as it is
            open_store(args.db, create=False).dispose()
    if cmd == "run":
        configure_logging("DEBUG" if args.verbose else opts.log_level, fmt=args.log_format)
        daemon = Daemon(opts)
        daemon.run_forever()
        return 1 if daemon.lease_lost else 0  # stopped for another daemon: a failure
    if cmd == "start":
        # No --db: the URL (and its password) goes to the daemon in its environment.
        argv = ["--state-dir", str(opts.state_dir), "daemon", "run"]
        argv += ["--queues", opts.queues] if opts.queues else ["--slots", str(opts.slots)]
        argv += ["--log-level", opts.log_level, "--log-format", args.log_format] + (
            ["--log-root", str(opts.log_root)] if opts.log_root else []
        )
        argv += ["--listen", opts.host]
        # None asked for: the daemon picks the default port, or a free one if it is taken.
        argv += ["--port", str(opts.port)] if opts.port is not None else []
        argv += ["--no-api"] if args.no_api else []
        argv += ["--api-header-timeout", f"{opts.api_header_timeout:g}"]
        if opts.api_max_connections is not None:
            argv += ["--api-max-connections", str(opts.api_max_connections)]
        if opts.tls_cert and opts.tls_key:
            argv += ["--tls-cert", str(opts.tls_cert), "--tls-key", str(opts.tls_key)]
        argv += ["--pass-env", opts.pass_env.text]
        argv += ["--log-group", opts.log_access.group] if opts.log_access.group else []
        argv += ["--disk-low", opts.disk_low.text]
        for warning in opts.file_warnings():
            print(f"jobcontrol: warning: {warning}", file=sys.stderr)
        pid = start_detached(opts, argv)
        print(f"daemon started: pid {pid}, log {opts.log_file}")
        if opts.api and opts.url_file.exists():
            print(f"admin API: {opts.url_file.read_text().strip()}/api/v1")
        return 0
    if cmd == "stop":
        pid, left = stop_daemon(
            opts, kill_jobs=args.kill, timeout=args.timeout, by=f"local:{getpass.getuser()}"
        )
        print(f"daemon stopped (pid {pid})")
        if left:
            print(
                f"left in flight, for the next start or their workers: {', '.join(left)} "
                "(waiting in the queue, or running on a worker of its own)"
            )
        return 0
    return _daemon_status(args, opts)


def _say_stopped(pid: int, frozen: bool) -> None:
    if frozen:
        print(
            "daemon STOPPED by a signal (SIGSTOP, or a debugger): it runs nothing and its "
            f"admin API does not answer until continued (`kill -CONT {pid}`)"
        )


def _daemon_status(args: argparse.Namespace, opts: Any) -> int:
    from jobcontrol.daemon import lease_holder

    live = live_pid(opts.pid_file)
    unknown = None  # why the database cannot say whether a daemon elsewhere holds it
    if live is None:
        try:
            holder = lease_holder(args.db, strict=True)
        except Exception as exc:  # a database that does not answer: no daemon here, but
            holder, unknown = None, driver_message(exc)  # one elsewhere may hold it
        if holder is not None:
            return _status_elsewhere(args, opts, holder)
    if live is None:
        if args.json:
            reply: dict[str, Any] = {"running": False, "database": redact(args.db)}
            if unknown is not None:
                reply["database_problem"] = unknown
            print(json.dumps(reply, indent=2))
        elif unknown is not None:
            print(
                f"no daemon of state directory {opts.state_dir} is running; whether another "
                f"holds {redact(args.db)} is not known: cannot reach the database: {unknown}"
            )
        else:
            print(f"no daemon is running for {redact(args.db)}")
        return 3  # LSB: program is not running
    url = opts.url_file.read_text().strip() if opts.url_file.exists() else None
    # Alive but frozen (kill -STOP, a debugger): every request to it hangs, so say why.
    frozen = procs.pid_stopped(live)
    try:
        store = open_store(args.db, create=False)
    except JobControlError as exc:
        # The daemon runs (its pid file says so) whether or not the database answers:
        # said with the reason, and the exit status says it runs.
        if args.json:
            reply = {"running": True, "pid": live, "stopped": frozen, "database": redact(args.db)}
            reply |= {"log": str(opts.log_file), "api": f"{url}/api/v1" if url else None}
            print(json.dumps({**reply, "database_problem": str(exc)}, indent=2))
        else:
            print(f"daemon running: pid {live}, database {redact(args.db)}, log {opts.log_file}")
            _say_stopped(live, frozen)
            print(f"admin API: {url}/api/v1" if url else "admin API: off")
            print(f"database: UNAVAILABLE: {exc} (the daemon retries until it answers)")
        return 0
    try:
        from jobcontrol.service.engine import Engine

        engine = Engine(store)
        active, armed = engine.daemon_view()
        paused = engine.timers_paused_since()
        workers = engine.workers()
        stopped = engine.lanes.stopped()
    finally:
        store.dispose()
    if args.json:
        status = {
            "running": True,
            "pid": live,
            "stopped": frozen,
            "database": redact(args.db),
            "log": str(opts.log_file),
            "api": f"{url}/api/v1" if url else None,
            "runs_in_flight": [run_json(run.as_dict()) for run in active],
            "trees_scheduled": armed,
            "timers_paused_since": paused,
            "containment": _containment(workers, live),
            "stopped_lanes": [{**s, "stopped_at": str(s["stopped_at"])} for s in stopped],
        }
        print(json.dumps(status, indent=2))
        return 0
    print(f"daemon running: pid {live}, database {redact(args.db)}, log {opts.log_file}")
    _say_stopped(live, frozen)
    print(f"admin API: {url}/api/v1" if url else "admin API: off")
    print(f"task containment: {_containment(workers, live)}")
    print(f"runs in flight: {len(active)}; trees scheduled: {len(armed)}")
    if paused is not None:
        print(f"timers: PAUSED since {out.when(paused)}: nothing fires until `jobcontrol resume`")
    for run in active:
        print(
            f"  run {run.id} {run.job_name} ({run.kind}, {run.state}) since {out.when(run.started)}"
        )
    for s in stopped:
        print(f"lane {s['name']} STOPPED: {s['reason']}")
    return 0

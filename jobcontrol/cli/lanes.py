"""``jobcontrol lanes``, ``lane add|set|drain|resume|remove``, ``queue``, ``reprioritize``.

Through the daemon's API when one runs (like the other online commands), else on
the database directly, as ``workers`` does (a change is then audited as
``local:<login>``). Settings are ``key=value`` text (``max_slots=3``,
``max_slots=none``, ``poll=2s``, ``stale=30m``, ``enabled=false``); the lane
service reads and checks them, so a refusal reads the same either way.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from jobcontrol.cli import argtypes
from jobcontrol.cli import output as out
from jobcontrol.errors import JobControlError

if TYPE_CHECKING:
    from jobcontrol.client import Client
    from jobcontrol.service.lanes import LaneService

COMMANDS = frozenset({"lanes", "lane", "queue", "reprioritize"})


def add_parsers(sub: Any) -> None:
    lanes = sub.add_parser(
        "lanes", help="the lanes: state, cap, running, queued, oldest wait, poll, stale"
    )
    lanes.add_argument("--json", action="store_true", help="a JSON list, one object per lane")
    lane = sub.add_parser("lane", help="add, change, drain, resume or remove a lane")
    lsub = lane.add_subparsers(dest="lane_command", required=True)
    for name, text in (
        ("add", "add a lane (admin): NAME [max_slots=N poll=2s stale=30s enabled=true]"),
        ("set", "change a lane (admin): max_slots=3|none poll=2s stale=30m enabled=false"),
    ):
        p = lsub.add_parser(name, help=text)
        p.add_argument("name")
        p.add_argument("settings", nargs="*" if name == "add" else "+", metavar="key=value")
        p.add_argument("--json", action="store_true")
    for name, text in (
        ("drain", "no new claims in the lane; its running runs finish (operator)"),
        ("resume", "the lane claims again, also after STOPPED (operator)"),
        ("remove", "remove a lane with no queued or running runs (admin)"),
    ):
        p = lsub.add_parser(name, help=text)
        p.add_argument("name")
        p.add_argument("--json", action="store_true")
    queue = sub.add_parser("queue", help="queued task runs per lane, in claim order, with waits")
    queue.add_argument("--lane", default=None, help="only this lane")
    queue.add_argument("--json", action="store_true")
    rep = sub.add_parser("reprioritize", help="change a queued run's priority (operator)")
    rep.add_argument("run", type=argtypes.row_id, help="the run's id")
    rep.add_argument("priority", type=int, help="higher runs first")
    rep.add_argument("--json", action="store_true")


def parse_settings(lane: str, pairs: Sequence[str]) -> dict[str, str]:
    settings: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise JobControlError(f"lane {lane!r}: {pair!r} is not key=value (e.g. max_slots=3)")
        if key.strip() in settings:
            # Not the last one silently: which the user meant is not known.
            raise JobControlError(f"lane {lane!r}: {key.strip()} given twice")
        settings[key.strip()] = value
    return settings


# ---------------------------------------------------------------- online


def run_online(client: Client, args: argparse.Namespace) -> int:
    cmd = args.command
    if cmd == "lanes":
        return _emit(args, client.lanes(), table_lanes)
    if cmd == "queue":
        return _emit(args, client.queue(args.lane), table_queue)
    if cmd == "reprioritize":
        result = client.reprioritize(args.run, args.priority)
        return _emit(args, result, _reprioritized)
    sub, name = args.lane_command, args.name
    if sub == "add":
        lane = client.add_lane(name, **parse_settings(name, args.settings))
    elif sub == "set":
        lane = client.set_lane(name, **parse_settings(name, args.settings))
    elif sub == "drain":
        lane = client.drain_lane(name)
    elif sub == "resume":
        lane = client.resume_lane(name)
    else:
        client.remove_lane(name)
        return _emit(args, {"removed": name}, lambda _: f"removed lane {name}")
    return _emit(args, lane, lambda x: f"{_done(sub)} lane {name}\n" + table_lanes([x]))


# ---------------------------------------------------------------- on the database


def run_offline(service: LaneService, args: argparse.Namespace) -> int:
    from jobcontrol.views import jsonable

    cmd, by = args.command, f"local:{getpass.getuser()}"
    if cmd == "lanes":
        return _emit(args, jsonable(service.list_lanes()), table_lanes)
    if cmd == "queue":
        return _emit(args, jsonable(service.queue(args.lane)), table_queue)
    if cmd == "reprioritize":
        result = service.reprioritize(args.run, args.priority, user=by)
        return _emit(args, result, _reprioritized)
    sub, name = args.lane_command, args.name
    if sub == "add":
        lane = service.add_lane(name, parse_settings(name, args.settings), user=by)
    elif sub == "set":
        lane = service.set_lane(name, parse_settings(name, args.settings), user=by)
    elif sub == "drain":
        lane = service.drain(name, user=by)
    elif sub == "resume":
        lane = service.resume(name, user=by)
    else:
        service.remove_lane(name, user=by)
        return _emit(args, {"removed": name}, lambda _: f"removed lane {name}")
    shown = jsonable(lane)
    return _emit(args, shown, lambda x: f"{_done(sub)} lane {name}\n" + table_lanes([x]))


# ---------------------------------------------------------------- output


def _emit(args: argparse.Namespace, data: Any, human: Any) -> int:
    text = json.dumps(data, indent=2) if getattr(args, "json", False) else human(data)
    sys.stdout.write(text + "\n")  # the CLI's output layer (no print outside it)
    return 0


def _done(sub: str) -> str:
    return {"add": "added", "set": "changed", "drain": "drained", "resume": "resumed"}[sub]


def _reprioritized(result: Mapping[str, Any]) -> str:
    return f"run {result['run_id']} ({result['job']}) now has priority {result['priority']}"


def _seconds(value: Any) -> str:
    from jobcontrol.definitions.durations import format_duration

    return format_duration(float(value)) if value else "-"


def _state(lane: Mapping[str, Any]) -> str:
    """A drained lane is ``draining`` while runs of it still finish, then ``drained`` (as
    the admin client says it); ``--json`` keeps the lane's ``state`` as stored."""
    if lane["state"] == "draining" and not lane.get("running"):
        return "drained"
    return str(lane["state"])


def table_lanes(lanes: Sequence[Mapping[str, Any]]) -> str:
    headers = ["LANE", "STATE", "MAX", "RUNNING", "QUEUED", "OLDEST WAIT", "POLL", "STALE"]
    rows = [
        [
            x["name"],
            _state(x),
            "-" if x["max_slots"] is None else str(x["max_slots"]),
            str(x.get("running", 0)),
            str(x.get("queued", 0)),
            _seconds(round(x["oldest_wait_s"])) if x.get("oldest_wait_s") else "-",
            _seconds(x["poll_interval_s"]),
            _seconds(x["stale_timeout_s"]),
        ]
        for x in lanes
    ]
    if not rows:
        return "no lanes"
    # A stopped lane's reason is a sentence: on a line of its own under the table, not
    # in the STATE column, where it would widen every row.
    # (Worded as `status` and `daemon status` say it.)
    why = [
        f"lane {x['name']} STOPPED: {x['stopped_reason']}" for x in lanes if x.get("stopped_reason")
    ]
    return "\n".join([out.table(headers, rows), *why])


def table_queue(lanes: Sequence[Mapping[str, Any]]) -> str:
    headers = ["LANE", "POS", "RUN", "JOB", "QUEUE", "PRIORITY", "WAITING"]
    rows = [
        [
            x["lane"],
            str(r["position"]),
            str(r["run_id"]),
            r["job"],
            r["queue"],
            str(r["priority"]),
            _seconds(round(r["wait_s"])) if r["wait_s"] >= 1 else "<1s",
        ]
        for x in lanes
        for r in x["runs"]
    ]
    return out.table(headers, rows) if rows else "nothing queued"

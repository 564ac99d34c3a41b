"""Definition files: parsing, refusals with lines, dumping and the round trip."""

from __future__ import annotations

import json
import re
import textwrap
import unicodedata
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobcontrol.definitions.commands import check_command
from jobcontrol.definitions.parse import (
    DEFINITION_FIELDS,
    JobDef,
    dump_definitions,
    field_defaults,
    format_duration,
    iter_defs,
    parse_definitions,
    parse_duration,
)
from jobcontrol.errors import CommandError, DefinitionError, JobError
from jobcontrol.model import MAX_LOG_FILES, MAX_PRIORITY, BoxType, JobRecord, Kind, Misfire, OnError

DESIGN_EXAMPLE = """\
jobs:
  - name: Periodic
    timer: every 10s
    active: true
    on_error: continue          # continue | abort   (default continue)
    children:
      - name: Box
        active: true
        on_error: abort
        box_type: sequence      # sequence | timed   (default sequence)
        children:
          - name: gcc error
            active: true
            command: gcc fred.c
          - name: no-op ok
            active: true
            command: "true"
"""

VALID_TIMERS = ["every 10s", "every 5m", "daily 22:56", "cron */5 * * * *"]


def by_name(roots: list[JobDef]) -> dict[str, tuple[JobDef, JobDef | None]]:
    return {job.name: (job, parent) for job, parent in iter_defs(roots)}


def refusal(text: str) -> DefinitionError:
    with pytest.raises(DefinitionError) as info:
        parse_definitions(textwrap.dedent(text), "jobs.yaml")
    return info.value


# --- the DESIGN example -----------------------------------------------------------------


def test_design_example_parses_into_the_tree() -> None:
    roots = parse_definitions(DESIGN_EXAMPLE, "design.yaml")

    assert [(job.name, parent and parent.name) for job, parent in iter_defs(roots)] == [
        ("Periodic", None),
        ("Box", "Periodic"),
        ("gcc error", "Box"),
        ("no-op ok", "Box"),
    ]
    jobs = by_name(roots)
    periodic, box = jobs["Periodic"][0], jobs["Box"][0]
    gcc, noop = jobs["gcc error"][0], jobs["no-op ok"][0]
    assert (periodic.kind, box.kind, gcc.kind, noop.kind) == (
        Kind.BOX,
        Kind.BOX,
        Kind.TASK,
        Kind.TASK,
    )
    assert (periodic.line, box.line, gcc.line, noop.line) == (2, 7, 12, 15)
    assert periodic.fields == {
        "job_order": 0,
        "active": True,
        "timer": "every 10s",
        "on_error": OnError.CONTINUE,
    }
    assert box.fields == {
        "job_order": 0,
        "active": True,
        "on_error": OnError.ABORT,
        "box_type": BoxType.SEQUENCE,
    }
    assert gcc.fields == {"job_order": 0, "active": True, "command": "gcc fred.c"}
    # Quoted "true" stays the command text, not a boolean.
    assert noop.fields == {"job_order": 1, "active": True, "command": "true"}


def test_a_job_is_inactive_unless_the_file_says_active_true() -> None:
    roots = parse_definitions("jobs:\n  - name: quiet\n    command: ls\n")
    assert roots[0].fields["active"] is False


def test_a_job_with_neither_command_nor_children_is_an_empty_box() -> None:
    roots = parse_definitions("jobs:\n  - name: empty\n  - name: also\n    children: []\n")
    assert [(job.kind, job.children) for job in roots] == [(Kind.BOX, []), (Kind.BOX, [])]
    assert [job.fields["job_order"] for job in roots] == [0, 1]


def test_every_optional_field_is_normalised() -> None:
    text = """\
        jobs:
          - name: nightly
            description: the big one
            timer: daily 22:56
            queue: fast_lane
            priority: -3
            timeout: 1h30m
            max_log_files: 7
            retries: 3
            misfire: skip
            on_error: abort
            box_type: timed
            cwd: /srv/work
            env:
              LANG: C.UTF-8
              N: "3"
            children: []
        """
    [job] = parse_definitions(textwrap.dedent(text))
    assert job.fields == {
        "job_order": 0,
        "active": False,
        "description": "the big one",
        "timer": "daily 22:56",
        "queue": "fast_lane",
        "priority": -3,
        "timeout_s": 5400.0,
        "max_log_files": 7,
        "retries": 3,
        "misfire": Misfire.SKIP,
        "on_error": OnError.ABORT,
        "box_type": BoxType.TIMED,
        "cwd": "/srv/work",
        "env": {"LANG": "C.UTF-8", "N": "3"},
    }
    assert set(job.fields) - {"job_order"} <= set(DEFINITION_FIELDS)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("2.5s", 2.5),
        ("1d", 86400.0),
        ("1h 5s", 3605.0),
        ("45", 45.0),
        (12, 12.0),
        (0.25, 0.25),
    ],
)
def test_durations(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["0s", "-3", "5 mins", "30m1h", "5m5m", "", "inf", "1e999s"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize("seconds", [90.0, 5400.0, 3601.0, 2.5, 1e-05, 0.1, 86400.0, 1e20])
def test_format_duration_reads_back_exactly(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


def test_format_duration_is_readable() -> None:
    assert [format_duration(s) for s in (90.0, 5400.0, 30.0, 2.5)] == [
        "1m30s",
        "1h30m",
        "30s",
        "2.5s",
    ]


# --- refusals ------------------------------------------------------------------------------

REFUSALS = [
    ("jobs:\n  - name: a\n    command: x\n    retries: -1\n", 4, ["job 'a'", "'retries'"]),
    ("jobs:\n  - name: a\n    command: x\n    retries: two\n", 4, ["job 'a'", "retries"]),
    ("jobs:\n  - name: a\n    command: x\n    retries: 1.5\n", 4, ["job 'a'", "retries"]),
    pytest.param(
        "jobs:\n  - name: a\n    command: [unclosed\n  - name: b\n",
        4,
        ["invalid YAML"],
        id="yaml-syntax",
    ),
    pytest.param("", 1, ["empty file", "'jobs'"], id="empty-file"),
    pytest.param("- name: a\n", 1, ["mapping with a 'jobs' list"], id="top-level-list"),
    pytest.param("job:\n  - name: a\n", 1, ["'job'", "did you mean 'jobs'"], id="top-level-key"),
    pytest.param("jobs:\n  name: a\n", 2, ["'jobs' must be a list"], id="jobs-not-list"),
    pytest.param("jobs:\n  - just a string\n", 2, ["a job must be a mapping"], id="job-not-map"),
    pytest.param(
        "jobs:\n  - name: a\n    comand: ls\n",
        3,
        ["job 'a'", "unknown key 'comand'", "did you mean 'command'", "allowed: name,", "env"],
        id="unknown-key",
    ),
    pytest.param("jobs:\n  - command: ls\n", 2, ["needs a 'name'"], id="no-name"),
    pytest.param("jobs:\n  - name: 42\n", 2, ["'name' must be a string", "quotes"], id="name-int"),
    pytest.param("jobs:\n  - name: ' a'\n", 2, ["' a'", "spaces"], id="name-space"),
    pytest.param('jobs:\n  - name: "a\\tb"\n', 2, ["'a\\tb'", "control"], id="name-control-char"),
    pytest.param(f"jobs:\n  - name: {'x' * 129}\n", 2, ["128 characters"], id="name-too-long"),
    pytest.param(
        "jobs:\n  - name: a\n    active: sometimes\n",
        3,
        ["job 'a'", "'active' must be true or false", "'sometimes'"],
        id="active-type",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    priority: high\n",
        3,
        ["job 'a'", "'priority' must be an integer"],
        id="priority-type",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    priority: 3000000000\n",
        3,
        ["job 'a'", "'priority' must be between -1000000 and 1000000"],
        id="priority-range",
    ),
    pytest.param(
        # The same bounds as an edit's (``set``, the API): the file says them first.
        "jobs:\n  - name: a\n    priority: 1000001\n",
        3,
        ["job 'a'", "'priority' must be between -1000000 and 1000000, got 1000001"],
        id="priority-past-an-edits-bound",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    description: 12\n",
        3,
        ["job 'a'", "'description' must be a string", "quotes"],
        id="description-type",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    env: [A=1]\n",
        3,
        ["job 'a'", "'env' must be a mapping"],
        id="env-type",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    env:\n      OK: x\n      1BAD: y\n",
        5,
        ["job 'a'", "environment variable name '1BAD'"],
        id="env-name",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    env:\n      PORT: 8080\n",
        4,
        ["job 'a'", "must be a string", "8080"],
        id="env-value-type",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    queue: two words\n",
        3,
        ["job 'a'", "'queue'"],
        id="queue-space",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    children:\n",
        3,
        ["job 'a'", "'children' must be a list", "null"],
        id="children-null",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    on_error: stop\n",
        3,
        ["job 'a'", "'on_error' must be one of continue, abort", "'stop'"],
        id="on-error-enum",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    box_type: parallel\n",
        3,
        ["job 'a'", "'box_type' must be one of sequence, timed", "'parallel'"],
        id="box-type-enum",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    misfire: never\n",
        3,
        ["job 'a'", "'misfire' must be one of run-once, skip"],
        id="misfire-enum",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    command: ls\n    children: []\n",
        2,
        ["job 'a'", "not both"],
        id="command-and-children",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    command: ls\n    box_type: timed\n",
        4,
        ["job 'a'", "'box_type' is for boxes"],
        id="box-type-on-task",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    children:\n      - name: b\n        command: ls\n  - name: b\n",
        6,
        ["job 'b'", "duplicate job name", "first at line 4"],
        id="duplicate-name",
    ),
    pytest.param(
        "jobs: [{name: a}, {name: a}]\n", 1, ["job 'a'", "duplicate"], id="duplicate-one-line"
    ),
    pytest.param(
        "jobs:\n  - name: a\n    active: true\n    active: false\n",
        4,
        ["job 'a'", "'active' given twice", "first at line 3"],
        id="duplicate-key",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    command: ls\n    cwd: build/out\n",
        4,
        ["job 'a'", "'cwd' must be an absolute path"],
        id="relative-cwd",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    command: ls\n    env:\n      JOBCONTROL_RUN_ID: '7'\n",
        5,
        ["job 'a'", "'JOBCONTROL_RUN_ID' is Job Control's own"],
        id="reserved-env",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    children:\n      - name: b\n        parent: a\n        command: ls\n",
        5,
        ["job 'b'", "'parent' is for a job at the top of the file"],
        id="parent-nested",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    parent: b\n    children: []\n"
        "  - name: b\n    parent: a\n    children: []\n",
        2,
        ["job 'a'", "'parent' makes a cycle in this file ('a' under 'b' -> 'b' under 'a')"],
        id="parent-cycle",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    parent: inner\n    children:\n      - name: inner\n"
        "        children: []\n",
        2,
        ["job 'a'", "'parent' makes a cycle in this file ('a' under 'inner')"],
        id="parent-inside-itself",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    timer: evry 10s\n",
        3,
        ["job 'a'", "invalid schedule 'evry 10s' at position 0: "],
        id="bad-timer",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    timer: 10\n",
        3,
        ["job 'a'", "'timer' must be a string"],
        id="timer-type",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    command: if then fi\n",
        3,
        ["job 'a'", "invalid command", '"then" unexpected'],
        id="bad-command",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    command: '   '\n",
        3,
        ["job 'a'", "invalid command", "empty"],
        id="blank-command",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    command: true\n",
        3,
        ["job 'a'", "'command' must be a string", "quotes"],
        id="command-bool",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    timeout: 5 mins\n",
        3,
        ["job 'a'", "invalid 'timeout'", "'5 mins'"],
        id="bad-duration",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    timeout: 0\n",
        3,
        ["job 'a'", "invalid 'timeout'", "positive"],
        id="zero-duration",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    timeout: yes\n",
        3,
        ["job 'a'", "'timeout' must be a duration"],
        id="bool-duration",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    max_log_files: 0\n",
        3,
        ["job 'a'", "'max_log_files' must be between 1 and 100000"],
        id="max-log-files",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    max_log_files: 200000\n",
        3,
        ["job 'a'", "'max_log_files' must be between 1 and 100000, got 200000"],
        id="max-log-files-past-an-edits-bound",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    children:\n      - name: nightly/db\n        command: ls\n",
        4,
        ["invalid job name 'nightly/db'", "must not contain '/'"],
        id="slash-in-name",
    ),
    pytest.param(
        "jobs:\n  - name: " + "n" * 100_000 + "\n",
        2,
        ["invalid job name 'nnn", "(99802 more characters)"],
        id="huge-name-clipped",
    ),
    # Whatever the field, a value repeated in a refusal is cut (an API request's too).
    pytest.param(
        "jobs:\n  - name: a\n    text: " + "t" * 90_000 + "\n",
        3,
        ["unknown key 'text'", "allowed: name"],
        id="unknown-field-not-echoed",
    ),
    pytest.param(
        "a" * 90_000 + "\n",
        1,
        ["'aaa", "(89802 more characters)"],
        id="huge-document-clipped",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    command: 'true'\n    retries: " + "r" * 90_000 + "\n",
        4,
        ["'retries' must be", "'rrr", "(89802 more characters)"],
        id="huge-wrong-value-clipped",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    command: 'true'\n    timeout: " + "9" * 300 + "x\n",
        4,
        ["cannot read '999", "(103 more characters) as a duration"],
        id="huge-duration-clipped",
    ),
    # A file and a request are the same call: the API's limits hold for a file too.
    pytest.param(
        "jobs:\n  - name: a\n    command: echo " + "y" * 131_000 + "\n",
        3,
        ["job 'a'", "command is 131005 bytes; at most 100000 can be run"],
        id="command-past-what-exec-takes",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    command: 'true'\n    description: " + "d" * 10_001 + "\n",
        4,
        ["job 'a'", "description has 10001 characters; at most 10000"],
        id="description-past-the-api-limit",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    command: 'true'\n    cwd: /" + "c" * 5000 + "\n",
        4,
        ["job 'a'", "cwd has 5001 characters; at most 4095"],
        id="cwd-past-path-max",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    command: 'true'\n    timeout: 36501d\n",
        4,
        ["job 'a'", "timeout must be at most 36500d"],
        id="timeout-past-a-century",
    ),
    pytest.param(
        "jobs:\n  - name: \"night\\u00a0ly\"\n    command: 'true'\n",
        2,
        ["only printable characters and plain spaces, not U+00A0 (no-break space)"],
        id="name-no-break-space",
    ),
    pytest.param(
        "jobs:\n  - name: \"be\\u0007ll\"\n    command: 'true'\n",
        2,
        ["not U+0007 (a control character)"],
        id="name-control-character",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    command: 'true'\n    queue: a/b\n",
        4,
        ["job 'a'", "'queue' 'a/b'", "no spaces, control characters or '/'"],
        id="queue-no-lane-can-have",
    ),
    pytest.param(
        "jobs:\n  - name: a\n    command: 'true'\n    queue: ..\n",
        4,
        ["job 'a'", "cannot be '.' or '..'"],
        id="queue-dot-dot",
    ),
    pytest.param(
        '{"jobs": [{"name": "a", "command": "echo \\ud83d"}]}',
        1,
        ["job 'a'", "'command' has a lone UTF-16 surrogate"],
        id="lone-surrogate",
    ),
]


def test_a_character_json_writes_as_two_escapes_is_read_as_one() -> None:
    """json.dumps writes U+1F642 as \\ud83d\\ude42 (ensure_ascii): a JSON reader joins the
    pair, and so does a definition file's."""
    text = json.dumps(
        {
            "jobs": [
                {
                    "name": "smile \U0001f642",
                    "command": "echo \U0001f642",
                    "description": "\U0001f642",
                    "env": {"FACE": "\U0001f642"},
                }
            ]
        }
    )
    assert "\\ud83d\\ude42" in text
    (job,) = parse_definitions(text, "jobs.json")
    assert job.name == "smile \U0001f642"
    assert job.fields["command"] == "echo \U0001f642"
    assert job.fields["description"] == "\U0001f642"
    assert job.fields["env"] == {"FACE": "\U0001f642"}


@pytest.mark.parametrize(("text", "line", "fragments"), REFUSALS)
def test_refusals_name_the_line_the_job_and_the_reason(
    text: str, line: int, fragments: list[str]
) -> None:
    error = refusal(text)
    assert error.source == "jobs.yaml"
    assert error.line == line, str(error)
    assert str(error).startswith(f"jobs.yaml:{line}: ")
    for fragment in fragments:
        assert fragment in str(error)


def test_an_entry_comes_after_the_entry_that_holds_its_parent() -> None:
    # Decided: the order of a file's entries does not matter; a parent defined later
    # in the file (even nested in a later entry) is created first.
    text = (
        "jobs:\n"
        "  - name: kid\n    parent: inner\n    command: 'true'\n"
        "  - name: solo\n    command: 'true'\n"
        "  - name: Later\n    parent: Top\n    children:\n      - name: inner\n        children: []\n"
        "  - name: Top\n    children: []\n"
    )
    roots = parse_definitions(text, "jobs.yaml")
    assert [r.name for r in roots] == ["Top", "Later", "kid", "solo"]


def test_refusal_message_has_the_documented_shape() -> None:
    text = DESIGN_EXAMPLE.replace(
        "command: gcc fred.c", "command: gcc fred.c\n            timer: evry 10s"
    )
    with pytest.raises(DefinitionError) as info:
        parse_definitions(text, "jobs.yaml")
    assert str(info.value).startswith(
        "jobs.yaml:15: job 'gcc error': invalid schedule 'evry 10s' at position 0: "
    )


def test_an_error_deep_in_the_file_refuses_the_whole_file() -> None:
    text = DESIGN_EXAMPLE + '  - name: broken\n    command: echo "unterminated\n'
    error = refusal(text)
    assert error.line == 19
    assert "job 'broken'" in str(error)
    assert "Unterminated quoted string" in str(error)


def test_unknown_tag_is_refused_with_its_line() -> None:
    error = refusal("jobs:\n  - name: a\n    description: !!python/name:os.system x\n")
    assert error.line == 3
    assert "job 'a'" in str(error)


# --- JSON ------------------------------------------------------------------------------------


def test_json_input_works_with_lines() -> None:
    document = {
        "jobs": [
            {
                "name": "Periodic",
                "timer": "every 10s",
                "active": True,
                "children": [
                    {"name": "t", "command": "echo hi\necho there", "env": {"A": "1"}},
                ],
            }
        ]
    }
    roots = parse_definitions(json.dumps(document, indent="\t"), "jobs.json")
    jobs = by_name(roots)
    assert jobs["t"][1] is roots[0]
    assert jobs["t"][0].kind is Kind.TASK
    assert jobs["t"][0].fields["command"] == "echo hi\necho there"
    assert jobs["t"][0].fields["env"] == {"A": "1"}
    assert roots[0].fields["timer"] == "every 10s"
    assert jobs["t"][0].line == 8


def test_json_errors_carry_the_line() -> None:
    text = '{\n  "jobs": [\n    {"name": "x", "active": "yes"}\n  ]\n}\n'
    error = refusal(text)
    assert error.line == 3
    assert "job 'x'" in str(error)


# --- dumping ---------------------------------------------------------------------------------


def record(id_: int, name: str, kind: Kind, **fields: Any) -> JobRecord:
    return JobRecord(id=id_, name=name, kind=kind, **fields)


def test_dump_writes_the_documented_layout() -> None:
    records = [
        record(3, "gcc error", Kind.TASK, parent_id=2, command="gcc fred.c", active=True),
        record(1, "Periodic", Kind.BOX, timer="every 10s", active=True, exit_status=3),
        record(2, "Box", Kind.BOX, parent_id=1, active=True, on_error=OnError.ABORT),
        record(4, "no-op ok", Kind.TASK, parent_id=2, command="true", job_order=1),
        record(5, "Empty", Kind.BOX, job_order=-1),
    ]
    assert dump_definitions(records) == textwrap.dedent(
        """\
        jobs:
          - name: Empty
            active: false
            children: []
          - name: Periodic
            timer: every 10s
            active: true
            children:
              - name: Box
                active: true
                on_error: abort
                children:
                  - name: gcc error
                    command: gcc fred.c
                    active: true
                  - name: no-op ok
                    command: 'true'
                    active: false
        """
    )


def test_dump_writes_multi_line_commands_as_literal_blocks() -> None:
    command = "set -e\nfor i in 1 2; do\n  echo $i\ndone\n"
    text = dump_definitions([record(1, "script", Kind.TASK, command=command)])
    assert "command: |\n      set -e\n      for i in 1 2; do\n        echo $i\n      done\n" in text
    assert parse_definitions(text)[0].fields["command"] == command


def test_dump_of_a_subtree_makes_its_top_a_root() -> None:
    records = [
        record(7, "sub", Kind.BOX, parent_id=99),
        record(8, "leaf", Kind.TASK, parent_id=7, command="ls"),
    ]
    [root] = parse_definitions(dump_definitions(records))
    assert (root.name, [child.name for child in root.children]) == ("sub", ["leaf"])


def test_dump_refuses_what_it_cannot_write() -> None:
    with pytest.raises(JobError, match="without a command"):
        dump_definitions([record(1, "t", Kind.TASK)])
    with pytest.raises(JobError, match="cycle"):
        dump_definitions(
            [record(1, "a", Kind.BOX, parent_id=2), record(2, "b", Kind.BOX, parent_id=1)]
        )


# --- round trip ------------------------------------------------------------------------------


def definition_of(fields: dict[str, Any], kind: Kind) -> dict[str, Any]:
    """The definition fields with defaults filled in, minus what the kind ignores."""
    full = field_defaults() | {k: v for k, v in fields.items() if k in DEFINITION_FIELDS}
    full.pop("box_type" if kind is Kind.TASK else "command")
    return full


def shape_of_records(records: list[JobRecord]) -> dict[str, Any]:
    ids = {r.id: r for r in records}
    shape = {}
    for r in records:
        parent = ids[r.parent_id].name if r.parent_id in ids else None
        siblings = sorted(
            (
                s
                for s in records
                if (ids[s.parent_id].name if s.parent_id in ids else None) == parent
            ),
            key=lambda s: (s.job_order, s.id),
        )
        fields = {name: getattr(r, name) for name in DEFINITION_FIELDS}
        shape[r.name] = (r.kind, parent, siblings.index(r), definition_of(fields, r.kind))
    return shape


def shape_of_defs(roots: list[JobDef]) -> dict[str, Any]:
    return {
        job.name: (
            job.kind,
            parent and parent.name,
            job.fields["job_order"],
            definition_of(job.fields, job.kind),
        )
        for job, parent in iter_defs(roots)
    }


def test_round_trip_keeps_everything() -> None:
    records = [
        record(
            1,
            "Nächtlich ☾",
            Kind.BOX,
            timer="daily 22:56",
            active=True,
            misfire=Misfire.SKIP,
            box_type=BoxType.TIMED,
            description="line one\nline two\n",
        ),
        record(
            2,
            "build",
            Kind.TASK,
            parent_id=1,
            job_order=4,
            command="make all\n  make test\n",
            timeout_s=5400.0,
            env={"CC": "gcc", "EMPTY": "", "QUOTE": 'it\'s "x"'},
            cwd="/srv/src dir",
            priority=-7,
            queue="fast_lane",
            max_log_files=3,
            retries=4,
        ),
        record(
            3,
            "yes",
            Kind.TASK,
            parent_id=1,
            job_order=2,
            command="echo 'a' \nls",
            timeout_s=2.5,
            on_error=OnError.ABORT,
        ),
        record(4, "1e3", Kind.BOX, parent_id=1, job_order=9, description=""),
        record(5, "null", Kind.TASK, command="true", timer="every 10s", description="null"),
    ]
    text = dump_definitions(records)
    assert shape_of_defs(parse_definitions(text)) == shape_of_records(records)


no_surrogates = st.characters(blacklist_categories=("Cs",))
plain_text = st.text(no_surrogates, max_size=30)
no_nul_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"))
job_names = st.text(
    # '/' is refused in a name (the API names jobs in URL paths)
    st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp"), blacklist_characters="/"),
    min_size=1,
    max_size=40,
).filter(
    # ...and so are '.' and '..' (README "Job names"), and what does not print (a format
    # or unassigned character, a no-break space); a name is kept composed (NFC)
    lambda name: name.isprintable()
    and name == name.strip()
    and name not in (".", "..")
    and unicodedata.is_normalized("NFC", name)
)
command_lines = st.sampled_from(
    [
        "gcc fred.c",
        "true",
        "ls -l && sleep 6",
        'echo "hi  there"',
        "for i in 1 2; do echo $i; done",
        "  indented",
        "echo trailing  ",
        "printf '%s\\n' é",
        "# just a comment",
    ]
)
commands = st.builds(
    lambda lines, newline: "\n".join(lines) + newline,
    st.lists(command_lines, min_size=1, max_size=3),
    st.sampled_from(["", "\n"]),
)
timeouts = st.one_of(
    st.none(),
    st.integers(1, 10**7).map(float),
    st.floats(min_value=1e-6, max_value=1e9, allow_nan=False, allow_infinity=False),
)


def definition_fields(kind: Kind) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "description": st.none() | plain_text,
            "timer": st.none() | st.sampled_from(VALID_TIMERS),
            "command": commands if kind is Kind.TASK else st.none(),
            "active": st.booleans(),
            "on_error": st.sampled_from(OnError),
            "box_type": st.sampled_from(BoxType),
            "queue": st.sampled_from(["default", "fast_lane", "lane-ü"]),
            "priority": st.integers(-MAX_PRIORITY, MAX_PRIORITY),
            "timeout_s": timeouts,
            "max_log_files": st.none() | st.integers(1, MAX_LOG_FILES),
            "misfire": st.sampled_from(Misfire),
            "cwd": st.none() | no_nul_text.map(lambda text: "/" + text),
            "env": st.dictionaries(
                st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True).filter(
                    lambda name: not name.upper().startswith("JOBCONTROL_")
                ),
                no_nul_text,
                max_size=3,
            ),
            "exit_status": st.integers(0, 255),
            "version": st.integers(1, 50),
        }
    )


@st.composite
def forests(draw: st.DrawFn) -> list[JobRecord]:
    names = draw(st.lists(job_names, min_size=1, max_size=8, unique=True))
    records: list[JobRecord] = []
    for index, name in enumerate(names):
        boxes = [r for r in records if r.is_box]
        parent = draw(st.none() | st.sampled_from(boxes)) if boxes else None
        kind = draw(st.sampled_from(Kind))
        fields = draw(definition_fields(kind))
        records.append(
            JobRecord(
                id=100 + index * 7,
                name=name,
                kind=kind,
                parent_id=parent.id if parent else None,
                job_order=draw(st.integers(-3, 3)),
                **fields,
            )
        )
    return draw(st.permutations(records))


@settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(forests())
def test_round_trip_property(records: list[JobRecord]) -> None:
    text = dump_definitions(records)
    assert shape_of_defs(parse_definitions(text)) == shape_of_records(records)
    # The output is block style YAML a person can read: no flow-style jobs.
    assert yaml.safe_load(text)["jobs"] is not None
    # (A flow-style job would be a list item opening a mapping: "- {name: ...". An env
    # value may hold "{name" itself, quoted, which is fine.)
    assert not re.search(r"^\s*- \{", text, re.M), text


# --- check_command ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "fragment"),
    [
        ("if then fi", '"then" unexpected'),
        ('echo "unterminated', "Unterminated quoted string"),
        ("echo )", '")" unexpected'),
        ("echo ok\nif true; then\n  echo x\n", "line"),
        ("", "empty"),
        ("  \n\t ", "empty"),
        ("echo a\0b", "NUL"),
    ],
)
def test_check_command_refuses(command: str, fragment: str) -> None:
    with pytest.raises(CommandError, match=re.escape(fragment)) as info:
        check_command(command)
    assert "/bin/sh:" not in str(info.value)


@pytest.mark.parametrize(
    "command",
    [
        "gcc fred.c",
        "ls -l && sleep 6",
        "for i in 1 2 3\ndo\n  echo $i\ndone\n",
        "set -e\ncd /tmp\nif [ -d x ]; then\n  rm -r x\nfi",
        "-x looks like an option",
        "true",
    ],
)
def test_check_command_accepts(command: str) -> None:
    check_command(command)


JOB = "jobs:\n- name: a\n  command: b\n"


@pytest.mark.parametrize(
    ("text", "said", "plain"),
    [
        (
            JOB + "  description: 2001-13-14\n",
            "<input>:4: job 'a': 'description': '2001-13-14' is no timestamp: month must be in "
            "1..12 (put it in quotes to make it a string)",
            True,
        ),
        (
            JOB + "  description: 2001-12-14 25:00:00\n",
            "is no timestamp: hour must be in 0..23 (put it in quotes to make it a string)",
            True,
        ),
        (JOB + "  retries: 1" + "0" * 4400 + "\n", "<input>:4: job 'a': 'retries': '1000", True),
        (
            JOB + "  retries: 0x" + "f" * 4000 + "\n",
            "'retries' must be between 0 and 100, got a number of 4000 hexadecimal digits",
            False,
        ),
        (
            JOB + "  description: 0x" + "f" * 4000 + "\n",
            "'description' must be a string, got a number of 4000 hexadecimal digits",
            True,
        ),
        (
            JOB + '  description: "\\U00110000"\n',
            "<input>:4: invalid YAML: chr() arg not in range",
            False,
        ),
        (
            JOB + "  retries: !!int abc\n",
            "'retries': 'abc' is no int: invalid literal for int()",
            False,
        ),
        (JOB + "  retries: !!int ''\n", "<input>:4: job 'a': 'retries': '' is no int", False),
        (JOB + "  active: !!bool x\n", "<input>:4: job 'a': 'active': 'x' is no bool", False),
        (JOB + "  description: !!timestamp x\n", "'description': 'x' is no timestamp", False),
        (JOB + "  timeout: !!float x\n", "'timeout': 'x' is no float: could not convert", False),
        ("[" * 600 + "]" * 600, "<input>: invalid YAML: nested too deeply", False),
    ],
    ids=lambda v: v[:40] if isinstance(v, str) else None,
)
def test_a_value_yaml_cannot_build_is_refused_with_its_line_and_key(
    text: str, said: str, plain: bool
) -> None:
    """Python's own errors while a scalar is built (a date out of range, an integer past
    4,300 digits, a bad explicit tag) or the file composed (an escape past Unicode,
    nesting past the stack) are refusals like any other, never a traceback."""
    with pytest.raises(DefinitionError) as refused:
        parse_definitions(text)
    assert said in str(refused.value)
    # Quoting helps only a value YAML took for something else by itself, not one tagged.
    assert ("put it in quotes" in str(refused.value)) == plain

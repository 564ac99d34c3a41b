"""The request bodies of the job routes: strict, bounded, unknown fields refused.

Pydantic checks shapes and types (a 422 naming the field); what a value means
(a schedule that parses, a command the shell accepts, a name that is free) is
the engine's to check, so its message names the job.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from jobcontrol.model import (
    MAX_COMMAND_BYTES,
    MAX_DESCRIPTION,
    MAX_ENV_NAME,
    MAX_ENV_VALUE,
    MAX_ID,
    MAX_PATH,
    MAX_QUEUE,
    MAX_TIMER,
)

# Request bodies above this are refused (413) before they are read whole.
MAX_BODY_BYTES = 10 * 1024 * 1024
MAX_ITEMS = 10_000


def _no_nul(value: str) -> str:
    # No database text column (PostgreSQL's least of all) nor process argument holds one.
    if "\x00" in value:
        raise ValueError("must not contain a NUL character")
    if any("\ud800" <= ch <= "\udfff" for ch in value):
        raise ValueError("must be text: a lone UTF-16 surrogate (\\u escape) is not a character")
    return value


NoNul = AfterValidator(_no_nul)


def _printable(value: str) -> str:
    # What is shown as one line (a file name in the audit trail) holds no line break
    # nor terminal escape.
    if not value.isprintable():
        raise ValueError("must not contain control or line-break characters")
    return value


Printable = AfterValidator(_printable)


JobId = Annotated[int, Field(ge=1, le=MAX_ID)]
JobName = Annotated[str, StringConstraints(min_length=1, max_length=128), NoNul]
# A name given to a job: the engine checks it (``fields.check_name``), naming the job and
# the rule (an empty name, spaces around it, one too long); bounded here only as any text.
GivenName = Annotated[str, StringConstraints(max_length=4096), NoNul]
# A job is named by its id (a JSON number) or its name (a JSON string).
JobRef = JobId | JobName
JobRefs = Annotated[list[JobRef], Field(min_length=1, max_length=MAX_ITEMS)]
Text = Annotated[str, StringConstraints(max_length=MAX_DESCRIPTION), NoNul]
# Characters here; the engine counts the command's bytes (``definitions.fields``).
Command = Annotated[str, StringConstraints(max_length=MAX_COMMAND_BYTES), NoNul]
Path = Annotated[str, StringConstraints(max_length=MAX_PATH), NoNul]
Queue = Annotated[str, StringConstraints(max_length=MAX_QUEUE), NoNul]
Timer = Annotated[str, StringConstraints(max_length=MAX_TIMER), NoNul]
EnvName = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ENV_NAME), NoNul]
EnvValue = Annotated[str, StringConstraints(max_length=MAX_ENV_VALUE), NoNul]
# Seconds, or duration text as in definition files ("90s", "1h30m").
Timeout = (
    Annotated[float, Field(allow_inf_nan=False)] | Annotated[str, StringConstraints(max_length=64)]
)
OnErrorValue = Literal["abort", "continue"]
BoxTypeValue = Literal["sequence", "timed"]
MisfireValue = Literal["run-once", "skip"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class DefinitionFields(Strict):
    """The optional fields of a job's definition; null clears a text field."""

    description: Text | None = None
    command: Command | None = None
    timer: Timer | None = None
    active: bool = False
    on_error: OnErrorValue = "continue"
    box_type: BoxTypeValue | None = None
    queue: Queue = "default"
    priority: int = 0
    timeout: Timeout | None = None
    max_log_files: int | None = None
    retries: int = 0
    misfire: MisfireValue = "run-once"
    cwd: Path | None = None
    env: Annotated[dict[EnvName, EnvValue], Field(max_length=1000)] = Field(default_factory=dict)

    def given(self) -> dict[str, Any]:
        """The fields the client sent, by the engine's names (``timeout`` and ``parent`` it aliases)."""
        return self.model_dump(exclude_unset=True)


class NewJobBody(DefinitionFields):
    name: GivenName
    kind: Literal["box", "task"]
    parent: JobRef | None = None


class FieldChanges(DefinitionFields):
    """Only the fields given change; ``parent: null`` moves a job to the top level."""

    name: GivenName | None = None
    parent: JobRef | None = None
    job_order: int | None = None


class JobChangeBody(Strict):
    job: JobRef
    version: JobId | None = Field(
        None, description="the version the client saw; null: last writer wins"
    )
    fields: FieldChanges


class ModifyBody(Strict):
    changes: Annotated[list[JobChangeBody], Field(min_length=1, max_length=MAX_ITEMS)]


class JobsBody(Strict):
    jobs: JobRefs


class OnErrorBody(Strict):
    jobs: JobRefs
    on_error: OnErrorValue


class BoxTypeBody(Strict):
    jobs: JobRefs
    box_type: BoxTypeValue


# A lane's settings as given: the lane service checks each key and value (so a refusal
# names the lane and the setting, and is audited). Numbers, booleans, null, or text as
# the CLI writes it ("3", "none", "2s", "30m", "false"). Text up to 1 KiB passes here,
# so that an over-long name or value is refused by the service, naming what it is.
SettingValue = (
    Annotated[str, StringConstraints(max_length=1024), NoNul]
    | Annotated[float, Field(allow_inf_nan=False)]
    | int
    | bool
    | None
)
LaneSettings = Annotated[
    dict[Annotated[str, StringConstraints(max_length=64)], SettingValue], Field(max_length=16)
]


class PriorityBody(Strict):
    priority: int

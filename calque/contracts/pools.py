"""API bodies of pools and claims (what crosses the HTTP boundary)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_serializer, field_validator, model_validator

from calque.contracts.common import (
    SHA256_PATTERN,
    Out,
    Request,
    Strict,
    catalog_instance_types,
    consent_required,
    group_in_words,
    in_words,
    said_as,
)
from calque.contracts.economics import GROUP_PATTERN
from calque.contracts.layout import LayoutSpec

_NAME_SHAPE = (
    "3 to 40 characters, lowercase letters, digits and '-', starting with a letter and ending "
    "with a letter or digit"
)
NAME_PATTERN = said_as(r"^[a-z][a-z0-9-]{1,38}[a-z0-9]$", f"a pool name: {_NAME_SHAPE}")
NAME_RULE = f"a pool name is {_NAME_SHAPE}"
RUNNER_PATTERN = said_as(
    r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", "MODULE:CLASS, a module of the package and its runner class"
)
MAX_ITEMS = 10_000
PACKAGE_MAX_BYTES = 512 * 1024 * 1024  # a runner's code; model weights belong in its own storage
PACKAGE_URL_EXPIRES_S = 900
MAX_WAIT_CEILING_S = 24 * 3600
CLAIM_ID_PATTERN = said_as(r"^c-[0-9a-f]{16}$", "a claim id: c- and 16 hexadecimal digits")
# A claim's input staged in S3 (one PUT: S3's own limit for a single object upload)
INPUT_MAX_BYTES = 5 * 1024**3


class PoolSettings(Request):
    min_workers: int = Field(default=0, ge=0, le=256)
    max_workers: int = Field(default=4, ge=1, le=256)
    target_backlog_per_worker: int = Field(default=1, ge=1, le=10_000)
    idle_timeout_s: int = Field(default=1800, ge=10, le=7 * 24 * 3600)
    max_wait_s: int | None = Field(
        default=None,
        ge=10,
        le=MAX_WAIT_CEILING_S,
        description="a p95 wait target (seconds): the scaler chooses keep-warm, scale-out batch and "
        "pre-warming from the pool's observed claims to meet it at the least cost, within min and "
        "max workers (idle_timeout_s and target_backlog_per_worker then give way)",
    )


class PoolCreate(PoolSettings):
    model_config = ConfigDict(json_schema_extra=lambda schema: _pool_create_schema(schema))

    name: str = Field(pattern=NAME_PATTERN, description="lowercase letters, digits and dashes; 3 to 40")
    model: str = Field(min_length=1, max_length=200)
    instance_type: str = Field(min_length=1, max_length=40, json_schema_extra=catalog_instance_types)
    runner: str = Field(pattern=RUNNER_PATTERN, description="MODULE:CLASS")
    package_key: str | None = Field(
        default=None,
        max_length=500,
        pattern=r"^pools/[^/]+/package/",
        description="the runner package, staged in the artifact bucket: the key that "
        "POST /v1/pools/{name}/package gave for this pool's name (under pools/{name}/package/), "
        "uploaded there",
    )
    package_path: str | None = Field(
        default=None, max_length=500, description="local plane only: a directory on this machine"
    )
    layout: LayoutSpec | None = Field(default=None, description="one worker per slice; omitted: per GPU")
    spot: bool = False
    i_understand_this_spends_money: bool = False

    @field_serializer("layout")
    def _layout_as_given(self, layout: LayoutSpec | None) -> dict[str, Any] | None:
        """The spec as the caller wrote it (what the pool keeps and the host agent is sent)."""
        return None if layout is None else layout.model_dump(mode="json", exclude_unset=True)

    @field_validator("name", mode="before")
    @classmethod
    def _name_rule_in_words(cls, value: object) -> object:
        """The pattern's rule said in words (runs before the pattern, which stays for the schema)."""
        return in_words(value, NAME_PATTERN, NAME_RULE + " (got {got})")

    @field_validator("runner", mode="before")
    @classmethod
    def _runner_rule_in_words(cls, value: object) -> object:
        return in_words(
            value,
            RUNNER_PATTERN,
            "the runner is MODULE:CLASS, a module of the package and its runner class, "
            "e.g. textstats:TextStats (got {got})",
            keep=200,
        )


class PackageUpload(Request):
    """POST /v1/pools/{name}/package (admins): where to upload the runner package (a zip)."""

    sha256: str = Field(pattern=SHA256_PATTERN, description="the zip's SHA-256, hex: it names the object")
    size: int = Field(ge=1, le=PACKAGE_MAX_BYTES, description="the zip's size in bytes")


class PoolUpdate(Request):
    min_workers: int | None = Field(default=None, ge=0, le=256)
    max_workers: int | None = Field(default=None, ge=1, le=256)
    target_backlog_per_worker: int | None = Field(default=None, ge=1, le=10_000)
    idle_timeout_s: int | None = Field(default=None, ge=10, le=7 * 24 * 3600)
    max_wait_s: Annotated[int, Field(ge=10, le=MAX_WAIT_CEILING_S)] | Literal[0] | None = Field(
        default=None,
        description="a p95 wait target (seconds, 10 or more) the scaler meets at the least cost; "
        "0 drops the target (the scaler follows idle_timeout_s and target_backlog_per_worker again)",
    )
    # A runner update, rolled out worker by worker: a new runner class, a new package, or both
    # (what is not given stays the pool's).
    runner: str | None = Field(default=None, pattern=RUNNER_PATTERN, description="MODULE:CLASS")
    package_key: str | None = Field(
        default=None, max_length=500, description="a new runner package, staged in the artifact bucket"
    )
    package_path: str | None = Field(
        default=None, max_length=500, description="local plane only: a directory on this machine"
    )

    @field_validator("max_wait_s", mode="before")
    @classmethod
    def _wait_target_in_words(cls, value: object) -> object:
        """A number outside both forms said once, in words (not one refusal per member of the
        union: "constrained-int: ...; literal[0]: Input should be 0")."""
        if value is None:
            return value
        if (
            not isinstance(value, int)
            or isinstance(value, bool)
            or (value != 0 and not 10 <= value <= MAX_WAIT_CEILING_S)
        ):
            raise ValueError(
                f"a wait target is a whole number of seconds, 10 to {MAX_WAIT_CEILING_S}, or 0 to drop "
                f"it; got {value!r}"
            )
        return value


class PoolDelete(Request):
    model_config = ConfigDict(json_schema_extra=consent_required("i_understand_this_terminates_instances"))

    i_understand_this_terminates_instances: bool = False
    now: bool = False


class ClaimInputUpload(Request):
    """POST /v1/pools/{name}/claims/input: where to PUT a claim's input too large for a request
    body (``{"items": [...]}`` as JSON); the answer names the claim id it will have."""

    sha256: str = Field(pattern=SHA256_PATTERN, description="the input document's SHA-256, hex")
    bytes: int = Field(ge=1, le=INPUT_MAX_BYTES, description="the input document's size in bytes")


class ClaimInput(Request):
    """A claim's input uploaded beforehand (``ClaimInputUpload``), instead of ``items``."""

    claim_id: str = Field(pattern=CLAIM_ID_PATTERN, description="the claim id the upload answered")
    sha256: str = Field(pattern=SHA256_PATTERN)
    bytes: int = Field(ge=1, le=INPUT_MAX_BYTES)
    items: int = Field(ge=1, description="how many items the document holds")


class ClaimSubmit(Request):
    model_config = ConfigDict(json_schema_extra=lambda schema: _claim_submit_schema(schema))

    items: list[Any] | None = Field(default=None, min_length=1, max_length=MAX_ITEMS)
    input: ClaimInput | None = Field(
        default=None, description="an input uploaded through POST /v1/pools/{name}/claims/input"
    )
    group: str | None = Field(
        default=None,
        pattern=GROUP_PATTERN,
        description="the group to charge (one of the member's); omitted: their default group",
    )

    @field_validator("group", mode="before")
    @classmethod
    def _group_rule_in_words(cls, value: object) -> object:
        """The pattern's rule said in words (runs before the pattern, which stays for the schema)."""
        return group_in_words(value)

    @model_validator(mode="after")
    def _items_or_input(self) -> ClaimSubmit:
        if (self.items is None) == (self.input is None):
            raise ValueError("give either items (a list) or input (an uploaded input), not both nor neither")
        return self


class ClaimReport(Strict):
    """A worker's report on a claim (instance role only)."""

    event: Literal["started", "attempt_failed", "succeeded"]
    worker_id: str = Field(min_length=1, max_length=100)
    instance_id: str = Field(min_length=1, max_length=40)
    # SQS's receive count, at most its maxReceiveCount's ceiling (1,000)
    attempt: int = Field(ge=1, le=1000)
    reason: str | None = Field(default=None, max_length=4000)
    result_key: str | None = Field(default=None, max_length=1000)
    summary: dict[str, Any] | None = None

    @field_validator("reason")
    @classmethod
    def _short(cls, v: str | None) -> str | None:
        return v[:2000] if v else v


class WorkerReport(Strict):
    instance_id: str = Field(min_length=1, max_length=40)
    state: Literal["idle", "busy", "exited"]
    # how long the runner's enter took (loading the model): a week bounds any real one
    enter_seconds: float | None = Field(default=None, ge=0, le=7 * 24 * 3600)
    claim_id: str | None = None
    reason: str | None = Field(default=None, max_length=4000)


class WorkerCredentialsRequest(Strict):
    """A pool worker asks for its own credentials, signed by its instance's role."""

    instance_id: str = Field(min_length=1, max_length=40)


class WorkerCredentials(Out):
    """Temporary credentials that reach only the worker's own pool's queue and objects."""

    access_key_id: str
    secret_access_key: str
    session_token: str
    expiration: str = Field(description="when they expire (ISO 8601, UTC); ask again before")


class ClaimReportAnswer(Out):
    proceed: bool = False
    completed: bool = False
    state: str


class Pool(Out):
    name: str
    model: str
    instance_type: str
    runner: str
    state: str
    min_workers: int
    max_workers: int
    target_backlog_per_worker: int
    idle_timeout_s: int
    max_wait_s: int | None = Field(default=None, description="the p95 wait target the scaler meets, if set")
    spot: bool = False
    layout: dict[str, Any] | None = None
    created_by: str
    created_at: str
    queue_url: str
    dlq_url: str
    package_key: str | None = None  # the runner package in the artifact bucket
    start_failures: int = Field(
        default=0,
        description="worker starts in a row that failed before serving: a worker that exited "
        "before it served, or a start command that started none (counted once)",
    )
    start_failure: str | None = Field(default=None, description="why the latest of them failed")
    version: int = Field(default=1, description="the runner version the pool starts workers on")
    rollout: dict[str, Any] | None = Field(
        default=None,
        description="the latest runner update: its version, runner, package, state (rolling, done, "
        "stopped) and why",
    )
    current_workers: dict[str, int] | None = Field(
        default=None, description="its workers now, by state (starting, idle, busy)"
    )


class Claim(Out):
    claim_id: str
    pool: str
    user: str
    state: str
    items: int
    submitted_at: str
    started_at: str | None = None
    finished_at: str | None = None
    worker: str | None = None
    instance_id: str | None = None
    attempts: int = 0
    reason: str | None = None
    summary: dict[str, Any] | None = None
    group: str | None = None


# ---- pool status (GET /v1/pools/{name} -> "status") ---------------------------------------------
# The pools' records keep times as epoch seconds (the scaler's arithmetic); the API answers
# them, like every other document, as ISO 8601 UTC strings to the second ("...Z").

# The decision inputs that are times (the scaler's cooldown clocks).
_INPUT_TIMES = ("last_scale_out_at", "last_scale_in_at")


def iso_utc(epoch: float | None) -> str | None:
    """Epoch seconds as ISO 8601 UTC to the second ("2026-12-02T10:00:00Z"); None stays None."""
    if epoch is None:
        return None
    return datetime.fromtimestamp(float(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class WorkerStatus(Out):
    pool: str
    worker_id: str
    instance_id: str = Field(description='"-" until the fleet names the instance')
    capacity_ref: str = ""
    state: str
    launched_at: str = Field(description="when the scaler asked for it (ISO 8601 UTC)")
    seen_at: str | None = Field(default=None, description="its last report")
    idle_since: str | None = None
    # how long the runner's enter took (loading the model): a week bounds any real one
    enter_seconds: float | None = Field(default=None, ge=0, le=7 * 24 * 3600)
    claim_id: str | None = None
    reason: str | None = None
    claims_served: int = Field(default=0, description="claims it ran to succeeded")
    group: str = ""
    slot: int = 0
    started: bool = False
    version: int = Field(default=1, description="the runner version it runs")
    draining: bool = Field(default=False, description="a roll-out retires it: it stops after its claim")
    surge: bool = Field(default=False, description="started by a roll-out beside the pool's workers")

    @classmethod
    def of(cls, record: dict[str, Any]) -> WorkerStatus:
        times = {k: iso_utc(record.get(k)) for k in ("launched_at", "seen_at", "idle_since")}
        return cls.model_validate({**record, **times})


class DecisionStatus(Out):
    pool: str | None = None
    at: str = Field(description="when the scaler decided (ISO 8601 UTC)")
    action: str
    desired: int
    current: int
    launch: int = 0
    remove: list[str] = Field(default=[])
    reason: str
    inputs: dict[str, Any] = Field(default={})
    granted: int | None = Field(default=None, description="a scale-out: the workers it got")
    refilled: int | None = Field(default=None, description="a scale-out: of those, on free slots")
    waiting_for: str | None = Field(
        default=None, description="a scale-out granted fewer workers than it asked: why (the fleet's refusal)"
    )

    @classmethod
    def of(cls, record: dict[str, Any]) -> DecisionStatus:
        inputs = dict(record.get("inputs") or {})
        for key in _INPUT_TIMES:
            if isinstance(inputs.get(key), int | float):
                inputs[key] = iso_utc(inputs[key])
        return cls.model_validate({**record, "at": iso_utc(record["at"]), "inputs": inputs})


class PoolStatus(Out):
    pool: str
    state: str
    backlog: dict[str, int]
    oldest_claim_age_s: int | None = None
    claims: dict[str, int]
    warm_hits: int
    completed: int
    workers: list[WorkerStatus]
    decisions: list[DecisionStatus]
    last_decision: DecisionStatus | None = None
    start_failure_limit: int | None = Field(
        default=None,
        description="failed worker starts in a row after which the scaler starts no more and "
        "submits are refused, until an admin updates the pool",
    )


def _claim_submit_schema(schema: dict[str, Any]) -> None:
    """A claim has its items or an uploaded input, exactly one, neither null: the document says so."""
    props = schema.setdefault("properties", {})
    for key in ("items", "input"):
        prop = props.get(key, {})
        given = [o for o in prop.get("anyOf", []) if o.get("type") != "null"]
        if given:
            props[key] = {
                **given[0],
                **({"description": prop["description"]} if "description" in prop else {}),
            }
    schema["oneOf"] = [
        {"required": ["items"], "not": {"required": ["input"]}},
        {"required": ["input"], "not": {"required": ["items"]}},
    ]


def _pool_create_schema(schema: dict[str, Any]) -> None:
    """A pool is created only with the consent flag and with its runner package (staged in the
    artifact bucket, or on the local plane a directory): the document says both."""
    consent_required("i_understand_this_spends_money")(schema)
    schema["anyOf"] = [
        {"required": [key], "properties": {key: {"type": "string", "minLength": 1}}}
        for key in ("package_key", "package_path")
    ]

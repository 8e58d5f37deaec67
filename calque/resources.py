"""The deployable resources, described once as data.

The CDK stacks (infra/) and the embedded local plane (calque/local/) both build
from these definitions, so names, keys, indexes, queues and schedules cannot drift
between the two backends. Plain data only: no boto3, no CDK imports.
"""

from __future__ import annotations

from typing import NamedTuple


class Index(NamedTuple):
    name: str
    partition_key: str
    sort_key: str


class TableDef(NamedTuple):
    partition_key: str
    sort_key: str
    ttl_attribute: str
    indexes: tuple[Index, ...] = ()

    @property
    def attributes(self) -> tuple[str, ...]:
        names = [self.partition_key, self.sort_key]
        for ix in self.indexes:
            names += [ix.partition_key, ix.sort_key]
        return tuple(dict.fromkeys(names))


# One single table: hosts, slices, sessions, quotas, usage records.
# Key shapes are documented in calque/tenancy/store/keys.py (members' items: calque/members/keys.py).
REGISTRY_TABLE = TableDef(
    partition_key="pk",
    sort_key="sk",
    # Garbage collection ONLY: the reaper ends sessions on time; DynamoDB TTL can be days late.
    ttl_attribute="gc_at",
    indexes=(
        # Free slices by (backend, profile) across the fleet: candidate lists for placement.
        Index("free_slices", partition_key="free_pk", sort_key="free_sk"),
        # Live sessions by user, and by expiry for the reaper.
        Index("by_user", partition_key="user_pk", sort_key="user_sk"),
        Index("by_expiry", partition_key="expiry_pk", sort_key="expiry_sk"),
    ),
)


class FunctionDef(NamedTuple):
    """A Lambda entry point. ``handler`` is the dotted path the runtime loads."""

    id: str
    handler: str
    timeout_s: int
    memory_mib: int = 512
    description: str = ""


class QueueDef(NamedTuple):
    id: str
    consumer: str  # FunctionDef.id of the queue-triggered consumer
    max_receive_count: int = 5
    batch_size: int = 10
    fifo: bool = False
    # Queues' visibility timeout is at least six times the consumer's timeout.
    visibility_factor: int = 6


class ScheduleDef(NamedTuple):
    id: str
    target: str  # FunctionDef.id
    rate_s: int
    description: str = ""


FUNCTIONS: tuple[FunctionDef, ...] = (
    FunctionDef("api", "functions.api.handler.lambda_handler", timeout_s=29, description="the HTTP API"),
    FunctionDef(
        "host_tasks",
        "functions.host_tasks.handler.lambda_handler",
        timeout_s=60,
        description="sends host-agent commands (apply layout, reclaim) through SSM",
    ),
    FunctionDef(
        "reaper",
        "functions.reaper.handler.lambda_handler",
        timeout_s=120,
        description="ends expired sessions, quarantines slices whose host never answered",
    ),
)

QUEUES: tuple[QueueDef, ...] = (QueueDef("host_tasks", consumer="host_tasks", batch_size=10),)

SCHEDULES: tuple[ScheduleDef, ...] = (
    ScheduleDef("reaper", target="reaper", rate_s=60, description="end expired sessions"),
)

# Environment variable each function reads for each resource (see calque/settings).
ENV_TABLE_NAME = "CALQUE_TABLE_NAME"
ENV_ADMINS = "CALQUE_ADMINS"
ENV_HOST_TASKS_QUEUE_URL = "CALQUE_HOST_TASKS_QUEUE_URL"
ENV_SSM_DOCUMENT_NAME = "CALQUE_SSM_DOCUMENT_NAME"
# Where the host agent's bundle is (s3://bucket/key): whoever sends the document presigns it.
ENV_AGENT_BUNDLE = "CALQUE_AGENT_BUNDLE"
ENV_HOST_ROLE_NAME = "CALQUE_HOST_ROLE_NAME"
ENV_API_ENDPOINT = "CALQUE_API_ENDPOINT"
ENV_LOCAL_MODE = "CALQUE_LOCAL_MODE"
# The Session Manager document members connect with (the API names it in connect commands).
ENV_SESSION_DOCUMENT_NAME = "CALQUE_SESSION_DOCUMENT_NAME"

# Which resources each function is wired to (env + grants).
FUNCTION_WIRING: dict[str, tuple[str, ...]] = {
    "api": ("table", "host_tasks_queue", "host_role"),
    "host_tasks": ("table", "ssm_document", "api_endpoint"),
    "reaper": ("table", "host_tasks_queue"),
}
# Tenants isolated on the host: the API names the session document in connect commands.
FUNCTION_WIRING["api"] += ("session_document",)
# An admin's quota listing (GET /v1/quotas) scans the table for the quota items.
FUNCTION_WIRING["api"] += ("table_scan",)


def function_environment(fid: str) -> dict[str, str]:
    """What every deployed function's environment holds besides its resources (the stack
    sets it; bench/cold_import.py runs its cold starts with it). pydantic's plugin
    discovery is off: none is used, and looking for one reads every installed distribution's
    entry points when the first model is built, on the first request."""
    return {
        "POWERTOOLS_SERVICE_NAME": f"calque-{fid}",
        "POWERTOOLS_METRICS_NAMESPACE": METRICS_NAMESPACE,
        "PYDANTIC_DISABLE_PLUGINS": "__all__",
    }


def function(fid: str) -> FunctionDef:
    for f in FUNCTIONS:
        if f.id == fid:
            return f
    raise KeyError(fid)


def visibility_timeout_s(queue: QueueDef) -> int:
    return function(queue.consumer).timeout_s * queue.visibility_factor


class SsmDocumentParameters(NamedTuple):
    """Parameter names of the SSM Command document that runs the host agent.

    The deployed document (infra/) and the local plane's SSM executor both read
    these names, so a command sent by the control plane means the same on both.
    """

    verb: str = "verb"  # one of HOST_AGENT_VERBS
    spec: str = "spec"  # the layout spec as JSON text; empty when the verb needs none
    slice_id: str = "sliceId"  # the slice to reclaim; empty otherwise
    report_to: str = "reportTo"  # the API endpoint the agent reports to; defaults to the deployed API
    fence: str = "fence"  # reclaim: the slice's fence when its lease ended; echoed in the report
    user: str = "user"  # grant: the session's own account on the host (see host_agent.tenants)
    token_sha256: str = "tokenSha256"  # grant: the session token's hash, which login checks  # noqa: S105 (a parameter name)
    worker_action: str = "workerAction"  # worker: start | stop | status (a warm pool's workers)
    worker: str = "worker"  # worker start: the pool's worker document, JSON (host_agent/pool_workers.py)
    # A presigned GET of the agent's bundle: the step downloads it only when that version is
    # not installed yet; empty where the bundle is already on the machine (the local plane).
    bundle_url: str = "bundleUrl"


SSM_DOCUMENT_PARAMETERS = SsmDocumentParameters()
# The document's step that runs the host agent (it downloads the bundle first when that
# version is not installed): how a command ended on an instance is read for this step
# (GetCommandInvocation's PluginName).
HOST_AGENT_STEP = "runAgent"
HOST_AGENT_VERBS: tuple[str, ...] = ("apply", "assert", "export", "inventory", "reclaim", "report", "grant")
HOST_AGENT_VERBS += ("worker",)  # warm pools: start, stop, list a pool's workers on the host

# The control plane may send commands only to instances that carry this tag: whatever
# launches or adopts a host tags it so (the deployed IAM policy conditions on it).
HOST_TAG_KEY = "calque:host"
HOST_TAG_VALUE = "managed"


# -- Warm pools (layer 1): the scaler (schedule + the nudge queue a submit writes to) and the
# DLQ consumer (per-pool DLQs are created with each pool, so it reads them on a schedule).
FUNCTIONS += (
    FunctionDef(
        "pool_scaler",
        "functions.pool_scaler.handler.lambda_handler",
        timeout_s=60,
        description="sizes each warm pool from its backlog through the fleet; records every decision",
    ),
    FunctionDef(
        "pool_dlq",
        "functions.pool_dlq.handler.lambda_handler",
        timeout_s=60,
        description="marks failed the claims whose messages reached a pool's DLQ",
    ),
)
QUEUES += (QueueDef("pool_nudges", consumer="pool_scaler", batch_size=10, max_receive_count=3),)
SCHEDULES += (
    ScheduleDef("pool_scaler", target="pool_scaler", rate_s=60, description="size every pool"),
    ScheduleDef("pool_dlq", target="pool_dlq", rate_s=60, description="mark dead-lettered claims failed"),
)
# Where every function's Powertools metrics go (EMF, dimension ``service``: the function's id).
METRICS_NAMESPACE = "Calque"


class FailureMetricDef(NamedTuple):
    """A count a function publishes that should stay 0 while it still succeeds (so its
    errors alarm does not fire): one pool of many failed, a request answered 500. An alarm
    fires at 1."""

    function: str
    metric: str
    description: str


FAILURE_METRICS: tuple[FailureMetricDef, ...] = (
    FailureMetricDef(
        "api",
        "ApiInternalErrors",
        "The API answered a request 500 (the function itself succeeded): an unexpected error "
        "('unexpected error' in the api log group, with its trace) or a permission its role "
        "lacks ('missing permission', naming the action).",
    ),
    FailureMetricDef(
        "pool_scaler",
        "PoolScaleFailures",
        "A warm pool could not be sized (the others were): its backlog may wait with no worker. "
        "The pool_scaler log group names the pool and the error ('pool not scaled').",
    ),
    FailureMetricDef(
        "pool_dlq",
        "PoolDlqFailures",
        "A warm pool's dead-letter queue could not be read (the others were): its failed claims "
        "stay unmarked. The pool_dlq log group names the pool and the error.",
    ),
)
ENV_ARTIFACT_BUCKET = "CALQUE_ARTIFACT_BUCKET"
ENV_POOL_QUEUE_PREFIX = "CALQUE_POOL_QUEUE_PREFIX"
ENV_POOL_NUDGES_QUEUE_URL = "CALQUE_POOL_NUDGES_QUEUE_URL"
ENV_POOL_CAPACITY = "CALQUE_POOL_CAPACITY"
# The role pool workers' credentials are vended from (the API assumes it with the session tag
# calque:pool, so a worker reaches only its own pool's queue and objects); the scaler tells
# workers to fetch them. Unset (the local plane): workers use the host's own credentials.
ENV_POOL_WORKER_ROLE_ARN = "CALQUE_POOL_WORKER_ROLE_ARN"
POOL_QUEUE_PREFIX_LOCAL = "calque-local-pool"
POOL_QUEUE_PREFIX_DEPLOYED = "calque-pool"
FUNCTION_WIRING["api"] = (*FUNCTION_WIRING["api"], "artifact_bucket", "pool_queues", "pool_nudges_queue")
FUNCTION_WIRING["pool_scaler"] = ("table", "host_role", "artifact_bucket", "pool_queues", "pool_nudges_queue")
# The scaler starts workers on the instances the fleet hands over (the host-agent document's
# worker verb) and reads how each start ended.
FUNCTION_WIRING["pool_scaler"] += ("ssm_document", "ssm_invocations", "api_endpoint")
# The API vends pool workers' credentials (assumes the pool worker role); the scaler only learns
# that workers must fetch them.
FUNCTION_WIRING["api"] += ("pool_worker_credentials",)
FUNCTION_WIRING["pool_scaler"] += ("pool_worker_role",)
# The DLQ sweep only reads the pools' dead-letter queues (it never creates or deletes a queue).
FUNCTION_WIRING["pool_dlq"] = (
    "table",
    "host_role",
    "artifact_bucket",
    "pool_dead_letters",
    "pool_nudges_queue",
)

# ---- the fleet (layer 0) -------------------------------------------------------------------------


class EventRuleDef(NamedTuple):
    """An EventBridge rule on the default bus whose matches go to ``target`` (a FunctionDef.id)."""

    id: str
    target: str
    detail_types: tuple[str, ...]
    source: str = "aws.ec2"
    description: str = ""


FUNCTIONS += (
    FunctionDef(
        "acquirer",
        "functions.acquirer.handler.lambda_handler",
        timeout_s=120,
        description="launches queued acquisitions (the AZ/type/market sweep) and terminates released ones",
    ),
    FunctionDef(
        "fleet_events",
        "functions.fleet_events.handler.lambda_handler",
        timeout_s=60,
        description="EC2 state changes, spot interruption warnings and rebalance recommendations",
    ),
    FunctionDef(
        "reconciler",
        "functions.reconciler.handler.lambda_handler",
        timeout_s=300,
        description="makes EC2 and the registry agree: adopts, terminates, ends, enforces TTLs",
    ),
)
QUEUES += (QueueDef("fleet_acquire", consumer="acquirer", batch_size=1, max_receive_count=5),)
SCHEDULES += (
    ScheduleDef("reconciler", target="reconciler", rate_s=60, description="reconcile EC2 and the fleet"),
)
EC2_STATE_CHANGE = "EC2 Instance State-change Notification"
EC2_SPOT_INTERRUPTION = "EC2 Spot Instance Interruption Warning"
EC2_REBALANCE = "EC2 Instance Rebalance Recommendation"
EVENT_RULES: tuple[EventRuleDef, ...] = (
    EventRuleDef(
        "fleet_ec2",
        target="fleet_events",
        detail_types=(EC2_STATE_CHANGE, EC2_SPOT_INTERRUPTION, EC2_REBALANCE),
        description="EC2's word on the fleet's instances",
    ),
)
ENV_FLEET_ACQUIRE_QUEUE_URL = "CALQUE_FLEET_ACQUIRE_QUEUE_URL"
ENV_FLEET_LAUNCH_TEMPLATE = "CALQUE_FLEET_LAUNCH_TEMPLATE"
ENV_FLEET_SUBNETS = "CALQUE_FLEET_SUBNETS"  # subnet-id@az,... in the order to try
ENV_OTHER_ACCOUNTS = "CALQUE_OTHER_ACCOUNTS"  # distinct | refuse (calque.settings)
ENV_FLEET_AMI_ID = "CALQUE_FLEET_AMI_ID"  # one AMI for every type (else AWS's DLAMI parameters)
ENV_EVENT_BUS = "CALQUE_EVENT_BUS"
FUNCTION_WIRING["api"] += ("fleet_acquire_queue", "events")
# An admin's host registration asks EC2 whether the instance runs, and as what type.
FUNCTION_WIRING["api"] += ("instance_describe",)
FUNCTION_WIRING.update(
    {
        "acquirer": ("table", "host_tasks_queue", "fleet_acquire_queue", "fleet_launch", "events"),
        "fleet_events": ("table", "host_tasks_queue", "fleet_acquire_queue", "fleet_describe", "events"),
        "reconciler": ("table", "host_tasks_queue", "fleet_acquire_queue", "fleet_launch", "events"),
    }
)
# Tags on every instance (and its volumes) the fleet launches.
FLEET_TAG_REQUEST = "calque:request-id"
FLEET_TAG_OWNER = "calque:owner"
FLEET_TAG_POOL = "calque:pool"

# Pools get their instances from the fleet, in process: the scaler (and the DLQ consumer,
# which releases what a deleted pool held) are wired as the fleet's callers.
for _caller in ("pool_scaler", "pool_dlq"):
    FUNCTION_WIRING[_caller] = (
        *FUNCTION_WIRING[_caller],
        "host_tasks_queue",
        "fleet_acquire_queue",
        "events",
    )

# Tenancy publishes calque.session.* itself: the reaper's expiries (the API's check-outs and
# check-ins already have the bus, for the fleet's events).
FUNCTION_WIRING["reaper"] = (*FUNCTION_WIRING["reaper"], "events")

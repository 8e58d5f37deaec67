"""Cold start of the API function, as a deployed user feels it, against boto3's own.

A cold start is the import of the entry point PLUS its first request: work moved
from import into the first request is still paid by the first user. So each sample
is a fresh interpreter that imports ``functions.api.handler`` and answers one
check-out (an API Gateway event, in-process) against a stubbed backend. The baseline
is a fresh interpreter that imports boto3, creates a DynamoDB client and makes its
first call (GetItem) to the same stub. The stub is an HTTP server that answers each
request at once with the answer moto gave it when it was recorded (a moto server seeded
with ready hosts, through a recording proxy): both sides pay the real botocore work of a
call (signing, serializing, HTTP, parsing), neither pays moto's latency, nor any network
latency (the "calls" column says how many calls each side makes: on AWS each one adds a
round trip). Runs alternate so both see the same machine; the medians and their ratio
are printed, side by side, in wall time and in the process's CPU time (steadier than wall
time on a shared machine). Target: at most 1.5x.

Both sides run with the function's environment as the stack sets it
(calque.resources.function_environment) and from a dependency layer holding only the
project's runtime requirements and what they require, compiled by hash (``layer``): not
from this development environment, whose hundred other distributions a cold start would
scan. Ours is the stack's layer, whose botocore keeps only the models of the services the
functions call (infra.bundling.prune_botocore); the baseline is boto3 on botocore as it
ships, the Lambda runtime's. The row under it runs boto3 on our layer's pruned botocore:
the ratio against it is what our code and libraries cost, the SDK's data set aside.
Our code runs from a bundle built here by the deployment's own recipe
(infra.bundling.CopyPackages) in a temporary directory: "bytecode" is the bundle as
shipped (compiled by hash for this interpreter, the stand-in for the Lambda's),
"sources" the same bundle without bytecode, compiled on every cold start as a
read-only Lambda would. These two run with tracing off (``POWERTOOLS_TRACE_DISABLED``);
"bytecode, X-Ray on" runs as the stack deploys the function (X-Ray active), so its
first request also builds the Tracer and patches botocore. Nothing is written into the
repository (no __pycache__).

    python bench/cold_import.py [--runs 9] [--importtime] [--account]

--importtime prints, for the bundle with bytecode, the imports of the cold start
that cost most (python -X importtime, cumulative). --account splits both cold
starts into their steps, in the order a cold start takes them (each step's median),
and measures the floor of the stack: the calls a check-out makes, from a bare
Powertools resolver with request validation, Logger, Metrics and one pydantic model,
with no calque code at all (and the same collector settings as our entry points), its
clients made as ours are (a botocore session), and once more through boto3.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TARGET = 1.5
ACCOUNT = "123456789012"
REGION = "us-east-1"
INSTANCE_TYPE = "g7e.2xlarge"
LAYOUT = {"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]}

# The child: import the entry point, answer one event; both timed inside the interpreter.
OURS = """
import json, sys, time
event = json.loads(sys.stdin.read())
class Context:
    function_name = "calque-api"; memory_limit_in_mb = 512; aws_request_id = "bench"
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:calque-api"
t0, c0 = time.perf_counter(), time.process_time()
from functions.api.handler import lambda_handler
t1 = time.perf_counter()
out = lambda_handler(event, Context())
t2, c2 = time.perf_counter(), time.process_time()
doc = {"import": t1 - t0, "first": t2 - t1, "cpu": c2 - c0}
doc.update(status=out["statusCode"], body=out["body"][:300])
print(json.dumps(doc))
"""
BOTO3 = """
import json, sys, time
table = sys.stdin.read().strip()
t0, c0 = time.perf_counter(), time.process_time()
import boto3
t1 = time.perf_counter()
client = boto3.client("dynamodb")
client.get_item(TableName=table, Key={"pk": {"S": "HOST#none"}, "sk": {"S": "HOST"}})
t2, c2 = time.perf_counter(), time.process_time()
print(json.dumps({"import": t1 - t0, "first": t2 - t1, "cpu": c2 - c0, "status": 200}))
"""

# --account: the same cold starts, step by step (each step timed, wall and CPU).
STEPS = """
import time as _t
res = []
for label, step in STEPS:
    a, b = _t.process_time(), _t.perf_counter()
    exec(step)
    res.append((label, _t.perf_counter() - b, _t.process_time() - a))
print(json.dumps({"import": 0, "first": 0, "cpu": 0, "status": STATUS, "steps": res}))
"""
OURS_STEPS = [
    ("the entry points' package (cold-start collector settings)", "import functions"),
    ("pydantic import", "from pydantic import BaseModel, ConfigDict, Field, TypeAdapter"),
    (
        "Powertools Logger, Metrics, event handler import",
        "from aws_lambda_powertools import Logger, Metrics\n"
        "from aws_lambda_powertools.event_handler import APIGatewayRestResolver",
    ),
    ("pydantic's first model (calque.identity)", "import calque.identity"),
    (
        "our settings, errors, sessions' contracts",
        "import calque.settings, calque.errors, calque.contracts.tenancy",
    ),
    ("our handler (Powertools routing, health, whoami)", "from functions.api.handler import lambda_handler"),
    (
        "the sessions routes (the first request includes them)",
        "from functions.api import handler, routes\n"
        "handler.include_routes(routes.modules_for('/v1/sessions'))",
    ),
    ("botocore import (our clients are botocore's)", "import botocore.session"),
    ("our domain and registry modules", "import calque.tenancy.store.dynamo, calque.tenancy.service"),
    ("DynamoDB client", "from calque import aws\naws.client('dynamodb')"),
    ("SQS client (the grant task)", "aws.client('sqs')"),
    ("the check-out (its calls, validation, domain)", "out = lambda_handler(event, Context())"),
]
BOTO3_STEPS = [
    ("boto3 import", "import boto3"),
    ("DynamoDB client", "client = boto3.client('dynamodb')"),
    ("GetItem", "client.get_item(TableName=table, Key={'pk': {'S': 'HOST#none'}, 'sk': {'S': 'HOST'}})"),
]
# The floor: what any function on this stack pays for the calls a check-out makes today, the
# same six (the stub counts them, so a check-out that makes other calls shows beside it).
FLOOR = """
import json, os, sys, time
event = json.loads(sys.stdin.read())
table, queue, endpoint = (os.environ[k] for k in ("CALQUE_TABLE_NAME", "CALQUE_HOST_TASKS_QUEUE_URL",
                                                  "CALQUE_AWS_ENDPOINT_URL"))
class Context:
    function_name = "calque-api"; memory_limit_in_mb = 512; aws_request_id = "bench"
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:calque-api"
t0, c0 = time.perf_counter(), time.process_time()
import gc
gc.set_threshold(1_000_000, 50, 100)  # the collector as our entry points set it for a cold start
from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.event_handler import APIGatewayRestResolver
from pydantic import BaseModel, ConfigDict
class Checkout(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    backend: str
    profile: str | None = None
    ttl_seconds: int | None = None
class Granted(BaseModel):
    session_id: str
app = APIGatewayRestResolver(enable_validation=True)
logger, metrics = Logger(service="floor"), Metrics(namespace="Calque", service="floor")
@app.post("/v1/sessions", status_code=201)
def checkout(body: Checkout) -> Granted:
    CLIENTS
    ddb = make("dynamodb")
    user = {"pk": {"S": "USER#none"}}
    ddb.batch_get_item(RequestItems={table: {"Keys": [{**user, "sk": {"S": "QUOTA"}},
                                                     {**user, "sk": {"S": "GROUPS"}},
                                                     {"pk": {"S": "PROFILE#none"}, "sk": {"S": "PROFILE"}}]}})
    for lo in ("a", "b"):
        ddb.query(TableName=table, IndexName="free_slices", Limit=8,
                  KeyConditionExpression="free_pk = :pk AND free_sk >= :lo",
                  ExpressionAttributeValues={":pk": {"S": "FREE#mig"}, ":lo": {"S": lo}})
    ddb.transact_write_items(TransactItems=[{"Put": {"TableName": table, "Item": {"pk": {"S": "x"}}}}])
    make("events").put_events(
        Entries=[{"Source": "floor", "DetailType": "started", "Detail": "{}"}])
    make("sqs").send_message(QueueUrl=queue, MessageBody="{}")
    metrics.add_metric(name="SessionsCheckedOut", unit="Count", value=1)
    return Granted(session_id="s-floor")
@logger.inject_lambda_context
@metrics.log_metrics
def handler(event, context):
    return app.resolve(event, context)
t1 = time.perf_counter()
out = handler(event, Context())
t2, c2 = time.perf_counter(), time.process_time()
print(json.dumps({"import": t1 - t0, "first": t2 - t1, "cpu": c2 - c0, "status": out["statusCode"]}))
"""


# How the floor makes its clients: through boto3, as most functions do, or through a botocore
# session, as calque.aws does (the same clients, without the boto3 package's imports).
FLOOR_CLIENTS = {
    "boto3": "import boto3\n    make = lambda s: boto3.client(s, endpoint_url=endpoint)",
    "botocore": "import botocore.session\n    session = botocore.session.get_session()\n"
    "    make = lambda s: session.create_client(s, endpoint_url=endpoint)",
}


def floor_script(clients: str) -> str:
    return FLOOR.replace("CLIENTS", FLOOR_CLIENTS[clients])


def steps_script(head: str, steps: list[tuple[str, str]], status: str) -> str:
    return head + f"\nSTEPS = {steps!r}\n" + STEPS.replace("STATUS", status)


class Stub:
    """An HTTP endpoint answering DynamoDB calls with recorded answers; records them from ``upstream``.

    Answers are kept by (operation, request body). A request that differs every time (a
    transaction carries new ids, placement reads from a random point) gets the largest
    answer recorded for its operation: a read that found free slices, never an empty page
    that would turn the check-out into a refusal. Replaying needs no state. Answers go out
    without Nagle's delay (TCP_NODELAY): otherwise every answer after the first on a kept
    connection waits for the client's delayed ACK (~40 ms on Linux), a latency neither
    DynamoDB nor a real network adds to each call.
    """

    def __init__(self, upstream: str) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.upstream = upstream
        self.recording = True
        self.exact: dict[tuple[str, bytes], tuple[int, bytes]] = {}
        self.by_target: dict[str, tuple[int, bytes]] = {}
        self.calls = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                target = self.headers.get("X-Amz-Target", "")
                status, answer = stub.answer(target, body, dict(self.headers.items()))
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.0")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, target: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        self.calls += 1
        if self.recording:
            import urllib.error
            import urllib.request

            request = urllib.request.Request(self.upstream, data=body, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=30) as resp:
                    status, answer = resp.status, resp.read()
            except urllib.error.HTTPError as err:
                status, answer = err.code, err.read()
            self.exact[(target, body)] = (status, answer)
            kept = self.by_target.get(target)
            if kept is None or (status < 300, len(answer)) >= (kept[0] < 300, len(kept[1])):
                self.by_target[target] = (status, answer)
            return status, answer
        return self.exact.get((target, body)) or self.by_target.get(target) or (400, b"{}")

    def stop(self) -> None:
        self.server.shutdown()


class Backend:
    """A moto server with the local plane's resources, seeded with ready hosts (every slice free)."""

    def __init__(self, hosts: int) -> None:
        from calque.local.bootstrap import create_all
        from calque.local.moto_server import MotoClients, MotoServer

        self.server = MotoServer()
        self.endpoint = self.server.start()
        self.clients = MotoClients(self.endpoint, REGION)
        self.resources = create_all(self.clients, account=ACCOUNT, region=REGION)
        self._seed(hosts)
        self.stub = Stub(self.endpoint)

    def env(self) -> dict[str, str]:
        """What a child sees: the handler's settings, the stub's endpoint, no AWS account."""
        from calque.resources import function_environment

        keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")
        env = {k: v for k, v in os.environ.items() if k in keep}
        env.update(self.resources.handler_env())
        env.update(function_environment("api"))  # as the stack sets it
        endpoint = self.stub.endpoint
        env.update(
            CALQUE_AWS_ENDPOINT_URL=endpoint,
            AWS_ENDPOINT_URL_DYNAMODB=endpoint,  # the baseline's client
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_DEFAULT_REGION=REGION,
            AWS_REGION=REGION,
            AWS_CONFIG_FILE=os.devnull,
            AWS_SHARED_CREDENTIALS_FILE=os.devnull,
            CALQUE_ADMINS="admin",
            POWERTOOLS_TRACE_DISABLED="1",
            POWERTOOLS_LOG_LEVEL="ERROR",
        )
        return env

    def _seed(self, count: int) -> None:
        from calque.catalog import planner
        from calque.contracts.layout import parse_layout
        from calque.tenancy.store.dynamo import DynamoRegistry
        from calque.tenancy.store.models import HostRecord, SliceRecord

        registry = DynamoRegistry(self.clients.client("dynamodb"), self.resources.table_name)
        planned = planner.expand_slices(INSTANCE_TYPE, parse_layout(LAYOUT))
        now = datetime.now(UTC).replace(microsecond=0)
        for n in range(count):
            iid = f"i-{n:017x}"
            host = HostRecord(
                instance_id=iid,
                instance_type=INSTANCE_TYPE,
                sharing="mig",
                state="ready",
                layout=LAYOUT,
                registered_at=now,
                registered_by="bench",
                state_since=now,
            )
            slices = [
                SliceRecord(
                    instance_id=iid,
                    slice_id=p.slice_id,
                    gpu_index=p.gpu_index,
                    backend=p.backend,
                    profile=p.profile,
                    memory_gib=p.memory_gib,
                    gpu_fraction=0.25,
                    share="1/4",
                    instance_type=INSTANCE_TYPE,
                    state="free",
                    placeable=True,
                    device_uuid=f"MIG-{n:08x}-{k}",
                    env={"CUDA_VISIBLE_DEVICES": f"MIG-{n:08x}-{k}"},
                    state_since=now,
                )
                for k, p in enumerate(planned)
            ]
            registry.create_host(host, slices)

    def stop(self) -> None:
        self.stub.stop()
        self.server.stop()


def traced_env(env: dict[str, str], task_root: Path) -> dict[str, str]:
    """The deployed function's tracing: in Lambda (``LAMBDA_TASK_ROOT``), X-Ray active (the
    runtime's trace header), so the first request builds the Tracer and patches botocore.
    Its segments go to the usual daemon address over UDP, where nothing listens; the SDK
    touches /tmp/.aws-xray/initialized, as it does in Lambda."""
    traced = {k: v for k, v in env.items() if k != "POWERTOOLS_TRACE_DISABLED"}
    traced.update(
        LAMBDA_TASK_ROOT=str(task_root),
        AWS_LAMBDA_FUNCTION_NAME="calque-api",
        _X_AMZN_TRACE_ID="Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1",
    )
    return traced


def checkout_event(user: str) -> dict[str, Any]:
    from calque.local.events import api_gateway_event
    from calque.local.state import Principal, user_arn

    who = Principal(
        profile=user,
        kind="user",
        arn=user_arn(ACCOUNT, user),
        access_key="AKIABENCH",
        secret_key="-",
        unique_id="AIDABENCH00000001",
        admin=False,
    )
    body = {"backend": "mig", "profile": "1g.24gb", "ttl_seconds": 3600}
    return api_gateway_event(
        method="POST",
        raw_path="/v1/sessions",
        headers=[("Content-Type", "application/json")],
        body=json.dumps(body).encode(),
        principal=who,
        source_ip="127.0.0.1",
        account=ACCOUNT,
    )


def bundle(into: Path, *, bytecode: bool) -> Path:
    """Our code as the deployment bundles it (infra.bundling), for this interpreter's version."""
    from infra.bundling import CopyPackages

    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    recipe = CopyPackages(
        root=REPO, packages=("calque", "functions"), python_version=version if bytecode else None
    )
    into.mkdir(parents=True)
    recipe.build(into)
    return into


def layer(into: Path, *, pruned: bool = True) -> Path:
    """The dependency layer as the stack ships it, from this interpreter's installed copies:
    the project's runtime requirements (infra.bundling.project_dependencies) and what they
    require, nothing else (no moto, CDK or test tools: a cold start scans what is on its path,
    so a development environment's hundred distributions would not be the Lambda's), compiled
    by hash for this interpreter as infra.bundling compiles the real one, its botocore data
    cut to calque.aws.SERVICES as infra.bundling.prune_botocore cuts the real one.
    ``pruned=False``: the same with botocore as it ships, boto3's baseline (the runtime's copy)."""
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement

    from calque.aws import SERVICES
    from infra.bundling import compile_bytecode, project_dependencies, prune_botocore

    todo = [Requirement(text) for text in project_dependencies(REPO / "pyproject.toml")]
    seen: set[str] = set()
    into.mkdir(parents=True)
    while todo:
        req = todo.pop()
        try:
            dist = distribution(req.name)
        except PackageNotFoundError:
            raise SystemExit(f"{req.name} is not installed: install the project first") from None
        name = dist.metadata["Name"].lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        for file in dist.files or []:
            if file.parts[0] == ".." or "__pycache__" in file.parts or file.suffix == ".pyc":
                continue
            source = Path(str(file.locate()))
            if source.is_file():
                (into / file).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, into / file)
        for text in dist.requires or []:
            sub = Requirement(text)
            wanted = req.extras | {""}
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in wanted):
                todo.append(sub)
    if pruned:
        prune_botocore(into, SERVICES)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    compile_bytecode(into, version, interpreter=sys.executable)
    return into


def run_child(script: str, stdin: str, env: dict[str, str], pythonpath: str, *extra: str) -> dict[str, Any]:
    """A fresh interpreter, isolated from the repository and the user's site, writing no bytecode (-B)."""
    done = subprocess.run(
        [
            sys.executable,
            "-I",
            "-B",
            *extra,
            "-c",
            f"import sys; sys.path[:0] = {pythonpath.split(os.pathsep)!r}\n" + script,
        ],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"a cold start failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["stderr"] = done.stderr
    return result


def heaviest(stderr: str, top: int = 15) -> list[tuple[int, str]]:
    rows = []
    for line in stderr.splitlines():
        if line.startswith("import time:") and "cumulative" not in line:
            _self_us, cumulative, name = (p.strip() for p in line.split(":", 1)[1].split("|"))
            if not name.startswith(" "):
                rows.append((int(cumulative), name.strip()))
    return sorted(rows, reverse=True)[:top]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=9, help="fresh interpreters per variant (default 9)")
    parser.add_argument("--importtime", action="store_true", help="the costliest imports of a cold start")
    parser.add_argument("--account", action="store_true", help="both cold starts step by step, and the floor")
    args = parser.parse_args()
    # bundle() loads the CDK's bundling recipe (jsii and node): quiet their end-of-life notice
    # here as app.py and the Makefile do, so `python bench/cold_import.py` prints only its table
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

    runs = args.runs + 1  # one warm-up of each, not counted
    backend = Backend(hosts=1)
    try:
        env = backend.env()
        table = backend.resources.table_name
        with tempfile.TemporaryDirectory(prefix="calque-cold-") as tmp:
            deps = str(layer(Path(tmp, "layer")))
            runtime = str(layer(Path(tmp, "runtime"), pruned=False))
            shipped = os.pathsep.join([str(bundle(Path(tmp, "bytecode"), bytecode=True)), deps])
            # name -> (sys.path, environment)
            variants = {
                "bytecode": (shipped, env),
                "sources": (os.pathsep.join([str(bundle(Path(tmp, "sources"), bytecode=False)), deps]), env),
                "bytecode, X-Ray on": (shipped, traced_env(env, Path(tmp, "bytecode"))),
            }
            # boto3's baseline runs on botocore as it ships (the Lambda runtime's copy); the
            # same again on our layer, whose botocore carries only our services' models.
            baselines = {"boto3": runtime, "boto3, pruned": deps}
            samples: dict[str, list[dict[str, Any]]] = {name: [] for name in [*baselines, *variants]}
            # Record the backend's answers once (through moto), then only replay them.
            event = json.dumps(checkout_event("cold-user"))
            for script, stdin, path in ((BOTO3, table, runtime), (OURS, event, shipped)):
                out = run_child(script, stdin, env, path)
                if out["status"] not in (200, 201):
                    raise SystemExit(f"the recorded check-out was refused: {out['status']} {out['body']}")
            backend.stub.recording = False
            for k in range(runs):
                for name in samples:
                    backend.stub.calls = 0
                    if name in baselines:
                        out = run_child(BOTO3, table, env, baselines[name])
                    else:
                        path, variant_env = variants[name]
                        out = run_child(OURS, event, variant_env, path)
                        if out["status"] != 201:
                            raise SystemExit(f"the check-out was refused: {out['status']} {out['body']}")
                    out["calls"] = backend.stub.calls
                    if k:
                        samples[name].append(out)
            if args.importtime:
                out = run_child(OURS, event, env, shipped, "-X", "importtime")
            if args.account:
                account = _account(runs, backend, event, env, table, deps, shipped, runtime)
        base = _medians(samples["boto3"])
        print(f"cold start = import + first request, median of {args.runs} fresh interpreters each")
        print("backend: moto's answers, recorded once and replayed; our code bundled as deployed")
        base_cpu = statistics.median(s["cpu"] for s in samples["boto3"])
        print(
            f"{'':<38} {'import ms':>10} {'first ms':>10} {'total ms':>10} {'x boto3':>8} "
            f"{'cpu ms':>8} {'x boto3':>8} {'calls':>6}"
        )
        rows = [("boto3 import + first GetItem", "boto3"), ("  the same, pruned botocore", "boto3, pruned")]
        rows += [(f"api check-out ({name})", name) for name in variants]
        for label, name in rows:
            imp, first, total = _medians(samples[name])
            cpu = statistics.median(s["cpu"] for s in samples[name])
            calls = max(s["calls"] for s in samples[name])
            print(
                f"{label:<38} {imp * 1000:>10.1f} {first * 1000:>10.1f} {total * 1000:>10.1f} "
                f"{total / base[2]:>8.2f} {cpu * 1000:>8.1f} {cpu / base_cpu:>8.2f} {calls:>6}"
            )
        ratio = _medians(samples["bytecode"])[2] / base[2]
        traced = _medians(samples["bytecode, X-Ray on"])[2] / base[2]
        same = _medians(samples["bytecode"])[2] / _medians(samples["boto3, pruned"])[2]
        from infra.constants import LAMBDA_PYTHON_VERSION

        here = f"{sys.version_info.major}.{sys.version_info.minor}"
        print(
            f"\nPython {here}"
            + (
                " (the Lambda's)"
                if here == LAMBDA_PYTHON_VERSION
                else f"; the Lambda runs {LAMBDA_PYTHON_VERSION}: run this under it for the deployed figures"
            )
        )
        print(
            f"shipped bundle: {ratio:.2f}x boto3's cold start (target <= {TARGET}x): "
            + ("ok" if ratio <= TARGET else "OVER")
            + f"; with X-Ray tracing on, as the stack deploys it: {traced:.2f}x, "
            + ("ok" if traced <= TARGET else "OVER")
            + f"; {same:.2f}x boto3's on the same pruned botocore (what our own code and libraries "
            "cost beside it)"
        )
        if args.account:
            _print_account(account, args.runs)
        if args.importtime:
            print("\ncostliest imports of one cold start (bytecode bundle, cumulative ms):")
            for us, name in heaviest(out["stderr"]):
                print(f"  {us / 1000:>8.1f}  {name}")
        return 0
    finally:
        backend.stop()


def _account(
    runs: int,
    backend: Backend,
    event: str,
    env: dict[str, str],
    table: str,
    deps: str,
    shipped: str,
    runtime: str,
) -> dict[str, list[dict[str, Any]]]:
    head = OURS.split("t0, c0 =")[0]
    children = {
        "boto3": (
            steps_script("import json, sys\ntable = sys.stdin.read().strip()", BOTO3_STEPS, "200"),
            table,
            runtime,
        ),
        "ours": (steps_script(head, OURS_STEPS, 'out["statusCode"]'), event, shipped),
        "floor": (floor_script("botocore"), event, deps),
        "floor, boto3 clients": (floor_script("boto3"), event, deps),
    }
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in children}
    for k in range(runs):
        for name, (script, stdin, path) in children.items():
            backend.stub.calls = 0
            out = run_child(script, stdin, env, path)
            if out["status"] not in (200, 201):
                raise SystemExit(f"{name}: answered {out['status']}")
            out["calls"] = backend.stub.calls
            if k:
                samples[name].append(out)
    return samples


def _print_account(account: dict[str, list[dict[str, Any]]], runs: int) -> None:
    for name, title in (("ours", "api check-out (bytecode)"), ("boto3", "boto3 import + first GetItem")):
        rows = [s["steps"] for s in account[name]]
        print(f"\n{title}, step by step (median of {runs} each){'wall ms':>12} {'cpu ms':>8}")
        for i, (label, _, _) in enumerate(rows[0]):
            wall = statistics.median(r[i][1] for r in rows)
            cpu = statistics.median(r[i][2] for r in rows)
            print(f"  {label:<58} {wall * 1000:>8.1f} {cpu * 1000:>8.1f}")
        wall = statistics.median(sum(x[1] for x in r) for r in rows)
        cpu = statistics.median(sum(x[2] for x in r) for r in rows)
        print(f"  {'total':<58} {wall * 1000:>8.1f} {cpu * 1000:>8.1f}")
    steps = [s["steps"] for s in account["boto3"]]
    base_wall = statistics.median(sum(x[1] for x in r) for r in steps)
    base_cpu = statistics.median(sum(x[2] for x in r) for r in steps)
    ours = max(s["calls"] for s in account["ours"])
    for name, how in (("floor", "botocore's clients, as ours"), ("floor, boto3 clients", "boto3's clients")):
        wall = _medians(account[name])[2]
        cpu = statistics.median(s["cpu"] for s in account[name])
        calls = max(s["calls"] for s in account[name])
        print(
            f"\nthe floor ({how}): a bare Powertools resolver (validation, Logger, Metrics) on our "
            "layer, making "
            f"{calls} calls (the check-out: {ours}), no calque code:\n"
            f"  {wall * 1000:.1f} ms wall, {wall / base_wall:.2f}x boto3's (same runs); "
            f"{cpu * 1000:.1f} ms cpu, {cpu / base_cpu:.2f}x"
        )


def _medians(samples: list[dict[str, Any]]) -> tuple[float, float, float]:
    imp = statistics.median(s["import"] for s in samples)
    first = statistics.median(s["first"] for s in samples)
    total = statistics.median(s["import"] + s["first"] for s in samples)
    return imp, first, total


if __name__ == "__main__":
    sys.exit(main())

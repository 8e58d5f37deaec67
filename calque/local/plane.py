"""The embedded local control plane: the deployed handlers over local stand-ins.

moto (DynamoDB made atomic, SQS, S3, EC2, SSM) in-process; resources created from
calque.resources; an HTTP front verifying SigV4 and invoking the API function;
pollers feeding queue consumers; timers firing schedules; an SSM executor running
the host agent on simulated hosts. Environment knobs (local only):

    CALQUE_LOCAL_SCHEDULE_SCALE   multiply every schedule's period (0.01: a 60 s rate fires every 0.6 s)
    CALQUE_LOCAL_API_CONCURRENCY  API execution environments that may run at once (default: 4 per CPU,
                                  at least 8, at most 32, started only as concurrent requests need
                                  them; 1: in-process)
    CALQUE_LOCAL_QUEUE_SCALE      multiply every queue's visibility timeout (failed messages return sooner)
    CALQUE_LOCAL_HOST_AGENT       the command that runs the host agent (default: python -m host_agent)
    CALQUE_LOCAL_SCHEDULE_RATES   per-schedule periods in seconds, e.g. reconciler=10,reaper=5
                                  (``calque local up --reconcile-every 10s``); overrides the scale
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import shlex
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from calque import resources
from calque.errors import InvalidInput
from calque.local.state import ACCOUNT_ID, REGION, Principal, StateDir

log = logging.getLogger("calque.local")

DEFAULT_PORT = 8787


def _count(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidInput(f"{name} must be a whole number, got {raw!r}") from None
    if value < 1:
        raise InvalidInput(f"{name} must be at least 1, got {raw!r}")
    return value


def _scale(name: str) -> float:
    raw = os.environ.get(name)
    if not raw:
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        raise InvalidInput(f"{name} must be a number, got {raw!r}") from None
    if value <= 0:
        raise InvalidInput(f"{name} must be greater than zero, got {raw!r}")
    return value


def default_api_concurrency() -> int:
    """Enough execution environments that concurrent requests really run at once and race at
    DynamoDB (each one is a process, started only when a request finds the others busy), and
    few enough that the machine keeps up: 4 per CPU, at least 8, at most 32."""
    return min(32, max(8, 4 * (os.cpu_count() or 1)))


class LocalPlane:
    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        port: int = DEFAULT_PORT,
        host: str = "127.0.0.1",
        region: str = REGION,
        account: str = ACCOUNT_ID,
        any_port_if_taken: bool = False,
    ):
        self.state = StateDir(Path(state_dir))
        self.port = port
        self.any_port_if_taken = any_port_if_taken  # port taken at bind: a free one (local up, no --port)
        self.host = host
        self.region = region
        self.account = account
        self.schedule_scale = _scale("CALQUE_LOCAL_SCHEDULE_SCALE")
        self.queue_scale = _scale("CALQUE_LOCAL_QUEUE_SCALE")
        # How many API execution environments may run at once (Lambda's concurrency).
        self.api_concurrency = _count("CALQUE_LOCAL_API_CONCURRENCY", default=default_api_concurrency())
        agent = os.environ.get("CALQUE_LOCAL_HOST_AGENT")
        self.agent_argv = shlex.split(agent) if agent else None
        self._lock_handle: Any = None
        self._admins: tuple[str, ...] | None = None
        self._admins_lock = threading.Lock()
        self.moto: Any = None
        self.front: Any = None
        self.functions: Any = None
        self.executor: Any = None
        self.pollers: list[Any] = []
        self.timers: dict[str, Any] = {}
        self.warnings: list[str] = []
        self.resources: Any = None
        self.persistence: Any = None
        self.restored: Any = None  # what came back from the state directory (persistence.Restored)
        self.schedule_rates = _rates("CALQUE_LOCAL_SCHEDULE_RATES")
        self.fleet: Any = None  # calque.local.fleet.FleetSimulator

    # lifecycle
    def start(self) -> None:
        from calque.local.bootstrap import create_all
        from calque.local.front import Front
        from calque.local.functions import Functions
        from calque.local.host_scope import HostScope
        from calque.local.moto_server import CommandRecords, MotoClients, MotoServer
        from calque.local.persistence import Persistence
        from calque.local.ssm_executor import DEFAULT_AGENT, SsmExecutor

        self._lock_handle = self.state.acquire_plane_lock()
        try:
            self.state.remove_stale_temps()
            self.state.initialize_people(self.account)
            # moto on the loopback interface only, for the plane's own key pair only
            moto_credentials = self.state.plane_credentials()
            self.persistence = Persistence(self.state.aws_dir, account=self.account, region=self.region)
            self.moto = MotoServer(
                host="127.0.0.1",
                on_send_command=self._on_send_command,
                credentials=moto_credentials,
                region=self.region,
                persistence=self.persistence,
                hosts=self.state.principal_for_key,  # pool workers sign as their instance
            )
            moto_endpoint = self.moto.start()
            self._set_aws_env(moto_endpoint, moto_credentials)
            clients = MotoClients(moto_endpoint, self.region, moto_credentials)
            self.resources = create_all(
                clients, account=self.account, region=self.region, visibility_scale=self.queue_scale
            )
            # a simulated host's role reaches its own pool's queue and objects only
            self.moto.app.host_scope = HostScope(
                bucket=self.resources.bucket_name, queue_prefix=resources.POOL_QUEUE_PREFIX_LOCAL
            )
            # what the previous run held comes back before anything is served
            self.restored, instance_ids = self.persistence.restore(clients)
            self.state.forget_instances(keep=instance_ids)
            self.warnings += self.restored.problems
            if self.restored.dropped_records:
                self.warnings.append(
                    f"{self.restored.dropped_records} DynamoDB write(s) in flight when the plane last "
                    "stopped never completed; their callers got no answer"
                )
            self.functions = Functions(self.account, self.region, concurrency={"api": self.api_concurrency})
            self.front = Front(
                self.state,
                account=self.account,
                region=self.region,
                api=lambda event: self.functions.invoke("api", event),
                local_routes=self._local_route,
                before_request=self._sync_admins,
                host=self.host,
                port=self.port,
                any_port_if_taken=self.any_port_if_taken,
            )
            endpoint = self.front.bind()
            os.environ.update(self.resources.handler_env())
            os.environ.update(self._pool_env())
            os.environ[resources.ENV_API_ENDPOINT] = endpoint
            self._start_fleet(clients)
            self._clear_caches()
            self._sync_admins()
            self.functions.handler("api")  # import the API now: a broken one fails here, not per request
            self.functions.warm("api")
            self.executor = SsmExecutor(
                self.state,
                document_name=self.resources.ssm_document_name,
                report_to=endpoint,
                region=self.region,
                agent_argv=self.agent_argv or DEFAULT_AGENT,
                ec2=clients.client("ec2"),
                records=CommandRecords(self.account, self.region, on_change=self.persistence.ssm_changed),
            )
            for command_id, instance_id, params in self.restored.resumed_commands:
                self.executor.resume(command_id, instance_id, params)  # cut short by the last stop
            self._start_pollers(clients)
            self._start_timers()
            self.front.start()
            self.state.write_plane(
                {
                    "endpoint": endpoint,
                    "moto_endpoint": moto_endpoint,
                    "account": self.account,
                    "region": self.region,
                    "pid": os.getpid(),
                    "state_dir": str(self.state.path),
                    "started_at": dt.datetime.now(dt.UTC).isoformat(),
                    "restored": self.restored.as_json(),
                    **self.resources.as_json(),
                }
            )
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for timer in self.timers.values():
            timer.stop()
        if self.fleet is not None:
            self.fleet.stop()
        for poller in self.pollers:
            poller.stop()
        if self.executor is not None:
            self.executor.stop()
        if self._lock_handle is not None:  # warm pools: the worker processes this plane started
            from calque.local.pool_hosts import stop_all

            stop_all(self.state)
        if self.front is not None:
            self.front.stop()
        if self.functions is not None:
            self.functions.close()
        if self.persistence is not None and self.moto is not None and self.moto.app is not None:
            with self.moto.app.dynamodb_lock:  # nothing writes now: compact into the snapshot
                self.persistence.close()
        if self.moto is not None:
            self.moto.stop()
        if self._lock_handle is not None:
            self.state.clear_plane()
            self._lock_handle.close()
            self._lock_handle = None

    # wiring
    def _set_aws_env(self, moto_endpoint: str, credentials: tuple[str, str] | None) -> None:
        """The handlers' boto3 clients talk to moto, with the plane's key pair, never to AWS."""
        key, secret = credentials or ("testing", "testing")
        for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
            os.environ.pop(var, None)
        os.environ.update(
            {
                "CALQUE_AWS_ENDPOINT_URL": moto_endpoint,
                "AWS_ACCESS_KEY_ID": key,
                "AWS_SECRET_ACCESS_KEY": secret,
                "AWS_DEFAULT_REGION": self.region,
                "AWS_REGION": self.region,
                "AWS_CONFIG_FILE": os.devnull,
                "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            }
        )
        os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "1")
        os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "1")
        os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
        os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "Calque")
        self._clear_caches()

    def _pool_env(self) -> dict[str, str]:
        """Warm pools on the local plane: workers on simulated hosts (calque/local/pool_hosts.py)."""
        import math

        # Short on the local plane (10 s, scaled): a stopped worker's claim comes back in seconds.
        scaled = str(max(3, math.ceil(10 * self.queue_scale)))
        visibility = os.environ.get("CALQUE_POOL_VISIBILITY_S") or scaled
        return {
            resources.ENV_ARTIFACT_BUCKET: self.resources.bucket_name,
            resources.ENV_POOL_QUEUE_PREFIX: resources.POOL_QUEUE_PREFIX_LOCAL,
            # a pool's instances come from the fleet, behind its budget, as every other instance
            resources.ENV_POOL_CAPACITY: "fleet",
            "CALQUE_POOL_WORKER_POLL_S": os.environ.get("CALQUE_LOCAL_WORKER_POLL_S") or "2",
            "CALQUE_POOL_VISIBILITY_S": visibility,
            "CALQUE_LOCAL_STATE_DIR": str(self.state.path),
        }

    def _clear_caches(self) -> None:
        from calque import aws, settings

        settings.clear_caches()
        aws.clear_caches()

    def _sync_admins(self) -> None:
        """Admins come from the state directory (``local user add --admin`` changes it)."""
        admins = tuple(self.state.admins())
        if admins != self._admins:
            with self._admins_lock:
                os.environ[resources.ENV_ADMINS] = ",".join(admins)
                from calque import settings

                settings.clear_caches()
                self._admins = admins

    def _on_send_command(self, request: dict[str, Any], response: dict[str, Any]) -> None:
        if self.executor is not None:
            self.executor.on_send_command(request, response)

    def _invoker(self, function_id: str) -> Callable[[dict[str, Any]], Any]:
        return lambda event: self.functions.invoke(function_id, event)

    def _start_pollers(self, clients: Any) -> None:
        from calque.local.handlers import FunctionNotAvailable
        from calque.local.pollers import QueuePoller

        for q in resources.QUEUES:
            try:
                self.functions.handler(q.consumer)
            except FunctionNotAvailable as exc:
                self.warnings.append(f"queue {q.id} is not polled: {exc}")
                continue
            poller = QueuePoller(
                clients.client("sqs"),
                name=q.id,
                queue_url=self.resources.queue_urls[q.id],
                queue_arn=self.resources.queue_arns[q.id],
                region=self.region,
                consumer=self._invoker(q.consumer),
                batch_size=q.batch_size,
            )
            poller.start()
            self.pollers.append(poller)

    def _start_timers(self) -> None:
        from calque.local.handlers import FunctionNotAvailable
        from calque.local.timers import ScheduleTimer

        for s in resources.SCHEDULES:
            try:
                self.functions.handler(s.target)
            except FunctionNotAvailable as exc:
                self.warnings.append(f"schedule {s.id} does not fire: {exc}")
                continue
            override = self.schedule_rates.get(s.id)
            timer = ScheduleTimer(
                name=s.id,
                rate_s=override if override is not None else s.rate_s,
                rule_arn=self.resources.schedule_rule_arns[s.id],
                account=self.account,
                region=self.region,
                scale=1.0 if override is not None else self.schedule_scale,
                target=self._invoker(s.target),
            )
            timer.start()
            self.timers[s.id] = timer

    def _local_route(self, method: str, path: str, principal: Principal, body: bytes) -> tuple[int, Any]:
        parts = path.strip("/").split("/")
        if (
            method == "POST"
            and len(parts) == 3
            and parts[:2] == ["local", "inject"]
            and self.fleet is not None
        ):
            return self._inject(parts[2], principal, body)
        if (
            method == "POST"
            and len(parts) == 4
            and parts[:2] == ["local", "schedules"]
            and parts[3] == "fire"
        ):
            if not principal.admin:
                return 403, {
                    "error": {
                        "code": "forbidden",
                        "message": "firing a schedule is for admins only",
                        "details": {"principal": principal.profile},
                    }
                }
            timer = self.timers.get(parts[2])
            if timer is None:
                return 404, {
                    "error": {
                        "code": "not_found",
                        "message": f"no schedule {parts[2]!r} runs here",
                        "details": {"schedules": sorted(self.timers)},
                    }
                }
            try:
                result = timer.fire_now()
            except Exception as exc:
                log.exception("schedule %s failed", parts[2])
                return 500, {
                    "error": {
                        "code": "schedule_failed",
                        "message": f"{type(exc).__name__}: {exc}",
                        "details": {},
                    }
                }
            return 200, {"schedule": parts[2], "fired": timer.fired, "result": result}
        return 404, {
            "error": {"code": "route_not_found", "message": f"no local route {method} {path}", "details": {}}
        }

    def profiles_summary(self) -> list[dict[str, Any]]:
        return [{"profile": p.profile, "admin": p.admin, "arn": p.arn} for p in self.state.people()]

    # the fleet's stand-ins (calque/local/fleet.py)
    def _start_fleet(self, clients: Any) -> None:
        from calque.local.bootstrap import PREFIX
        from calque.local.fleet import FleetSimulator, fleet_environment

        ec2 = clients.client("ec2")
        os.environ.update(fleet_environment(ec2, launch_template=f"{PREFIX}-hosts"))
        self.fleet = FleetSimulator(
            self.state,
            account=self.account,
            region=self.region,
            host_role=self.resources.host_role_name,
            deliver=self._invoker("fleet_events"),
            schedule_scale=self.schedule_scale,
        )
        self.fleet.ec2 = ec2
        self.moto.app.interceptor = self.fleet.intercept
        self.fleet.resume_notices()  # spot instances warned before the last stop end all the same

    def _inject(self, kind: str, principal: Principal, body: bytes) -> tuple[int, Any]:
        import json

        if not principal.admin:
            return 403, {
                "error": {
                    "code": "forbidden",
                    "message": "fault injection is for admins only",
                    "details": {"principal": principal.profile},
                }
            }
        try:
            doc = json.loads(body or b"{}")
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            return 400, {
                "error": {"code": "invalid_body", "message": "the body must be a JSON object", "details": {}}
            }
        status, out = self.fleet.inject(kind, doc)
        return status, {**out, "faults": self.fleet.faults()} if status == 200 else out


def _rates(name: str) -> dict[str, float]:
    """``reconciler=10,reaper=5`` -> periods in seconds per schedule id."""
    raw = os.environ.get(name) or ""
    out: dict[str, float] = {}
    for item in (i.strip() for i in raw.split(",") if i.strip()):
        sid, _, value = item.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            raise InvalidInput(f"{name}: {item!r} is not SCHEDULE=SECONDS") from None
        if seconds <= 0:
            raise InvalidInput(f"{name}: the period of {sid} must be greater than zero")
        out[sid.strip()] = seconds
    return out

"""The ``worker`` verb: start, stop and list a warm pool's workers on this host.

    python -m host_agent [--simulate T --state F] --instance-id I --report-to URL \\
        worker start --worker FILE [--spec LAYOUT] [--workers-dir DIR]
    python -m host_agent ... worker stop --pool NAME
    python -m host_agent ... worker status [--pool NAME]

The control plane sends ``start`` through the host-agent SSM document once the fleet has
handed the pool a running instance. ``--worker`` is the pool's worker document (JSON):

    {"pool": "p1", "queue_url": "...", "runner": "module:Class",
     "package": {"bucket": "...", "key": "pools/p1/package/<sha256>.zip"},
     "worker_ids": ["w-1a2b3c4d-0", ...], "visibility_s": 60, "idle_timeout_s": 1800,
     "poll_wait_s": 20, "credentials": "control_plane"}

``credentials`` (optional): ``control_plane`` where the deployment vends pool workers their own
credentials (the instance role reaches no pool's queue or objects): each worker, and the
package download, then asks the API for credentials of its pool alone, signed with the
instance role as reports are (host_agent/worker/credentials.py). Absent: the host's own.

``start`` applies the pool's layout first when one is given (the same converge as
``apply``), reads this host's slices as the agent sees them (one per GPU without a layout;
one per MIG instance or MPS slot with one) and puts them in slot order, the order of the
control plane's planner: by GPU, then by MIG profile, then by the slice's ordinal. It
takes 1..N worker ids for N slices (the scaler never starts more workers than the pool's
--max-workers, so the last instance of a pool may run fewer workers than slices): each
id's slot suffix names its slice (``w-<hex>-<k>``: the k-th slice; a bare ``w-<hex>`` is
slot 0 of a one-slot host), and a slot out of range, two ids for one slot or an id without
a slot on a host of several slices is refused, naming the id, before anything starts.
Slices no id names are left untouched. It downloads the runner package from the artifact
bucket with the instance's own role (no internet: S3 only), unpacks it once per package
key, and starts one ``python -m host_agent.worker`` per id, bound to its slice by the
slice's own environment (``CUDA_VISIBLE_DEVICES=MIG-<uuid>`` for a MIG slice, the GPU's
uuid and MPS pipe for an MPS slot). Each worker is a supervised process that outlives the
SSM command: a transient systemd unit (``systemd-run``, restarted when it fails) on a host
with systemd, else a detached process in its own session. Each worker's pid, instance, slice and binding are
kept in ``<workers dir>/<pool>/<worker id>.json``, its log beside it.

Python 3.9+, standard library and botocore only (the host agent's bundle).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from calque.errors import InvalidInput

DEFAULT_WORKERS_DIR = "/var/lib/calque/pools"
CONTROL_PLANE = "control_plane"  # WorkerDoc.credentials: the control plane vends them
ACTIONS = ("start", "stop", "status")
_NAME = re.compile(r"^[a-z][a-z0-9-]{1,38}[a-z0-9]$")
_WORKER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_RUNNER = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
# worker ids as the scaler names them: "w-<hex>-<slot>", or "w-<hex>" alone on a one-slot
# instance (calque.accounting.claims.worker_slot reads them the same way)
_SLOT = re.compile(r"^w-[0-9a-f]+-(\d+)$")
_ORDINAL = re.compile(r"-(\d+)$")


@dataclass
class WorkerDoc:
    """What ``worker start`` is told (the ``worker`` parameter of the SSM document)."""

    pool: str
    queue_url: str
    runner: str
    worker_ids: list[str]
    package: dict[str, str] | None = None  # {"bucket", "key"}: staged in the artifact bucket
    package_path: str | None = None  # a directory on this machine (tests)
    visibility_s: int = 60
    idle_timeout_s: int = 1800
    poll_wait_s: int = 20
    credentials: str | None = None  # "control_plane": workers fetch their pool's own credentials
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> WorkerDoc:
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise InvalidInput(f"worker: not a JSON document: {exc}", details={"field": "worker"}) from None
        if not isinstance(raw, dict):
            raise InvalidInput("worker: must be a JSON object", details={"field": "worker"})
        known = {"pool", "queue_url", "runner", "worker_ids", "package", "package_path"}
        known |= {"visibility_s", "idle_timeout_s", "poll_wait_s", "credentials"}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise InvalidInput(f"worker: unknown field {unknown[0]!r}", details={"field": unknown[0]})
        for name in ("pool", "queue_url", "runner", "worker_ids"):
            if name not in raw:
                raise InvalidInput(f"worker: {name} is required", details={"field": name})
        if not isinstance(raw["pool"], str) or not _NAME.match(raw["pool"]):
            raise InvalidInput(f"worker: pool {raw['pool']!r} is not a pool name", details={"field": "pool"})
        if not isinstance(raw["runner"], str) or not _RUNNER.match(raw["runner"]):
            raise InvalidInput("worker: runner must be MODULE:CLASS", details={"field": "runner"})
        ids = raw["worker_ids"]
        if (
            not isinstance(ids, list)
            or not ids
            or not all(isinstance(i, str) and _WORKER_ID.match(i) for i in ids)
        ):
            raise InvalidInput(
                "worker: worker_ids must be a non-empty list of worker ids", details={"field": "worker_ids"}
            )
        if len(set(ids)) != len(ids):
            raise InvalidInput("worker: worker_ids repeat an id", details={"field": "worker_ids"})
        package = raw.get("package")
        if package is not None and not (
            isinstance(package, dict)
            and set(package) == {"bucket", "key"}
            and all(isinstance(v, str) and v for v in package.values())
        ):
            raise InvalidInput(
                'worker: package must be {"bucket": ..., "key": ...}', details={"field": "package"}
            )
        if package is None and not raw.get("package_path"):
            raise InvalidInput("worker: package (or package_path) is required", details={"field": "package"})
        for name in ("visibility_s", "idle_timeout_s", "poll_wait_s"):
            if name in raw and (
                not isinstance(raw[name], int) or isinstance(raw[name], bool) or raw[name] < 1
            ):
                raise InvalidInput(f"worker: {name} must be a positive integer", details={"field": name})
        if raw.get("credentials") not in (None, CONTROL_PLANE):
            raise InvalidInput(
                f"worker: credentials must be {CONTROL_PLANE!r} when given", details={"field": "credentials"}
            )
        return cls(
            pool=raw["pool"],
            queue_url=str(raw["queue_url"]),
            runner=raw["runner"],
            worker_ids=list(ids),
            package=dict(package) if package else None,
            package_path=raw.get("package_path"),
            visibility_s=int(raw.get("visibility_s", 60)),
            idle_timeout_s=int(raw.get("idle_timeout_s", 1800)),
            poll_wait_s=int(raw.get("poll_wait_s", 20)),
            credentials=raw.get("credentials"),
        )


def read_doc(value: str) -> WorkerDoc:
    """A file, ``-`` for stdin, or the document inline (as an SSM parameter carries it)."""
    if value == "-":
        return WorkerDoc.parse(sys.stdin.read())
    if value.lstrip().startswith("{"):
        return WorkerDoc.parse(value)
    return WorkerDoc.parse(Path(value).read_text())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:  # our own child that already ended: reap it
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


def stage_package(
    doc: WorkerDoc, pool_dir: Path, s3: Any | None = None, credentials: Callable[[], Any] | None = None
) -> str:
    """The runner package as a directory on this host: downloaded from the artifact bucket
    with the instance role (or, ``credentials`` given, with what it makes: the pool's own
    credentials) and unpacked once per key (the key names its content's hash)."""
    if doc.package is None:
        assert doc.package_path is not None
        if not Path(doc.package_path).is_dir():
            raise InvalidInput(
                f"worker: package_path {doc.package_path} is not a directory",
                details={"field": "package_path"},
            )
        return doc.package_path
    key = doc.package["key"]
    target = pool_dir / "package" / re.sub(r"[^A-Za-z0-9._-]", "_", key)
    if (target / ".complete").exists():
        return str(target)
    client: Any = s3
    if client is None:  # botocore alone: the host agent's bundle carries no boto3
        import botocore.session

        region = os.environ.get("AWS_SSM_REGION_NAME") or os.environ.get("AWS_REGION") or None
        session = botocore.session.get_session()
        if credentials is not None:
            from host_agent.worker.credentials import use_credentials

            session = use_credentials(session, credentials())
        client = session.create_client(
            "s3", region_name=region, endpoint_url=os.environ.get("CALQUE_AWS_ENDPOINT_URL") or None
        )
    # Each staging works in a directory of its own, renamed into place when complete: two
    # starts of the same pool at once (two commands, or simulated hosts sharing a disk) never
    # write into each other's files, and the one that finishes second keeps the first's copy.
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=target.name + ".partial-", dir=target.parent))
    archive = partial / "package.zip"
    try:
        body = client.get_object(Bucket=doc.package["bucket"], Key=key)["Body"]
        with open(archive, "wb") as out:
            for chunk in iter(lambda: body.read(1 << 20), b""):
                out.write(chunk)
    except Exception as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise InvalidInput(
            f"worker: cannot download the runner package s3://{doc.package['bucket']}/{key}: {exc}",
            code="package_unavailable",
            details={"field": "package"},
        ) from None
    root = partial / "src"
    with zipfile.ZipFile(archive) as zf:
        for name in zf.namelist():  # never outside the package's own directory
            if name.startswith("/") or ".." in Path(name).parts:
                shutil.rmtree(partial, ignore_errors=True)
                raise InvalidInput(
                    f"worker: the package holds an unsafe path {name!r}", details={"field": "package"}
                )
        zf.extractall(root)
    archive.unlink()
    (partial / ".complete").write_text(key)
    try:
        partial.rename(target)  # fails while a non-empty directory is there
    except OSError:
        if (target / ".complete").exists():  # another start put its copy in place: keep that one
            shutil.rmtree(partial, ignore_errors=True)
            return str(target)
        # an incomplete one, left by an earlier version's staging that died mid-way (a copy
        # staged here is only ever renamed into place complete, so none is removed in use)
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
    return str(target)


def _src(staged: str) -> str:
    src = Path(staged) / "src"
    return str(src) if src.is_dir() else staged


class Launcher:
    """How a worker is started so it outlives the SSM command that started it."""

    def __init__(self, use_systemd: bool | None = None, which: Callable[[str], str | None] = shutil.which):
        if use_systemd is None:
            use_systemd = which("systemd-run") is not None and hasattr(os, "geteuid") and os.geteuid() == 0
        self.use_systemd = use_systemd

    def start(
        self, unit: str, argv: list[str], env: dict[str, str], log: Path, cwd: Path, jail: Any = None
    ) -> dict[str, Any]:
        """``jail`` (host_agent.worker_jail.WorkerJail, on a real host): the pool's account and
        the slice's confinement the worker runs under. The log is root's alone (0600), as each
        claim's own output is: what a runner prints is its members' data, not the host's."""
        fd = os.open(str(log), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)  # a log an earlier version left readable by all
        if self.use_systemd:
            os.close(fd)
            # a unit of this name that ended in failure and is still loaded would refuse the
            # name (the slot's earlier worker); forgetting it is harmless when there is none
            subprocess.run(["systemctl", "reset-failed", unit], capture_output=True, check=False)
            cmd = ["systemd-run", "--unit", unit, "--collect", "--property=Restart=on-failure",
                   "--property=RestartSec=5", f"--property=StandardOutput=append:{log}",
                   f"--property=StandardError=append:{log}", f"--working-directory={cwd}"]  # fmt: skip
            cmd += jail.systemd_properties() if jail is not None else []
            cmd += [f"--setenv={k}={v}" for k, v in sorted(env.items())]
            subprocess.run([*cmd, *argv], check=True, capture_output=True, text=True)
            out = subprocess.run(
                ["systemctl", "show", "--property=MainPID", "--value", unit],
                capture_output=True,
                text=True,
                check=False,
            )
            return {"unit": unit, "pid": int(out.stdout.strip() or 0)}
        with os.fdopen(fd, "ab") as fh:
            proc = subprocess.Popen(
                argv, env=env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=str(cwd), start_new_session=True, close_fds=True,
                preexec_fn=jail.preexec if jail is not None else None,
            )  # fmt: skip
        return {"pid": proc.pid}

    def running(self, info: dict[str, Any]) -> bool:
        """Whether the worker a record names still runs: its unit is loaded and not ended (a
        unit restarting after a failure still runs), else its process is alive. A worker that
        exited leaves a record behind; its slot may be given a worker again."""
        if info.get("unit"):
            out = subprocess.run(
                ["systemctl", "show", "--property=ActiveState", "--value", str(info["unit"])],
                capture_output=True,
                text=True,
                check=False,
            )
            return out.stdout.strip() not in ("", "inactive", "failed")
        return _alive(int(info.get("pid") or 0))

    def stop(self, info: dict[str, Any]) -> None:
        if info.get("unit"):
            subprocess.run(["systemctl", "stop", str(info["unit"])], capture_output=True, check=False)
            return
        pid = int(info.get("pid") or 0)
        if pid and _alive(pid):
            os.kill(pid, signal.SIGTERM)  # the worker finishes a claim in hand, then exits


def worker_env(
    slice_env: dict[str, str], slice_id: str, base: dict[str, str] | None = None
) -> dict[str, str]:
    """The worker's environment: the agent's own (its credentials chain, its PYTHONPATH) and
    the slice's binding, which decides which GPU or MIG device the runner sees."""
    env = dict(os.environ if base is None else base)
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        env.pop(name, None)
    env.update(slice_env)
    env["CALQUE_SLICE_ID"] = slice_id
    region = env.get("AWS_SSM_REGION_NAME")
    if region:  # what SSM Agent exports; boto3 reads AWS_REGION
        env.setdefault("AWS_REGION", region)
        env.setdefault("AWS_DEFAULT_REGION", region)
    agent_path = str(Path(__file__).resolve().parent.parent)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if agent_path not in paths:
        paths.insert(0, agent_path)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def slot_order(slices: list[Any]) -> list[Any]:
    """The slices in slot order, as the control plane's planner lists them
    (calque.catalog.planner.expand_slices): by GPU, then MIG profile, then the ordinal that
    ends the slice id (``g0-1g.24gb-2``, ``g1-mps-10``), counted as a number."""

    def key(sl: Any) -> tuple[int, str, int, str]:
        m = _ORDINAL.search(sl.slice_id)
        profile = sl.profile if sl.backend == "mig" else ""
        return (int(sl.gpu_index), profile, int(m.group(1)) if m else 0, sl.slice_id)

    return sorted(slices, key=key)


def bind_slots(doc: WorkerDoc, slices: list[Any]) -> list[tuple[str, Any]]:
    """(worker id, slice) for each id of the document, in slot order; refuses, naming the id,
    a slot this host does not have, two ids for one slot, or an id without a slot on a host
    of several slices. Nothing has started when it refuses."""
    ordered = slot_order(slices)
    names = [s.slice_id for s in ordered]
    if len(doc.worker_ids) > len(ordered):
        raise InvalidInput(
            f"worker: pool {doc.pool} asked for {len(doc.worker_ids)} worker(s) but this host has "
            f"{len(ordered)} slice(s) ({', '.join(names) or 'none'})",
            code="slices_mismatch",
            details={"workers": len(doc.worker_ids), "slices": names},
        )
    taken: dict[int, str] = {}
    for worker_id in doc.worker_ids:
        m = _SLOT.match(worker_id)
        if m is None and len(ordered) != 1:
            raise InvalidInput(
                f"worker: worker id {worker_id} names no slot (w-<hex>-<slot>) but this host has "
                f"{len(ordered)} slices",
                code="slices_mismatch",
                details={"worker_id": worker_id, "slices": names},
            )
        slot = int(m.group(1)) if m else 0
        if slot >= len(ordered):
            raise InvalidInput(
                f"worker: worker id {worker_id} names slot {slot} but this host has {len(ordered)} "
                f"slice(s) (slots 0..{len(ordered) - 1})",
                code="slices_mismatch",
                details={"worker_id": worker_id, "slot": slot, "slices": names},
            )
        if slot in taken:
            raise InvalidInput(
                f"worker: worker id {worker_id} names slot {slot}, already named by {taken[slot]}",
                details={"worker_id": worker_id, "slot": slot, "field": "worker_ids"},
            )
        taken[slot] = worker_id
    return [(taken[k], ordered[k]) for k in sorted(taken)]


def start(
    doc: WorkerDoc,
    slices: list[Any],
    *,
    instance_id: str,
    report_to: str,
    workers_dir: Path,
    launcher: Launcher,
    s3: Any | None = None,
    python: str = sys.executable,
    jails: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Start one worker per id, each on the slice its slot names (``slices``: the agent's
    SliceReports); the slices no id names are left as they are. ``jails`` (a real host's,
    by slice id): the account and confinement each worker runs under."""
    pairs = bind_slots(doc, slices)
    pool_dir = workers_dir / doc.pool
    pool_dir.mkdir(parents=True, exist_ok=True)
    vended = None
    if doc.credentials == CONTROL_PLANE:
        # the instance role reaches no pool's objects: the package comes with the pool's own
        # credentials, asked for in the name of the first worker this start is for
        def vended() -> Any:
            from host_agent.worker.control import ControlPlaneError, HttpControlPlane
            from host_agent.worker.credentials import pool_credentials

            try:
                return pool_credentials(HttpControlPlane(report_to), doc.pool, pairs[0][0], instance_id)
            except ControlPlaneError as exc:
                raise InvalidInput(
                    f"worker: no credentials for pool {doc.pool} to download its runner package: {exc}",
                    code="package_unavailable",
                    details={"pool": doc.pool},
                ) from None

    package = _src(stage_package(doc, pool_dir, s3, credentials=vended))
    started: list[dict[str, Any]] = []
    for worker_id, sl in pairs:
        record_path = pool_dir / f"{worker_id}.json"
        if record_path.exists():  # the same command delivered twice: one worker per id
            old = json.loads(record_path.read_text())
            if launcher.running(old):
                started.append({**old, "already_running": True})
                continue
        argv = [
            python, "-m", "host_agent.worker",
            "--pool", doc.pool, "--worker-id", worker_id, "--instance-id", instance_id,
            "--queue-url", doc.queue_url, "--runner", doc.runner, "--package", package,
            "--report-to", report_to, "--visibility", str(doc.visibility_s),
            "--idle-timeout", str(doc.idle_timeout_s), "--poll-wait", str(doc.poll_wait_s),
        ]  # fmt: skip
        if doc.credentials == CONTROL_PLANE:
            argv += ["--credentials", "control-plane"]
        env = worker_env(dict(sl.env), sl.slice_id)
        unit = f"calque-worker-{doc.pool}-{worker_id}"
        jail = (jails or {}).get(sl.slice_id)
        how = launcher.start(unit, argv, env, pool_dir / f"{worker_id}.log", pool_dir, jail=jail)
        info = {
            **how,
            "pool": doc.pool,
            "worker_id": worker_id,
            "instance_id": instance_id,
            "slice_id": sl.slice_id,
            "device_uuid": sl.device_uuid,
            "binding": {k: v for k, v in sl.env.items() if k.startswith("CUDA_")},
            "account": jail.account if jail is not None else None,
            "started_at": time.time(),
        }
        tmp = record_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(info))
        os.replace(tmp, record_path)
        started.append(info)
    return started


def records(
    workers_dir: Path, pool: str | None = None, launcher: Launcher | None = None
) -> list[dict[str, Any]]:
    launcher = launcher or Launcher()
    out: list[dict[str, Any]] = []
    pattern = f"{pool}/*.json" if pool else "*/*.json"
    for path in sorted(workers_dir.glob(pattern)):
        try:
            info = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        info["running"] = launcher.running(info)
        out.append(info)
    return out


def stop(workers_dir: Path, pool: str, launcher: Launcher) -> list[dict[str, Any]]:
    stopped = []
    for info in records(workers_dir, pool, launcher):
        launcher.stop(info)
        (workers_dir / pool / f"{info['worker_id']}.json").unlink()
        stopped.append(info)
    return stopped

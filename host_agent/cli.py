"""`python -m host_agent [global options] VERB ...`: parse, pick the backend, call one
verb, print the report, and send it when an endpoint is given.

Exit codes: 0 ok; 1 a refusal, a failed apply, an assert that found a difference,
or a report the control plane did not take (the report is still printed); 2 usage;
3 something unexpected (traceback with --debug).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from calque.contracts.agent import AgentReport
from calque.errors import CalqueError, InvalidInput
from host_agent.tenants import GrantStore

VERBS = (
    "inventory", "apply", "assert", "export", "reclaim", "report",
    "simulate-process", "grant", "login", "guard", "worker",
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m host_agent",
        description="Read the GPUs through NVML, converge them to a layout spec, reclaim slices, report.",
    )
    p.add_argument(
        "--simulate",
        metavar="INSTANCE_TYPE",
        help="run against a fake of this instance type's GPUs instead of the hardware (e.g. g7e.2xlarge)",
    )
    p.add_argument(
        "--state",
        metavar="FILE",
        help="JSON file keeping the simulated GPUs between runs (created with --simulate when missing)",
    )
    p.add_argument(
        "--instance-id", help="this host's EC2 instance id (default: $CALQUE_INSTANCE_ID, else IMDS)"
    )
    p.add_argument(
        "--report-to",
        metavar="URL",
        type=_endpoint_url,
        help="control plane endpoint: POST the report, SigV4-signed",
    )
    p.add_argument(
        "--output", choices=("json", "text"), default="json", help="json (default): one document on stdout"
    )
    p.add_argument("--mps-root", default=None, help="where each GPU's MPS pipe and log directories live")
    p.add_argument("--read-only", action="store_true", help="refuse any call that would change a GPU")
    p.add_argument(
        "--lock-file",
        default=None,
        help="the host-wide lock every changing verb holds (default: $CALQUE_AGENT_LOCK, else "
        "/run/calque/host-agent.lock on hardware, beside --state on a simulated host)",
    )
    p.add_argument(
        "--lock-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long a verb waits for another run to finish (default 1680: just under the SSM step's 1800)",
    )
    p.add_argument(
        "--state-dir",
        default=None,
        help="the agent's own state: grants, fences, UIDs handed out (default /var/lib/calque)",
    )
    p.add_argument(
        "--host-access",
        choices=("linux", "simulated"),
        default=None,
        help="who enforces tenancy: linux (accounts, cgroups, iptables, as root: the default on "
        "hardware) or simulated (recorded in --state: the default with --simulate/--state)",
    )
    p.add_argument(
        "--driver-root",
        default="/",
        metavar="DIR",
        help="where the driver's proc/ and dev/ files are (default /; a test host's stand-in tree)",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks of unexpected errors")
    subparsers = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    sub = _Verbs(subparsers)
    sub.add_parser("inventory", help="every GPU: MIG mode, instances, processes, MPS daemon")
    for verb, what in (
        ("apply", "converge the GPUs to the spec"),
        ("assert", "exit 0 if the GPUs match the spec"),
    ):
        sp = sub.add_parser(verb, help=what)
        sp.add_argument(
            "--spec",
            required=True,
            metavar="FILE",
            help="layout spec file (JSON or YAML), '-' for stdin, or inline JSON",
        )
    sub.add_parser("export", help="the current state as a layout spec")
    sp = sub.add_parser("reclaim", help="stop every process on a slice and confirm none remains")
    sp.add_argument("--slice", required=True, metavar="ID", help="the slice, e.g. g0-1g.24gb-1")
    sp.add_argument(
        "--fence",
        type=int,
        default=None,
        metavar="N",
        help="the slice's fence when its lease ended, echoed in the report",
    )
    sub.add_parser("report", help="the agent's report of this host (slices, bindings, processes)")
    sp = sub.add_parser("grant", help="give a slice to a session's own account (MIG: its device files)")
    sp.add_argument("--slice", required=True, metavar="ID", help="the slice, e.g. g0-1g.24gb-1")
    sp.add_argument("--user", required=True, metavar="ACCOUNT", help="the session's account: calque-<12 hex>")
    sp.add_argument(
        "--token-sha256", default=None, metavar="HEX", help="the session token's hash, checked at login"
    )
    sp.add_argument(
        "--fence",
        type=int,
        default=None,
        metavar="N",
        help="the lease the grant is for, echoed in the report",
    )
    sp = sub.add_parser(
        "login", help="(Session Manager) ask for the session's token, then run a shell as its account"
    )
    sp.add_argument("--user", required=True, metavar="ACCOUNT", help="the session's account: calque-<12 hex>")
    sp.add_argument(
        "--command",
        default=None,
        metavar="CMD",
        help="run CMD in the session's shell instead of an interactive one",
    )
    sp.add_argument(
        "--command-b64",
        default="",
        metavar="B64",
        help="(the session document) CMD as base64; empty: an interactive shell",
    )
    sp = sub.add_parser(
        "guard",
        help="(at boot, before SSM Agent) refuse IMDS to all but root, hide other users' processes, "
        "keep device files as set",
    )
    sp.add_argument(
        "--install", action="store_true", help="also install and enable the systemd unit that runs it at boot"
    )
    sp = sub.add_parser("simulate-process", help="simulated hosts only: start a pretend process on a slice")
    sp.add_argument("--slice", required=True, metavar="ID", help="the slice, e.g. g0-1g.24gb-1")
    sp.add_argument("--name", default="python", help="the process's name (default python)")
    sp.add_argument("--memory-mib", type=int, default=1024, help="GPU memory it holds, in MiB (default 1024)")
    # warm pools: a pool's workers on this host, one per slice (host_agent/pool_workers.py)
    sp = sub.add_parser("worker", help="start, stop or list a warm pool's workers here (one per slice)")
    sp.add_argument("action", choices=("start", "stop", "status"))
    sp.add_argument("--worker", metavar="FILE", help="start: the pool's worker document (file, '-', or JSON)")
    sp.add_argument(
        "--spec", metavar="FILE", help="start: the pool's layout, applied before the workers start"
    )
    sp.add_argument("--pool", metavar="NAME", help="stop, status: the pool")
    sp.add_argument(
        "--workers-dir",
        default=None,
        help="where workers' records and logs go (default /var/lib/calque/pools; "
        "beside --state when simulated)",
    )
    return p


def _endpoint_url(value: str) -> str:
    """--report-to: an http(s) URL with a host, or a usage error naming the flag (not a
    traceback from the signer after the verb has already run)."""
    from urllib.parse import urlsplit

    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a URL of the control plane: give http(s)://HOST[:PORT][/PATH]"
        )
    return value.strip()


class _Verbs:
    """The verbs' subparsers: each verb's --help opens with what it does (its one-line help),
    not with the usage line alone."""

    def __init__(self, subparsers: argparse._SubParsersAction) -> None:
        self._subparsers = subparsers

    def add_parser(self, name: str, *, help: str) -> argparse.ArgumentParser:
        return self._subparsers.add_parser(name, help=help, description=help)


def _instance_id(args: argparse.Namespace, simulated_seed: str | None) -> str:
    if args.instance_id:
        return args.instance_id
    if os.environ.get("CALQUE_INSTANCE_ID"):
        return os.environ["CALQUE_INSTANCE_ID"]
    if simulated_seed is not None:
        return simulated_seed if simulated_seed.startswith("i-") else "i-simulated"
    return _imds_instance_id() or "unknown"


def _imds_instance_id() -> str | None:
    """The instance id from IMDSv2, or None off EC2 (short timeouts: never hangs a run)."""
    import urllib.request

    try:
        tok_req = urllib.request.Request(
            "http://169.254.169.254/latest/api/token",
            method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"},
        )
        with urllib.request.urlopen(tok_req, timeout=1) as r:  # noqa: S310
            token = r.read().decode()
        req = urllib.request.Request(
            "http://169.254.169.254/latest/meta-data/instance-id", headers={"X-aws-ec2-metadata-token": token}
        )
        with urllib.request.urlopen(req, timeout=1) as r:  # noqa: S310
            return r.read().decode().strip()
    except OSError:
        return None


def _backend(args: argparse.Namespace):
    """(backend, instance_type, save) for the options given."""
    from host_agent.mps import DEFAULT_MPS_ROOT

    mps_root = args.mps_root or DEFAULT_MPS_ROOT
    if args.simulate or args.state:
        from host_agent.fake import FakeGpuBackend

        state = Path(args.state) if args.state else None
        if state is not None and state.exists():
            backend = _load_state(state)
            if args.simulate and backend.instance_type != args.simulate:
                raise InvalidInput(
                    f"--state {state} simulates a {backend.instance_type}, not a {args.simulate}",
                    details={"field": "simulate"},
                )
        elif args.simulate:
            seed = args.instance_id or os.environ.get("CALQUE_INSTANCE_ID") or args.simulate
            backend = FakeGpuBackend.for_instance_type(args.simulate, seed=seed, mps_root=mps_root)
        else:
            raise InvalidInput(f"--state {state} does not exist; give --simulate INSTANCE_TYPE to create it")
        save = (lambda: backend.save(state)) if state is not None else (lambda: None)
        if args.host_access == "linux":  # simulated GPUs, this kernel's accounts and cgroups
            backend.host = _linux_host(args)
            backend.grants = GrantStore(f"{_state_dir(args)}/grants.json")
        return backend, backend.instance_type, save
    from host_agent.nvml import NvmlBackend

    nvml = NvmlBackend(mps_root=mps_root, allow_changes=not args.read_only, state_dir=_state_dir(args))
    nvml.host = _linux_host(args)
    return nvml, None, (lambda: None)


def _load_state(state: Path):
    """A simulated host's state file, or a refusal naming it (not a traceback, exit 3)."""
    from host_agent.fake import FakeGpuBackend

    try:
        backend = FakeGpuBackend.load(state)
        if not isinstance(backend.state.get("gpus"), list) or not backend.instance_type:
            raise KeyError("gpus")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        if isinstance(exc, OSError):
            why = exc.strerror or str(exc)
        elif isinstance(exc, ValueError):
            why = "not JSON"
        else:
            why = "JSON, but not the GPUs of a simulated host"
        raise InvalidInput(
            f"--state {state} is not a simulated host's state file ({why}); give another file, or "
            "a new one with --simulate INSTANCE_TYPE to create it",
            details={"field": "state", "value": str(state)},
        ) from None
    return backend


def _state_dir(args: argparse.Namespace) -> str:
    from host_agent.tenants import DEFAULT_STATE_DIR

    return args.state_dir or os.environ.get("CALQUE_STATE_DIR") or DEFAULT_STATE_DIR


def _linux_host(args: argparse.Namespace):
    """The real host: its driver files under --driver-root; CALQUE_CGROUP_PARENT names the
    sessions' cgroup parent and CALQUE_FILE_ROOTS (colon-separated) where a removed
    account's files are looked for (default: every writable local filesystem)."""
    from host_agent.confine import DEFAULT_PARENT, detect
    from host_agent.linux_host import LinuxHost

    root = Path(args.driver_root or "/")
    roots = os.environ.get("CALQUE_FILE_ROOTS")
    return LinuxHost(
        proc=str(root / "proc"),
        dev=str(root / "dev"),
        state_dir=_state_dir(args),
        confiner=detect(parent=os.environ.get("CALQUE_CGROUP_PARENT") or DEFAULT_PARENT),
        file_roots=[r for r in roots.split(":") if r] if roots else None,
    )


def _read_spec(path: str):
    from calque.contracts.layout import load_layout, parse_layout

    if path == "-":
        return parse_layout(sys.stdin.read())
    if path.lstrip().startswith("{"):
        return parse_layout(path)  # an inline JSON document, as an SSM parameter carries it
    return load_layout(path)


def _held(args: argparse.Namespace, *, shared: bool = False):
    """The host-wide lock for the block: its file --lock-file, $CALQUE_AGENT_LOCK, beside
    --state, else (on hardware) the default; none for a simulated host without a state file.
    ``shared``: with other readers, never with a change."""
    import contextlib

    from host_agent.lock import DEFAULT_LOCK_FILE, DEFAULT_LOCK_TIMEOUT_S, host_lock

    lock_path = args.lock_file or os.environ.get("CALQUE_AGENT_LOCK")
    if lock_path is None and args.state:
        lock_path = str(Path(args.state).with_name(Path(args.state).name + ".lock"))
    if lock_path is None and not args.simulate:
        lock_path = DEFAULT_LOCK_FILE
    if lock_path is None:
        return contextlib.nullcontext()
    timeout = DEFAULT_LOCK_TIMEOUT_S if args.lock_timeout is None else args.lock_timeout
    return host_lock(lock_path, timeout_s=timeout, shared=shared)


def run(args: argparse.Namespace) -> AgentReport:

    from host_agent.lock import MUTATING_VERBS

    spec = _read_spec(args.spec) if args.verb in ("apply", "assert") else None
    # A simulated host's state file is read and written whole: every verb holds its lock
    # there exclusively. On hardware a read shares it, so it never sees a change half done.
    with _held(args, shared=args.verb not in MUTATING_VERBS and not args.state):
        return _run(args, spec)


def _run(args: argparse.Namespace, spec) -> AgentReport:
    from host_agent import verbs

    backend, itype, save = _backend(args)
    ctx = verbs.Context(
        backend=backend,
        instance_id=_instance_id(args, backend.state.get("seed") if hasattr(backend, "state") else None),
        instance_type=itype,
        simulated=hasattr(backend, "state"),
    )
    if args.read_only and hasattr(backend, "read_only"):
        backend.read_only = True
    try:
        if args.verb == "inventory":
            report = verbs.do_inventory(ctx)
        elif args.verb == "report":
            report = verbs.do_report(ctx)
        elif args.verb == "export":
            report = verbs.do_export(ctx)
        elif args.verb == "apply":
            report = verbs.do_apply(ctx, spec)
        elif args.verb == "assert":
            report = verbs.do_assert(ctx, spec)
        elif args.verb == "reclaim":
            report = verbs.do_reclaim(ctx, args.slice, fence=args.fence)
        elif args.verb == "grant":
            report = verbs.do_grant(
                ctx, args.slice, args.user, token_sha256=args.token_sha256, fence=args.fence
            )
        else:
            report = verbs.do_simulate_process(ctx, args.slice, name=args.name, memory_mib=args.memory_mib)
    finally:
        save()
    return report


def _worker(args: argparse.Namespace) -> int:
    """The ``worker`` verb: prints one JSON document ({"verb", "action", "ok", "instance_id",
    "pool", "workers", and for start "applied"}); the workers report for themselves."""
    from host_agent import pool_workers as pw

    workers_dir = Path(
        args.workers_dir
        or (str(Path(args.state).parent / "pools") if args.state else None)
        or pw.DEFAULT_WORKERS_DIR
    )
    launcher = pw.Launcher(use_systemd=False if (args.simulate or args.state) else None)
    out: dict = {"verb": "worker", "action": args.action, "ok": True}
    if args.action == "start":
        if not args.worker:
            raise InvalidInput(
                "worker start needs --worker (the pool's worker document)", details={"field": "worker"}
            )
        if not args.report_to:
            raise InvalidInput(
                "worker start needs --report-to (where the workers report)", details={"field": "report_to"}
            )
        doc = pw.read_doc(args.worker)
        spec = _read_spec(args.spec) if args.spec else None
        args.verb = "apply" if spec is not None else "report"
        args.spec = args.spec if spec is not None else None
        report = run(args)  # converge first (under the host lock), then read the slices
        if not report.ok:
            err = report.error
            raise CalqueError(
                f"worker start: the pool's layout could not be applied: {err.message if err else 'failed'}",
                code=err.code if err else "apply_failed",
                details={"remaining": report.remaining},
            )
        out.update(instance_id=report.instance_id, pool=doc.pool, applied=spec is not None)
        out["workers"] = pw.start(
            doc,
            list(report.slices),
            instance_id=report.instance_id,
            report_to=args.report_to,
            workers_dir=workers_dir,
            launcher=launcher,
            jails=_worker_jails(args, doc.pool),
        )
    else:
        if not args.pool and args.worker:  # the pool named by the worker document (as SSM sends it)
            try:
                text = args.worker if args.worker.lstrip().startswith("{") else Path(args.worker).read_text()
                args.pool = str(json.loads(text)["pool"])
            except (OSError, ValueError, KeyError, TypeError):
                raise InvalidInput("worker: --worker names no pool", details={"field": "worker"}) from None
        if args.action == "stop" and not args.pool:
            raise InvalidInput("worker stop needs --pool", details={"field": "pool"})
        out["pool"] = args.pool
        if args.action == "stop":
            out["workers"] = pw.stop(workers_dir, args.pool, launcher)
            _release_worker_jails(args, workers_dir, out["workers"])
        else:
            out["workers"] = pw.records(workers_dir, args.pool, launcher)
    if args.output == "json":
        print(json.dumps(out, indent=2))
    else:
        for w in out["workers"]:
            slice_id, device = w.get("slice_id", ""), w.get("device_uuid", "")
            print(f"{w['worker_id']:<24} {slice_id:<18} pid {w.get('pid')} {device}")
    return 0


def _real_host(args: argparse.Namespace) -> bool:
    """Tenancy enforced by this kernel: hardware, or --host-access linux."""
    return args.host_access == "linux" or (args.host_access is None and not (args.simulate or args.state))


def _worker_jails(args: argparse.Namespace, pool: str) -> dict | None:
    """On a real host, each worker runs as the pool's account in its slice's confinement."""
    if not _real_host(args):
        return None
    from host_agent.worker_jail import jails

    backend, _, save = _backend(args)
    try:
        return jails(backend, pool)
    finally:
        save()


def _release_worker_jails(args: argparse.Namespace, workers_dir: Path, stopped: list) -> None:
    if not _real_host(args) or not stopped:
        return
    from host_agent.worker_jail import release

    pool = stopped[0]["pool"]
    left = list((workers_dir / pool).glob("*.json"))
    release(_linux_host(args), pool, [w["slice_id"] for w in stopped], last=not left)


def _print(report: AgentReport, output: str) -> None:
    if output == "json":
        print(report.model_dump_json(indent=2, exclude_none=True))
        return
    status = "ok" if report.ok else f"FAILED: {report.error.message if report.error else ''}"
    print(f"{report.verb} on {report.instance_id} ({report.instance_type or 'hardware'}): {status}")
    for a in report.actions:
        print(f"  did: {a}")
    for r in report.remaining:
        print(f"  remains: {r}")
    if report.verb == "export" and report.spec is not None:
        print(report.spec.to_json())
        return
    for s in report.slices:
        procs = f", {len(s.processes)} process(es)" if s.processes else ""
        print(f"  {s.slice_id:<18} {s.backend:<9} {s.profile:<10} {s.memory_gib:>7g} GiB  {s.state}{procs}")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verb in ("login", "guard") and not _real_host(args):
        # both act on this kernel alone (its accounts, /proc, the firewall, cgroups): on a
        # simulated host (--simulate/--state) they would change the machine they run on
        print(
            f"error: {args.verb} acts on this machine's own accounts, /proc and firewall, never on "
            "a simulated host: give --host-access linux to run it with --simulate or --state",
            file=sys.stderr,
        )
        return 2
    try:
        if args.verb == "login":
            from host_agent.login import login

            command = args.command
            if args.command_b64:
                import base64
                import binascii

                try:
                    command = base64.b64decode(args.command_b64, validate=True).decode()
                except (binascii.Error, UnicodeDecodeError):
                    print("error: --command-b64 is not base64 of a UTF-8 command", file=sys.stderr)
                    return 2
            return login(args.user, state_dir=_state_dir(args), host=_linux_host(args), command=command)
        if args.verb == "guard":
            from host_agent.guard import guard

            # held as grant and reclaim hold it: the cgroups it makes again from the grants
            # are never those of a grant half made, or of a reclaim that just removed them
            with _held(args):
                return guard(
                    _linux_host(args),
                    grants=GrantStore(f"{_state_dir(args)}/grants.json"),
                    install=args.install,
                    output=args.output,
                )
        if args.verb == "worker":
            return _worker(args)
        report = run(args)
    except CalqueError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        if args.output == "json":
            print(json.dumps({"error": {"code": exc.code, "message": exc.message, "details": exc.details}}))
        return 1
    except Exception as exc:
        if args.debug:
            raise
        print(
            f"unexpected error ({type(exc).__name__}): {exc}; rerun with --debug for the traceback",
            file=sys.stderr,
        )
        return 3
    try:
        _print(report, args.output)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader left early (`| head`): what was done stands, and is still reported
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    code = 0 if report.ok else 1
    if not report.ok and report.error is not None:
        print(f"error: {report.error.message}", file=sys.stderr)
    if args.report_to:
        from host_agent.report import send_report

        try:
            send_report(args.report_to, report)
        except CalqueError as exc:
            print(f"error: report not delivered: {exc.message}", file=sys.stderr)
            return 1
    return code

"""Placement under contention: N members check out at once on a fleet with free slices.

Each racer is one thread calling the real ``Tenancy.checkout`` (its own domain object,
as each API function environment holds its own) against the local plane's backend: a
moto server whose DynamoDB operations run one at a time (calque.local.moto_server), so
conditions and transactions are atomic as in DynamoDB. All racers start together on a
barrier. Every racer is a different member, so quotas never refuse.

Printed per round, side by side with the goal:

    grants                 check-outs that got a slice
    refused while free     refusals although at least one fitting slice was still free
                           when the round ended (goal: 0 whenever racers <= free slices)
    transactions / grant   TransactWriteItems calls (won and lost) per grant (goal: < 2)
    queries / check-out    placement reads per check-out (bounded; flat in fleet size)

    seconds                the round's wall time
    plane peak MiB         the plane's peak resident memory so far (VmHWM of its process)

    python bench/placement_race.py [--hosts 100] [--racers 16,300] [--rounds 3] [--seed N]
    python bench/placement_race.py --preset institution     250 hosts, 1,000 at once, all checked in
    python bench/placement_race.py --hosts 250 --racers 8 --rounds 1 --churn 10000
                                   memory growth over 10,000 check-out/check-in cycles

The plane (its moto layer: serialized DynamoDB, its transactions, its journal and
snapshots) runs in a process of its own, so its memory is measured apart from the racers'.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REGION = "us-east-1"
INSTANCE_TYPE = "g7e.2xlarge"
LAYOUT = {"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]}
TABLE = "calque-bench-placement"


def serve_plane(state_dir: str) -> None:
    """The plane's moto layer in a process of its own (``--serve-plane``), as ``calque local
    up`` runs it: serialized DynamoDB, the plane's transactions, its journal and snapshots
    in ``state_dir``. Prints its endpoint, then serves until its stdin closes."""
    from calque.local.moto_server import MotoClients, MotoServer
    from calque.local.persistence import Persistence

    persistence = Persistence(Path(state_dir), account="123456789012", region=REGION)
    server = MotoServer(persistence=persistence)
    endpoint = server.start()
    persistence.restore(MotoClients(endpoint, REGION, ("testing", "testing")))
    print(endpoint, flush=True)
    sys.stdin.read()
    persistence.close()
    server.stop()


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


class Plane:
    """The local plane's DynamoDB (moto, serialized, journaled) in a process of its own, with
    the registry table, and a counter of every DynamoDB call made through its one shared
    client. Its memory is that process's: ``rss_mib()`` now, ``peak_mib()`` its high-water mark."""

    def __init__(self, racers: int) -> None:
        import subprocess
        import tempfile

        import boto3
        from botocore.config import Config

        from calque.local.bootstrap import create_registry_table

        self._state = tempfile.TemporaryDirectory(prefix="calque-bench-plane-")
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--serve-plane", self._state.name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        endpoint = self.process.stdout.readline().strip()
        if not endpoint:
            raise RuntimeError("the plane's process did not start")
        self.ddb = boto3.session.Session(
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name=REGION,
        ).client(
            "dynamodb",
            endpoint_url=endpoint,
            # No client-side retries: a lost race must show as a lost transaction here.
            # moto serializes every DynamoDB call: hundreds of racers queue for minutes here.
            config=Config(max_pool_connections=racers + 8, retries={"max_attempts": 1}, read_timeout=900),
        )
        create_registry_table(self.ddb, TABLE)
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.ddb.meta.events.register("before-call.dynamodb", self._count)

    def _count(self, model: Any, **_: Any) -> None:
        with self._lock:
            self.calls[model.name] += 1

    def rss_mib(self) -> float:
        return _status_kib(self.process.pid, "VmRSS") / 1024

    def peak_mib(self) -> float:
        return _status_kib(self.process.pid, "VmHWM") / 1024

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=120)
        self._state.cleanup()


def seed(plane: Plane, hosts: int) -> None:
    """``hosts`` ready hosts with 4 free 1g.24gb slices each, through the registry adapter."""
    from calque.catalog import planner
    from calque.contracts.layout import parse_layout
    from calque.tenancy.store.dynamo import DynamoRegistry
    from calque.tenancy.store.models import HostRecord, SliceRecord

    registry = DynamoRegistry(plane.ddb, TABLE)
    planned = planner.expand_slices(INSTANCE_TYPE, parse_layout(LAYOUT))
    now = datetime.now(UTC).replace(microsecond=0)
    for n in range(hosts):
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
        registry.create_host(
            host,
            [
                SliceRecord(
                    instance_id=iid,
                    slice_id=p.slice_id,
                    gpu_index=p.gpu_index,
                    backend=p.backend,
                    profile=p.profile,
                    memory_gib=p.memory_gib,
                    gpu_fraction=0.25,
                    state="free",
                    placeable=True,
                    device_uuid=f"MIG-{n:08x}-{k}",
                    env={"CUDA_VISIBLE_DEVICES": f"MIG-{n:08x}-{k}"},
                    state_since=now,
                )
                for k, p in enumerate(planned)
            ],
        )


def race(
    plane: Plane, racers: int, *, seed_value: int, tag: str, profile: str | None = None
) -> dict[str, Any]:
    """One round: ``racers`` members check out at once. Returns the round's figures and
    the grants (to check in afterwards)."""
    from calque.contracts.tenancy import CheckoutRequest
    from calque.errors import CalqueError
    from calque.identity import Caller
    from calque.tenancy.service import Tenancy
    from calque.tenancy.store.dynamo import DynamoRegistry
    from calque.tenancy.store.memory import MemoryQueue

    if profile is not None:
        req = CheckoutRequest(backend="mig", profile=profile, ttl_seconds=600)
    else:
        req = CheckoutRequest(backend="mig", min_memory_gib=20, ttl_seconds=600)
    envs = [
        Tenancy(DynamoRegistry(plane.ddb, TABLE), MemoryQueue(), rng=random.Random(seed_value * 1000 + n))
        for n in range(racers)
    ]
    callers = [
        Caller(principal=f"{tag}{n}", arn=f"arn:aws:iam::123456789012:user/{tag}{n}") for n in range(racers)
    ]
    results: list[Any] = [None] * racers
    barrier = threading.Barrier(racers)

    def run(n: int) -> None:
        barrier.wait()
        try:
            results[n] = envs[n].checkout(callers[n], req)
        except CalqueError as exc:
            results[n] = exc
        except Exception as exc:  # the bench's own trouble (e.g. a timeout): counted, shown
            results[n] = exc

    before = Counter(plane.calls)
    threads = [threading.Thread(target=run, args=(n,)) for n in range(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    used = plane.calls - before
    grants = [r for r in results if not isinstance(r, Exception)]
    refusals = [r for r in results if isinstance(r, Exception)]
    free_after = sum(
        1 for _host, slices in DynamoRegistry(plane.ddb, TABLE).fleet() for s in slices if s.state == "free"
    )
    held = [(g.instance_id, g.slice_id) for g in grants]
    assert len(held) == len(set(held)), "a slice was granted twice"
    return {
        "grants": grants,
        "refused": len(refusals),
        "refused_while_free": len(refusals) if free_after else 0,
        "codes": Counter(getattr(r, "code", type(r).__name__) for r in refusals),
        "transactions": used["TransactWriteItems"],
        "queries": used["Query"] + used["GetItem"],
        "free_after": free_after,
        "callers": callers,
        "envs": envs,
    }


def end_all(round_: dict[str, Any]) -> None:
    """Check every grant in and free its slice again, as a host agent's reclaim would."""
    from calque.contracts.tenancy import CheckinRequest

    by_user = {c.principal: c for c in round_["callers"]}
    tenancy = round_["envs"][0]
    for g in round_["grants"]:
        tenancy.checkin(by_user[g.user], g.session_id, CheckinRequest(token=g.token))
    for g in round_["grants"]:
        reclaimed(tenancy, g)


def cycle(tenancy: Any, caller: Any, req: Any) -> None:
    """One check-out, its check-in and its slice's reclaim (what each churn cycle keeps)."""
    from calque.contracts.tenancy import CheckinRequest

    g = tenancy.checkout(caller, req)
    tenancy.checkin(caller, g.session_id, CheckinRequest(token=g.token))
    reclaimed(tenancy, g)


def reclaimed(tenancy: Any, g: Any) -> None:
    """The host agent's report that it reclaimed grant ``g``'s slice."""
    from calque.contracts.agent import AgentReport

    now = datetime.now(UTC)
    tenancy.report(
        g.instance_id,
        AgentReport(
            instance_id=g.instance_id,
            verb="reclaim",
            ok=True,
            started_at=now,
            finished_at=now,
            reclaimed_slice_id=g.slice_id,
        ),
    )


def churn(plane: Plane, cycles: int, *, workers: int = 8, members_per_worker: int = 8) -> dict[str, Any]:
    """``cycles`` check-out/check-in cycles (each with its slice's reclaim), ``workers`` at a
    time, each worker cycling through its own members. Returns the plane's resident memory
    before, after a warm-up of a tenth of the cycles, and at the end, and the refusals."""
    from calque.contracts.tenancy import CheckoutRequest
    from calque.identity import Caller
    from calque.tenancy.service import Tenancy
    from calque.tenancy.store.dynamo import DynamoRegistry
    from calque.tenancy.store.memory import MemoryQueue

    req = CheckoutRequest(backend="mig", min_memory_gib=20, ttl_seconds=600)
    warmup = max(1, cycles // 10)
    done = [0]
    marks: dict[str, float] = {"before": plane.rss_mib()}
    failures: Counter[str] = Counter()
    lock = threading.Lock()
    t0 = time.monotonic()
    last = [t0]

    def work(w: int) -> None:
        tenancy = Tenancy(DynamoRegistry(plane.ddb, TABLE), MemoryQueue(), rng=random.Random(w))
        members = [
            Caller(principal=f"churn{w}m{m}", arn=f"arn:aws:iam::123456789012:user/churn{w}m{m}")
            for m in range(members_per_worker)
        ]
        n = 0
        while True:
            with lock:
                if done[0] >= cycles:
                    return
                done[0] += 1
                if done[0] == warmup:
                    marks["warm"] = plane.rss_mib()
                if done[0] % warmup == 0:
                    now = time.monotonic()
                    print(
                        f"  churn: {done[0]} cycles begun in {now - t0:.0f} s (the last {warmup} in "
                        f"{now - last[0]:.0f} s), plane resident {plane.rss_mib():.0f} MiB",
                        flush=True,
                    )
                    last[0] = now
            caller = members[n % members_per_worker]
            n += 1
            try:
                cycle(tenancy, caller, req)
            except Exception as exc:
                with lock:
                    failures[getattr(exc, "code", type(exc).__name__)] += 1

    threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    marks["after"] = plane.rss_mib()
    return {"marks": marks, "failures": failures}


PRESETS = {
    # the institution: 250 hosts x 4 slices, 1,000 members check out at once, then all check in
    "institution": {"hosts": 250, "racers": "1000", "rounds": 1},
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", type=int, default=100, help="hosts of 4 x 1g.24gb slices (default 100)")
    parser.add_argument("--racers", default="16,300", help="comma-separated racer counts (default 16,300)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per racer count (default 3)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="institution: --hosts 250 --racers 1000 --rounds 1 (every grant checked in after)",
    )
    parser.add_argument(
        "--churn",
        type=int,
        default=0,
        metavar="CYCLES",
        help="after the rounds, CYCLES check-out/check-in cycles (8 at a time), and the plane's "
        "memory growth over them (goal: < 100 MiB for 10,000)",
    )
    parser.add_argument("--serve-plane", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_plane:
        serve_plane(args.serve_plane)
        return 0
    for k, v in PRESETS.get(args.preset or "", {}).items():
        setattr(args, k, v)
    counts = [int(x) for x in args.racers.split(",") if x]
    plane = Plane(max([*counts, 8]))
    failed = False
    started = time.monotonic()
    try:
        seed(plane, args.hosts)
        slices = args.hosts * 4
        print(
            f"fleet: {args.hosts} hosts x 4 x 1g.24gb = {slices} free slices; check-out --min-memory-gib 20; "
            f"plane after seeding: {plane.rss_mib():.0f} MiB resident"
        )
        header = (
            f"{'racers':>6} {'round':>5} {'grants':>7} {'refused':>8} {'refused while free':>19} "
            f"{'tx/grant':>9} {'queries/checkout':>17} {'seconds':>8} {'plane peak MiB':>15}   goal"
        )
        print(header)
        print("-" * len(header))
        for racers in counts:
            for rnd in range(args.rounds):
                t0 = time.monotonic()
                r = race(plane, racers, seed_value=args.seed * 100 + rnd, tag=f"r{racers}x{rnd}u")
                grants = len(r["grants"])
                tpg = r["transactions"] / grants if grants else float("inf")
                qpc = r["queries"] / racers
                goal_free = racers <= slices
                ok = (r["refused_while_free"] == 0 or not goal_free) and tpg < 2
                failed |= not ok
                print(
                    f"{racers:>6} {rnd + 1:>5} {grants:>7} {r['refused']:>8} {r['refused_while_free']:>19} "
                    f"{tpg:>9.2f} {qpc:>17.2f} {time.monotonic() - t0:>8.0f} {plane.peak_mib():>15.0f}   "
                    f"{'met' if ok else 'MISSED'} (0 refused while free, tx/grant < 2)"
                    + (
                        "  refusals: " + ", ".join(f"{code} {n}" for code, n in sorted(r["codes"].items()))
                        if r["refused"]
                        else ""
                    ),
                    flush=True,
                )
                last = (racers, rnd) == (counts[-1], args.rounds - 1)
                if not last or args.preset or args.churn:  # the last round needs no reset otherwise
                    t0 = time.monotonic()
                    end_all(r)
                    if args.preset:
                        print(
                            f"{'':>6} {'':>5} {grants} checked in and reclaimed in "
                            f"{time.monotonic() - t0:.0f} s; plane peak {plane.peak_mib():.0f} MiB",
                            flush=True,
                        )
        if args.preset:
            peak = plane.peak_mib()
            ok = peak < 1536
            failed |= not ok
            print(
                f"{args.preset}: {time.monotonic() - started:.0f} s in all; plane peak resident memory "
                f"{peak:.0f} MiB (VmHWM of its process)   {'met' if ok else 'MISSED'} (< 1,536 MiB)"
            )
        if args.churn:
            t0 = time.monotonic()
            c = churn(plane, args.churn)
            m = c["marks"]
            growth = m["after"] - m["before"]
            ok = growth < 100 and not c["failures"]
            failed |= not ok
            print(
                f"churn: {args.churn} check-out/check-in cycles in {time.monotonic() - t0:.0f} s; "
                "plane resident "
                f"{m['before']:.0f} MiB before, {m.get('warm', float('nan')):.0f} MiB after the first "
                f"{max(1, args.churn // 10)}, {m['after']:.0f} MiB after all: grew {growth:.0f} MiB; "
                f"peak {plane.peak_mib():.0f} MiB   {'met' if ok else 'MISSED'} "
                "(grows < 100 MiB, every cycle served)"
                + (
                    "  failures: " + ", ".join(f"{k} {n}" for k, n in sorted(c["failures"].items()))
                    if c["failures"]
                    else ""
                )
            )
    finally:
        plane.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

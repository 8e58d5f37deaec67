"""Chargeback over random lease histories: re-layouts, month edges, forced ends, expiry,
live sessions, and pool instances running claims (succeeded, failed, cancelled, running)
on their workers' slices. Per instance-month, the users' lines plus idle are its cost to
the cent; idle is never negative; every second of every session and claim is charged
exactly once."""

from __future__ import annotations

import itertools
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calque import catalog
from calque.accounting import claims as pool_claims
from calque.accounting.chargeback import Instance, Lease, compute
from calque.catalog import planner
from calque.contracts.layout import LayoutSpec
from calque.members.shares import slice_shares
from calque.pools import pricing
from calque.pools.domain import ClaimRecord, PoolInstanceRecord

pytestmark = pytest.mark.unit

BASE = datetime(2026, 10, 20, tzinfo=UTC)
SPAN = int(timedelta(days=80).total_seconds())
LAYOUTS = {
    "g7e.2xlarge": [
        {"gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]},
        {"gpus": [{"devices": "all", "mig": {"2g.48gb": 1, "1g.24gb": 2}}]},
        {"gpus": [{"devices": "all", "mps": {"clients": 3, "active_thread_percentage": 50}}]},
        {"gpus": [{"devices": "all", "exclusive": True}]},
    ],
    "p5e.48xlarge": [
        {"gpus": [{"devices": [0, 1], "mig": {"3g.71gb": 2}}, {"devices": [5], "mig": {"1g.18gb": 7}}]},
        {"gpus": [{"devices": "all", "mps": {"clients": 4}}]},
    ],
    "g6.xlarge": [{"gpus": [{"devices": "all", "mps": {"clients": 5, "active_thread_percentage": 20}}]}],
}
REASONS = ["checked_in", "expired", "forced", "drained"]


def _slices(itype: str, layout: dict) -> dict[str, Fraction]:
    planned = planner.expand_slices(catalog.instance_type(itype), LayoutSpec.model_validate(layout))
    return slice_shares(itype, layout, [(p.slice_id, p.gpu_index, p.backend, p.profile) for p in planned])


@st.composite
def histories(draw):
    instances, leases = [], []
    users = ["alice", "bob", "carol", "dan"]
    now = BASE + timedelta(seconds=draw(st.integers(SPAN // 4, SPAN)))
    for n in range(draw(st.integers(1, 3))):
        itype = draw(st.sampled_from(sorted(LAYOUTS)))
        start = BASE + timedelta(seconds=draw(st.integers(0, SPAN // 2)))
        ends = draw(st.booleans())
        end = start + timedelta(seconds=draw(st.integers(60, SPAN))) if ends else None
        inst = Instance(
            f"i-{n:08x}",
            itype,
            Decimal(str(catalog.instance_type(itype).hourly_usd)),
            None,
            start=start,
            end=end,
        )
        instances.append(inst)
        stop = min(end or now, now)
        if stop <= start:
            continue
        # re-layouts: the instance's life cut into segments, each with its own layout
        cuts = sorted(draw(st.lists(st.integers(1, 10**7), max_size=2)))
        total = int((stop - start).total_seconds())
        edges = [start] + [start + timedelta(seconds=c % total) for c in cuts] + [stop]
        edges = sorted(set(edges))
        for k, (a, b) in enumerate(itertools.pairwise(edges)):
            shares = _slices(itype, draw(st.sampled_from(LAYOUTS[itype])))
            last_segment = k == len(edges) - 2
            for slice_id, share in shares.items():
                seg = int((b - a).total_seconds())
                points = sorted(set(draw(st.lists(st.integers(0, seg), max_size=6))))
                for j in range(0, len(points) - 1, 2):
                    s, e = points[j], points[j + 1]
                    if s == e:
                        continue
                    live = last_segment and stop == now and e == seg and draw(st.booleans())
                    leases.append(
                        Lease(
                            session_id=f"s-{len(leases):06x}",
                            user=draw(st.sampled_from(users)),
                            instance_id=inst.instance_id,
                            slice_id=f"r{k}-{slice_id}",
                            share=share,
                            start=a + timedelta(seconds=s),
                            end=None if live else a + timedelta(seconds=e),
                            end_reason=None if live else draw(st.sampled_from(REASONS)),
                        )
                    )
                if points and draw(st.booleans()):
                    # a session that ran under a second: its start and end the same second
                    instant = a + timedelta(seconds=points[-1])
                    leases.append(
                        Lease(
                            session_id=f"s-{len(leases):06x}",
                            user=draw(st.sampled_from(users)),
                            instance_id=inst.instance_id,
                            slice_id=f"r{k}-{slice_id}",
                            share=share,
                            start=instant,
                            end=instant,
                            end_reason="checked_in",
                        )
                    )
    claims, expected = _pool_claims(draw, now, users, first=len(instances))
    records = [r for r, _ in claims]
    instances += pool_claims.instances(records)
    leases += pool_claims.leases([c for _, cs in claims for c in cs], records)
    return instances, leases, now, expected


def _iso(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def _pool_claims(draw, now: datetime, users: list[str], first: int):
    """Pool instances, each running claims one at a time per worker (one worker per slot);
    and, per claim, (instance id, start, end or None, the worker's share)."""
    out, expected = [], {}
    for n in range(draw(st.integers(0, 2))):
        itype = draw(st.sampled_from(sorted(LAYOUTS)))
        layout = draw(st.sampled_from([None, *LAYOUTS[itype]]))
        start = BASE + timedelta(seconds=draw(st.integers(0, SPAN // 2)))
        ends = draw(st.booleans())
        end = start + timedelta(seconds=draw(st.integers(60, SPAN))) if ends else None
        record = PoolInstanceRecord(
            pool=draw(st.sampled_from(["embed", "textstats"])),
            instance_id=f"i-{first + n:08x}",
            instance_type=itype,
            layout=layout,
            started_at=start.timestamp(),
            ended_at=None if end is None else end.timestamp(),
        )
        slots = pricing.slot_slices(itype, layout)
        stop = min(end or now, now)
        mine = []
        seg = int((stop - start).total_seconds())
        for k, (_slice, share) in enumerate(slots):
            wid = "w-0a1b2c3d" if len(slots) == 1 else f"w-0a1b2c3d-{k}"
            points = sorted(set(draw(st.lists(st.integers(0, max(seg, 0)), max_size=6))))
            if draw(st.booleans()) and (len(points) < 2 or points[0] > 0):
                # a record a lost worker left running, before this slot's claims: it ends
                # where the next one starts, and the slot is never charged twice over
                mine.append(
                    ClaimRecord(
                        claim_id=f"c-lost-{record.instance_id}-{k}",
                        pool=record.pool,
                        user="eve",
                        state="running",
                        items=1,
                        manifest_key="k",
                        submitted_at=_iso(start),
                        started_at=_iso(start),
                        worker=wid,
                        instance_id=record.instance_id,
                    )
                )
            busy_to_now = False
            for j in range(0, len(points) - 1, 2):
                a, b = start + timedelta(seconds=points[j]), start + timedelta(seconds=points[j + 1])
                live = end is None and stop == now and points[j + 1] == seg and draw(st.booleans())
                state = "running" if live else draw(st.sampled_from(["succeeded", "failed", "cancelled"]))
                cid = f"c-{record.instance_id}-{k}-{j}"
                mine.append(
                    ClaimRecord(
                        claim_id=cid,
                        pool=record.pool,
                        user=draw(st.sampled_from(users)),
                        group=draw(st.sampled_from([None, "lab", "course"])),
                        state=state,
                        items=1,
                        manifest_key="k",
                        submitted_at=_iso(a),
                        started_at=_iso(a),
                        finished_at=None if live else _iso(b),
                        worker=wid,
                        instance_id=record.instance_id,
                    )
                )
                expected[cid] = (record.instance_id, a, None if live else b, share)
                busy_to_now = busy_to_now or live
            if points and not busy_to_now and draw(st.booleans()):
                # a claim that ran under a second, after the slot's others (never while one
                # still runs there: a worker runs one claim at a time)
                instant = start + timedelta(seconds=points[-1])
                cid = f"c-{record.instance_id}-{k}-instant"
                mine.append(
                    ClaimRecord(
                        claim_id=cid,
                        pool=record.pool,
                        user=draw(st.sampled_from(users)),
                        state="succeeded",
                        items=1,
                        manifest_key="k",
                        submitted_at=_iso(instant),
                        started_at=_iso(instant),
                        finished_at=_iso(instant),
                        worker=wid,
                        instance_id=record.instance_id,
                    )
                )
                expected[cid] = (record.instance_id, instant, instant, share)
        out.append((record, mine))
    return out, expected


def _month_bounds():
    return [datetime(2026, m, 1, tzinfo=UTC) for m in (10, 11, 12)] + [
        datetime(2027, m, 1, tzinfo=UTC) for m in (1, 2)
    ]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), st.integers(0, 3), st.integers(1, 4))
def test_per_instance_month_the_lines_add_up_to_the_cost_and_idle_is_never_negative(h, a, b):
    instances, leases, now, _ = h
    bounds = _month_bounds()
    since, until = bounds[a], bounds[min(a + b, len(bounds) - 1)]
    bill = compute(instances, leases, since=since, until=until, now=now)
    per: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    for line in bill.lines:
        per[(line.instance_id, line.month)] += line.amount_usd
        assert line.amount_usd >= 0
    for m in bill.instances:
        assert per[(m.instance_id, m.month)] == m.cost_usd
        # and the cost is the instance's rate for the time it was paid, rounded half-up
        assert abs(m.exact_usd - Fraction(m.cost_usd)) <= Fraction(1, 200)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories())
def test_each_session_is_charged_once_for_exactly_its_time_inside_the_period(h):
    instances, leases, now, _ = h
    since, until = datetime(2026, 11, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)
    bill = compute(instances, leases, since=since, until=until, now=now)
    paid = {i.instance_id: i for i in instances}
    seconds: dict[str, Fraction] = defaultdict(Fraction)
    for line in bill.lines:
        if line.kind == "session":
            seconds[line.session_id] += line.seconds
    for lease in leases:
        if lease.kind != "session":
            continue  # claims: the next test
        inst = paid[lease.instance_id]
        lo = max(lease.start, since, inst.start)
        hi = min(lease.end or now, until, now, inst.end or now)
        expected = max(Fraction(0), Fraction(int((hi - lo).total_seconds())))
        assert seconds.get(lease.session_id, Fraction(0)) == expected
        if lease.end is None and expected:
            # still live: running on a period that reaches now, not on one that ended before
            mine = [x.running for x in bill.lines if x.session_id == lease.session_id]
            assert mine == [until >= now] * len(mine)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories())
def test_each_claim_is_charged_once_for_its_run_time_at_its_workers_share(h):
    instances, leases, now, expected_claims = h
    since, until = datetime(2026, 11, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)
    bill = compute(instances, leases, since=since, until=until, now=now)
    paid = {i.instance_id: i for i in instances}
    seconds: dict[str, Fraction] = defaultdict(Fraction)
    for line in bill.lines:
        if line.kind == "claim":
            assert line.session_id is None
            if line.claim_id.startswith("c-lost-"):
                continue  # a lost worker's record: cut where the slot's next claim starts
            seconds[line.claim_id] += line.seconds
            iid, _a, b, share = expected_claims[line.claim_id]
            assert line.share == share
            assert line.pool is not None
            assert line.running == (b is None and until >= now)  # running: reaches now
    for cid, (iid, a, b, _share) in expected_claims.items():
        inst = paid[iid]
        lo = max(a, since, inst.start)
        hi = min(b or now, until, now, inst.end or now)
        assert seconds.get(cid, Fraction(0)) == max(Fraction(0), Fraction(int((hi - lo).total_seconds())))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories())
def test_two_months_billed_together_are_the_two_months_billed_apart(h):
    instances, leases, now, _ = h
    nov, dec, jan = (
        datetime(2026, 11, 1, tzinfo=UTC),
        datetime(2026, 12, 1, tzinfo=UTC),
        datetime(2027, 1, 1, tzinfo=UTC),
    )
    both = compute(instances, leases, since=nov, until=jan, now=now)
    apart = (
        compute(instances, leases, since=nov, until=dec, now=now).lines
        + compute(instances, leases, since=dec, until=jan, now=now).lines
    )

    def key(lines):
        return sorted((x.month, x.instance_id, x.session_id or x.claim_id or "", x.amount_usd) for x in lines)

    assert key(both.lines) == key(apart)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), st.integers(0, 3), st.integers(1, 4))
def test_every_session_and_claim_that_ran_in_the_period_has_a_line_even_under_a_second(h, a, b):
    instances, leases, now, _ = h
    bounds = _month_bounds()
    since, until = bounds[a], bounds[min(a + b, len(bounds) - 1)]
    bill = compute(instances, leases, since=since, until=until, now=now)
    paid = {i.instance_id: i for i in instances}
    lined = {line.session_id or line.claim_id for line in bill.lines if line.kind != "idle"}
    for lease in leases:
        if lease.session_id.startswith("c-lost-"):
            continue  # a lost worker's record: cut where the slot's next claim starts
        inst = paid[lease.instance_id]
        paid_from, paid_to = max(since, inst.start), min(until, now, inst.end or now)
        if paid_from >= paid_to:
            continue  # the instance was not paid in the period: nothing of it is a line
        lo, hi = max(lease.start, paid_from), min(lease.end or now, paid_to)
        if lease.end == lease.start:  # under a second: a 0 s line at its instant
            ran = paid_from <= lease.start < paid_to or lease.start == paid_to < until
        else:
            ran = lo < hi
        assert (lease.session_id in lined) == ran, lease
        for line in bill.lines:
            if (line.session_id or line.claim_id) == lease.session_id and lease.end == lease.start:
                assert (line.seconds, line.amount_usd) == (0, Decimal("0.00"))

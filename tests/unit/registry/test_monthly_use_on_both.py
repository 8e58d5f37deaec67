"""What a month's ended sessions used is kept once, in the settled counters of the member's
quota item and of the group's item, by the transaction that ends each session; quota show,
group show, a limit's refusal and the end's lease record all give that one figure. The
same on the in-memory registry and on DynamoDB (moto)."""

from __future__ import annotations

import pytest

from calque.contracts.economics import GroupCreate
from calque.contracts.quotas import QuotaUpdate
from calque.contracts.tenancy import CheckinRequest, CheckoutRequest
from calque.dynamo import ser
from calque.errors import QuotaExceeded
from calque.members.groups import Groups
from calque.tenancy.store import keys
from tests.unit.tenancy.conftest import ADMIN, World, member

pytestmark = pytest.mark.unit

ALICE, BOB = member("alice"), member("bob")
HOST = "i-0aaa0001"
ENDS = ("checked_in", "expired", "forced", "drained")


def checkout(world: World, who, ttl: int, group: str | None = None):
    return world.tenancy.checkout(who, CheckoutRequest(backend="mig", ttl_seconds=ttl, group=group))


def a_month_of_ends(world: World) -> None:
    """On one g7e.2xlarge (1g.24gb slices: a quarter of the card, 0.84 USD an hour), alice
    checks one session in after 30 min, leaves one to the reaper (ended after 60 min) and has
    one ended by a forced drain after 30 min; bob's ends in the drain after 90 min. All are
    charged to group lab, the only group of each."""
    world.ready_host()
    world.quota("alice", 4)
    g = Groups(world.registry, clock=world.clock)
    g.create(ADMIN, GroupCreate(name="lab"))
    g.add(ADMIN, "lab", ["alice", "bob"])
    a = checkout(world, ALICE, 7200)
    checkout(world, ALICE, 600)
    checkout(world, BOB, 7200, "lab")
    world.clock.advance(1800)
    world.tenancy.checkin(ALICE, a.session_id, CheckinRequest(token=a.token))
    world.clock.advance(1800)
    assert len(world.tenancy.reap().expired) == 1
    checkout(world, ALICE, 7200)
    world.clock.advance(1800)
    world.tenancy.drain(ADMIN, HOST, force=True, reason="maintenance")


def ended_hours(world: World, user: str) -> float:
    return sum(
        e.gpu_hours or 0.0
        for e in world.registry.events_on(f"{world.clock():%Y-%m-%d}")
        if e.user == user and e.kind in ENDS
    )


def test_used_this_month_is_what_the_ended_sessions_used(any_world: World):
    # Given a month of check-ins, an expiry and a forced drain
    world = any_world
    a_month_of_ends(world)
    # When alice and bob read their quotas and an admin reads the group
    alice = world.tenancy.get_quota(ALICE, "me")
    bob = world.tenancy.get_quota(BOB, "me")
    lab = Groups(world.registry, clock=world.clock).show(ADMIN, "lab")
    # Then each shows what the ended sessions used: alice 30 + 60 + 30 min of a quarter card
    assert (alice.live_sessions, alice.gpu_hours_used_this_month, alice.usd_used_this_month) == (
        0,
        0.5,
        "1.68",
    )
    assert (bob.gpu_hours_used_this_month, bob.usd_used_this_month) == (0.375, "1.26")
    assert (lab.gpu_hours_used_this_month, lab.usd_used_this_month) == (0.875, "2.94")
    assert alice.gpu_hours_reserved_this_month == lab.gpu_hours_reserved_this_month == 0
    # And the ends' lease records carry the same GPU-hours
    assert ended_hours(world, "alice") == pytest.approx(alice.gpu_hours_used_this_month, abs=1e-9)
    assert ended_hours(world, "bob") == pytest.approx(bob.gpu_hours_used_this_month, abs=1e-9)


def test_a_live_session_counts_as_reserved_and_only_its_end_as_used(any_world: World):
    # Given one session checked in after 30 min and another still live after 30 min
    world = any_world
    world.ready_host()
    done = checkout(world, ALICE, 3600)
    checkout(world, ALICE, 3600)
    world.clock.advance(1800)
    world.tenancy.checkin(ALICE, done.session_id, CheckinRequest(token=done.token))
    # When alice reads her quota
    quota = world.tenancy.get_quota(ALICE, "me")
    # Then used is what the ended one settled (0.125), and the live one reserves its whole
    # hour (0.25): used + reserved is what the limit checks, nothing counted twice
    assert (quota.gpu_hours_used_this_month, quota.gpu_hours_reserved_this_month) == (0.125, 0.25)
    assert quota.usd_used_this_month == "0.42"  # 30 min of a quarter of 3.36 $/h


def test_a_refusal_quotes_the_used_figure_quota_show_gives(any_world: World):
    # Given alice's month of ends (0.5 GPU-hours used), then a limit of 0.75
    world = any_world
    a_month_of_ends(world)
    world.tenancy.set_quota(ADMIN, "alice", QuotaUpdate(max_sessions=4, max_gpu_hours_per_month=0.75))
    world.ready_host("i-0bbb0002")  # a free slice elsewhere: the first host is drained
    # When she asks for 2 hours of a quarter card (0.5 GPU-hours)
    with pytest.raises(QuotaExceeded) as refused:
        checkout(world, ALICE, 7200)
    # Then the refusal's used is quota show's
    assert refused.value.details["used"] == world.tenancy.get_quota(ALICE, "me").gpu_hours_used_this_month
    assert refused.value.details["used"] == 0.5


def _usage_items(world: World) -> list[dict]:
    items, start = [], None
    while True:
        kw = {"TableName": world.registry.table}  # type: ignore[attr-defined]
        if start:
            kw["ExclusiveStartKey"] = start
        page = world.ddb.scan(**kw)  # type: ignore[attr-defined]
        items += [i for i in page["Items"] if i["sk"]["S"].startswith("USAGE#")]
        start = page.get("LastEvaluatedKey")
        if not start:
            return items


def test_no_end_writes_a_usage_item(dynamo_world: World):
    # Given a month of check-ins, an expiry and forced drain ends, charged to a group
    world = dynamo_world
    a_month_of_ends(world)
    # Then the table holds no USAGE# item of a member or a group: the counters are the record
    assert _usage_items(world) == []
    assert world.tenancy.get_quota(ALICE, "me").gpu_hours_used_this_month == 0.5


def test_a_usage_item_left_from_before_the_counters_is_not_counted(dynamo_world: World):
    # Given a table kept from before the monthly counters: alice's December item says 3
    # GPU-hours, which the limit never counted
    world = dynamo_world
    world.ready_host()
    legacy = {
        "pk": keys.user_pk("alice"),
        "sk": "USAGE#2026-12",
        "gpu_hours": 3,
        "sessions": 2,
        "type": "usage",
    }
    world.ddb.put_item(TableName=world.registry.table, Item=ser(legacy))  # type: ignore[attr-defined]
    # When she checks a 30 min session in and reads her quota
    grant = checkout(world, ALICE, 3600)
    world.clock.advance(1800)
    world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest(token=grant.token))
    # Then used is the counters' figure, the one the limit checks
    assert world.tenancy.get_quota(ALICE, "me").gpu_hours_used_this_month == 0.125

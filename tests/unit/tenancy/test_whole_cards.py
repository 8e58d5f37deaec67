"""Whole cards: backend gpu takes one, gpus N takes N of one host in one write (all or none),
and placement takes the tightest fit (slices before whole cards)."""

from __future__ import annotations

from fractions import Fraction

import pytest
from pydantic import ValidationError

from calque.contracts.agent import session_account
from calque.contracts.tenancy import CheckinRequest, CheckoutRequest, GrantTask, ReclaimTask
from calque.errors import Conflict
from calque.tenancy.store.ports import SliceTaken
from tests.unit.tenancy.conftest import World, member

pytestmark = pytest.mark.unit

ALICE, BOB, CAROL = member("alice"), member("bob"), member("carol")
HOST, OTHER = "i-0aaa0001", "i-0bbb0002"
# g7e.24xlarge: 4 cards of 96 GiB. Cards 0-2 whole, card 3 cut in two MIG slices.
WHOLE_AND_MIG = {"gpus": [{"devices": [0, 1, 2], "exclusive": True}, {"devices": [3], "mig": {"2g.48gb": 2}}]}
FOUR_WHOLE = {"gpus": [{"devices": "all", "exclusive": True}]}


def gpus(n: int, **kw) -> CheckoutRequest:
    return CheckoutRequest(backend="gpu", gpus=n, ttl_seconds=3600, **kw)


def test_a_whole_card_is_checked_out_granted_to_the_sessions_account_and_charged_a_quarter(world: World):
    world.ready_host(instance_type="g7e.24xlarge", layout=WHOLE_AND_MIG)
    grant = world.tenancy.checkout(ALICE, CheckoutRequest(backend="gpu"))
    assert (grant.backend, grant.profile, grant.memory_gib) == ("exclusive", "whole", 96.0)
    assert grant.slice_id in {"g0-whole", "g1-whole", "g2-whole"}
    assert grant.slice_ids == [grant.slice_id]
    assert world.queue.sent[-1] == GrantTask(
        instance_id=HOST,
        slice_id=grant.slice_id,
        fence=1,
        user=session_account(grant.session_id),
        token_sha256=world.registry.sessions[grant.session_id].token_hash,
    )
    # one card of four: a quarter of the instance
    assert world.registry.sessions[grant.session_id].share == "1/4"


def test_gpus_n_takes_n_cards_of_one_host_at_one_fence_and_ends_them_together(world: World):
    world.ready_host(instance_type="g7e.24xlarge", layout=WHOLE_AND_MIG)
    grant = world.tenancy.checkout(ALICE, gpus(3))
    assert sorted(grant.slice_ids) == ["g0-whole", "g1-whole", "g2-whole"]
    assert grant.memory_gib == 288.0
    # every card's UUID in one CUDA_VISIBLE_DEVICES
    assert grant.env["CUDA_VISIBLE_DEVICES"] == ",".join(f"MIG-{HOST}-{s}" for s in grant.slice_ids)
    stored = world.registry.sessions[grant.session_id]
    assert (stored.share, stored.gpu_fraction) == ("3/4", 3.0)
    held = {s.slice_id: (s.state, s.session_id, s.fence) for s in world.registry.slices(HOST)}
    assert {k: v for k, v in held.items() if k.endswith("whole")} == {
        s: ("held", grant.session_id, 1) for s in grant.slice_ids
    }
    # the host is asked to grant each card to the session's one account
    grants = [t for t in world.queue.sent if isinstance(t, GrantTask)]
    assert sorted(t.slice_id for t in grants) == sorted(grant.slice_ids)
    assert {t.user for t in grants} == {session_account(grant.session_id)}
    # all three are gone: a fourth whole card does not exist, even one is refused as busy
    with pytest.raises(Conflict) as busy:
        world.tenancy.checkout(BOB, CheckoutRequest(backend="gpu"))
    assert busy.value.code == "no_free_slice"
    # checked in: every card reclaiming, a reclaim for each at the session's fence
    world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest())
    assert [world.slice_states()[s] for s in grant.slice_ids] == ["reclaiming"] * 3
    reclaims = [t for t in world.queue.sent if isinstance(t, ReclaimTask)]
    assert sorted((t.slice_id, t.fence) for t in reclaims) == sorted((s, 1) for s in grant.slice_ids)
    world.clock.advance(2)
    for s in grant.slice_ids:
        assert world.reclaimed(HOST, s, fence=1).freed == [s]
    assert world.tenancy.checkout(BOB, gpus(3)).state == "live"


def test_gpus_n_is_all_or_nothing_and_never_spans_two_hosts(world: World):
    # Two hosts of four whole cards, three taken on each: two cards free, one on each host
    world.ready_host(HOST, instance_type="g7e.24xlarge", layout=FOUR_WHOLE)
    world.ready_host(OTHER, instance_type="g7e.24xlarge", layout=FOUR_WHOLE)
    world.quota("carol", 10)
    for _ in range(3):
        world.tenancy.checkout(CAROL, CheckoutRequest(backend="gpu", instance_id=HOST))
        world.tenancy.checkout(CAROL, CheckoutRequest(backend="gpu", instance_id=OTHER))
    before = {iid: world.slice_states(iid) for iid in (HOST, OTHER)}
    with pytest.raises(Conflict) as refused:
        world.tenancy.checkout(ALICE, gpus(2))
    assert refused.value.code == "no_free_slice"
    assert refused.value.details["gpus"] == 2
    # the reason counts what is busy, not every card that fits (two of the eight are free)
    assert refused.value.message == (
        "no host has 2 whole GPUs free at once right now: of the 8 that fit, 6 are in use or "
        "being reclaimed; try again later, or wait in line for one (calque session checkout ... --wait)"
    )
    assert {iid: world.slice_states(iid) for iid in (HOST, OTHER)} == before
    # more cards than any host has: nothing can ever fit
    with pytest.raises(Conflict) as never:
        world.tenancy.checkout(ALICE, gpus(5))
    assert never.value.code == "nothing_fits"
    assert never.value.message.startswith(
        "nothing can fit: no host has 5 whole GPUs (cards laid out exclusive); "
    )
    with pytest.raises(Conflict) as never:
        world.tenancy.checkout(ALICE, gpus(5, instance_id=HOST))
    assert never.value.message.startswith(
        f"nothing can fit: host {HOST} does not have 5 whole GPUs (cards laid out exclusive); its slices: "
    )


def test_a_card_taken_between_read_and_write_fails_the_whole_grant(world: World):
    world.ready_host(instance_type="g7e.24xlarge", layout=FOUR_WHOLE)
    real = world.registry.grant
    raced = []

    def grant_after_a_racer(sl, session, **kw):
        extra = kw.get("extra", ())
        if extra and not raced:
            # another member takes the last card read, just before this write
            raced.append(world.tenancy.checkout(BOB, CheckoutRequest(backend="gpu", instance_id=HOST)))
        return real(sl, session, **kw)

    world.registry.grant = grant_after_a_racer  # type: ignore[method-assign]
    with pytest.raises(Conflict):
        world.tenancy.checkout(ALICE, gpus(4))
    states = world.slice_states()
    # Bob's one card is held; none of the others was taken by the failed grant
    assert sorted(states.values()) == ["free", "free", "free", "held"]
    assert world.registry.sessions.keys() == {raced[0].session_id}


def test_memory_store_refuses_a_grant_when_one_extra_card_is_not_free(world: World):
    world.ready_host(instance_type="g7e.24xlarge", layout=FOUR_WHOLE)
    bob = world.tenancy.checkout(BOB, CheckoutRequest(backend="gpu", instance_id=HOST))
    slices = world.registry.slices(HOST)
    free = [s for s in slices if s.state == "free"]
    taken = next(s for s in world.registry.slices(HOST) if s.slice_id == bob.slice_id)
    stored = world.registry.sessions[bob.session_id]
    with pytest.raises(SliceTaken):
        world.registry.grant(
            free[0],
            stored.model_copy(update={"session_id": "s-00000000000000ff"}),
            default_max_sessions=5,
            reservation=None,  # type: ignore[arg-type]
            event=None,  # type: ignore[arg-type]
            extra=[taken.model_copy(update={"state": "free", "fence": 0})],
        )
    assert world.slice_states()[free[0].slice_id] == "free"


def test_tightest_fit_takes_a_free_slice_before_a_whole_card(world: World):
    world.ready_host(instance_type="g7e.24xlarge", layout=WHOLE_AND_MIG)
    world.quota("alice", 10)
    # a request a 48 GiB slice serves takes the slices first, then whole cards
    got = [world.tenancy.checkout(ALICE, CheckoutRequest(backend="any", min_memory_gib=40)) for _ in range(3)]
    assert [g.backend for g in got] == ["mig", "mig", "exclusive"]
    # and one no slice can serve goes straight to a whole card
    big = world.tenancy.checkout(ALICE, CheckoutRequest(backend="any", min_memory_gib=60))
    assert big.backend == "exclusive"


def test_gpus_n_prefers_the_host_it_fills_tightest(world: World):
    world.ready_host(HOST, instance_type="g7e.24xlarge", layout=FOUR_WHOLE)
    world.ready_host(OTHER, instance_type="g7e.24xlarge", layout=FOUR_WHOLE)
    world.tenancy.checkout(CAROL, CheckoutRequest(backend="gpu", instance_id=OTHER))
    world.tenancy.checkout(CAROL, CheckoutRequest(backend="gpu", instance_id=OTHER))
    # OTHER has exactly two free: a pair goes there, keeping HOST's four whole
    pair = world.tenancy.checkout(ALICE, gpus(2))
    assert pair.instance_id == OTHER
    assert world.tenancy.checkout(BOB, gpus(4)).instance_id == HOST


def test_several_gpus_are_whole_cards_only():
    with pytest.raises(ValidationError, match="backend gpu"):
        CheckoutRequest(backend="mig", gpus=2)
    with pytest.raises(ValidationError):
        CheckoutRequest(backend="gpu", gpus=9)


def test_usage_charges_n_cards_at_their_share_of_the_instance(world: World):
    from calque.accounting.history import leases

    world.ready_host(instance_type="g7e.24xlarge", layout=FOUR_WHOLE)
    grant = world.tenancy.checkout(ALICE, gpus(3))
    world.clock.advance(3600)
    world.tenancy.checkin(ALICE, grant.session_id, CheckinRequest())
    from datetime import timedelta

    now = world.clock()
    found = leases(
        world.registry, since=now - timedelta(days=1), until=now, now=now, lookback=timedelta(days=1)
    )
    assert [(x.session_id, x.share) for x in found] == [(grant.session_id, Fraction(3, 4))]


def test_one_cards_failed_grant_is_not_undone_by_another_cards_success(world: World):
    from calque.contracts.agent import AgentError, GrantReport

    world.ready_host(instance_type="g7e.24xlarge", layout=FOUR_WHOLE)
    grant = world.tenancy.checkout(ALICE, gpus(2))
    first, second = grant.slice_ids
    account = session_account(grant.session_id)
    world.report(
        HOST, "grant", ok=False, fence=1,
        error=AgentError(code="host_busy", message="busy", details={"slice_id": first, "account": account}),
    )  # fmt: skip
    card = GrantReport(
        slice_id=second,
        account=account,
        backend="exclusive",
        device_files=["/dev/nvidia1"],
        imds_blocked=True,
    )
    world.report(HOST, "grant", fence=1, grant=card)
    shown = world.tenancy.get_session(ALICE, grant.session_id).host_access
    assert shown is not None
    assert (shown.state, shown.reason) == ("failed", "host_busy: busy")


def test_a_refusal_counting_one_busy_card_speaks_of_one(world: World):
    # "of the 4 that fit, 1 are in use", "the 1 that fit are in use": the count decides the verb
    world.ready_host(HOST, instance_type="g7e.24xlarge", layout=FOUR_WHOLE)
    world.quota("carol", 10)
    world.tenancy.checkout(CAROL, CheckoutRequest(backend="gpu", instance_id=HOST))
    with pytest.raises(Conflict) as several:
        world.tenancy.checkout(ALICE, gpus(4))
    assert "of the 4 that fit, 1 is in use or being reclaimed" in several.value.message
    world.ready_host(
        OTHER, instance_type="g7e.2xlarge", layout={"gpus": [{"devices": [0], "exclusive": True}]}
    )
    world.tenancy.checkout(CAROL, CheckoutRequest(backend="gpu", instance_id=OTHER))
    with pytest.raises(Conflict) as one:
        world.tenancy.checkout(ALICE, CheckoutRequest(backend="gpu", instance_id=OTHER))
    assert one.value.code == "no_free_slice"
    assert "the one that fits is in use or being reclaimed" in one.value.message

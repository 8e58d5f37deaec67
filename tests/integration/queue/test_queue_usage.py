"""Fair share counts every grant, not only the queue's: a check-out made at once and an
extend charge their account as a grant from the queue does, so a group that took slices
at once waits behind one that did not."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from calque.contracts.queue import QueueRequest
from calque.contracts.tenancy import CheckinRequest, CheckoutRequest, ExtendRequest

from .support import ADMIN, env, make_group, member, reclaim_all, seed_host

pytestmark = pytest.mark.integration


def usage_of(t, account: str) -> float:
    return next((a["usage_gpu_hours"] for a in t.fair_share(ADMIN) if a["account"] == account), 0.0)


def test_checkouts_at_once_and_extends_count_in_fair_share(ddb):
    t = env(ddb)
    iid = seed_host(ddb, 41)
    make_group(ddb, "took", ["tina"])
    make_group(ddb, "waited", ["wade"])
    # Given a member of "took" checks a slice out at once for 10 minutes
    taken = t.checkout(member("tina"), CheckoutRequest(backend="mig", ttl_seconds=600, group="took"))
    share = t.registry.get_session(taken.session_id).gpu_fraction
    assert share > 0
    # Then the group's usage holds the slice's share of a card for the TTL
    assert usage_of(t, "took") == pytest.approx(share * 600 / 3600, abs=2e-6)
    # and an extend by 10 minutes adds as much again (a replay of it adds nothing)
    t.extend(member("tina"), taken.session_id, ExtendRequest(ttl_seconds=600), idempotency_key="ext-key-01")
    t.extend(member("tina"), taken.session_id, ExtendRequest(ttl_seconds=600), idempotency_key="ext-key-01")
    assert usage_of(t, "took") == pytest.approx(share * 1200 / 3600, abs=2e-6)
    # and a check-out replayed with its key is charged once
    key = "checkout-key-01"
    again = [
        t.checkout(
            member("tina"), CheckoutRequest(backend="mig", ttl_seconds=600, group="took"), idempotency_key=key
        )
        for _ in range(2)
    ]
    assert again[0].session_id == again[1].session_id
    assert usage_of(t, "took") == pytest.approx(share * 1800 / 3600, abs=2e-6)

    # When the rest of the host is held, and "took" queues before "waited" does
    others = [
        t.checkout(member(f"keep{n}"), CheckoutRequest(backend="mig", ttl_seconds=600)) for n in range(2)
    ]
    first = t.enqueue(member("tina"), QueueRequest(backend="mig", ttl_seconds=600, group="took"))
    second = t.enqueue(member("wade"), QueueRequest(backend="mig", ttl_seconds=600, group="waited"))
    assert (first.state, second.state) == ("waiting", "waiting")
    # Then "waited", under its share, is first in line, and gets the next slice that frees
    assert t.get_request(member("wade"), second.request_id).position == 1
    t.checkin(member("keep0"), others[0].session_id, CheckinRequest(token=others[0].token))
    assert reclaim_all(t, iid) == 1
    assert t.get_request(member("wade"), second.request_id).state == "granted"
    assert t.get_request(member("tina"), first.request_id).state == "waiting"
    # and the grant from the queue is charged once too (in its own transaction)
    assert usage_of(t, "waited") == pytest.approx(share * 600 / 3600, abs=2e-6)


def test_a_charge_rescales_usage_kept_at_an_older_reference(ddb):
    from calque.tenancy import fairshare

    half_life = 3600.0
    t = env(ddb, queue_half_life_s=int(half_life))
    seed_host(ddb, 42)
    make_group(ddb, "olden", ["otto"])
    # Given the group's usage kept at the reference of a span long gone: 4 GPU-hours then
    now = datetime.now(UTC).timestamp()
    old_ref = fairshare.ref_for(now, half_life) - 2 * fairshare.REF_SPAN * half_life
    assert t.registry.rebase_usage("olden", old_ref=None, value=4.0, ref=old_ref, half_life_s=half_life)
    # When a member checks out at once (the charge is weighed for this span's reference)
    taken = t.checkout(member("otto"), CheckoutRequest(backend="mig", ttl_seconds=3600, group="olden"))
    share = t.registry.get_session(taken.session_id).gpu_fraction
    # Then the check-out is granted, the account is rescaled to this span, and its usage is
    # the old figure decayed to now plus the new charge
    acct = t.registry.get_account("olden")
    assert acct.usage_ref == fairshare.ref_for(now, half_life)
    decayed = 4.0 * 2.0 ** (-(now - old_ref) / half_life)
    assert usage_of(t, "olden") == pytest.approx(decayed + share, abs=1e-3)
    # and an extend in the same span charges without rescaling again
    t.extend(member("otto"), taken.session_id, ExtendRequest(ttl_seconds=3600))
    assert usage_of(t, "olden") == pytest.approx(decayed + 2 * share, abs=1e-3)


def test_a_deleted_groups_account_is_not_listed_until_the_group_is_back(ddb):
    from calque.contracts.economics import GroupCreate
    from calque.members.groups import Groups

    t = env(ddb)
    seed_host(ddb, 43)
    make_group(ddb, "gone", ["gail"])
    make_group(ddb, "stays", ["sam"])
    # Given a group that was charged a grant, its member removed and the group deleted
    taken = t.checkout(member("gail"), CheckoutRequest(backend="mig", ttl_seconds=600, group="gone"))
    t.checkin(member("gail"), taken.session_id, CheckinRequest(token=taken.token))
    groups = Groups(t.registry, clock=t.clock)
    groups.remove(ADMIN, "gone", ["gail"])
    groups.delete(ADMIN, "gone")
    # Then group fairshare lists the groups there are, not the deleted one
    assert "gone" not in [a["account"] for a in t.fair_share(ADMIN)]
    # and a group created again under the name has its account (and usage) back
    groups.create(ADMIN, GroupCreate(name="gone"))
    assert usage_of(t, "gone") > 0


def test_a_deleted_groups_usage_weighs_on_nobody_elses_share(ddb):
    from calque.members.groups import Groups

    t = env(ddb)
    seed_host(ddb, 44)
    make_group(ddb, "went", ["gwen"])
    make_group(ddb, "kept", ["kit"])
    # Given two groups charged a grant each, one of them then emptied and deleted
    for who, group in (("gwen", "went"), ("kit", "kept")):
        taken = t.checkout(member(who), CheckoutRequest(backend="mig", ttl_seconds=600, group=group))
        t.checkin(member(who), taken.session_id, CheckinRequest(token=taken.token))
    before = {a["account"]: a["fairshare"] for a in t.fair_share(ADMIN)}
    groups = Groups(t.registry, clock=t.clock)
    groups.remove(ADMIN, "went", ["gwen"])
    groups.delete(ADMIN, "went")
    # Then every factor is Slurm's 2 ** (-U / S) over the accounts there are, as if "went" had
    # never been: the same sums less its shares and its usage
    listed = {a["account"]: a for a in t.fair_share(ADMIN)}
    assert "went" in before
    assert "went" not in listed
    shares = sum(a["shares"] for a in listed.values())
    usage = sum(a["usage_gpu_hours"] for a in listed.values())
    for a in listed.values():
        expected = 2.0 ** (-(a["usage_gpu_hours"] / usage) / (a["shares"] / shares))
        assert a["fairshare"] == pytest.approx(expected, abs=2e-6), a["account"]
    assert listed["kept"]["fairshare"] != pytest.approx(before["kept"], abs=2e-6)


def test_usage_weighed_with_another_half_life_reads_as_what_it_was(ddb):
    from calque.tenancy import fairshare

    seed_host(ddb, 45)
    make_group(ddb, "halved", ["hal"])
    # Given a group that used 4 GPU-hours, kept (as a deployment with a one-minute half-life
    # keeps it) scaled to a reference ten half-lives ago
    now = datetime.now(UTC).timestamp()
    short = env(ddb, queue_half_life_s=60)
    kept = 4.0 * 2**10
    assert short.registry.rebase_usage("halved", old_ref=None, value=kept, ref=now - 600, half_life_s=60)
    assert usage_of(short, "halved") == pytest.approx(4.0, rel=0.05)
    # When the deployment's half-life becomes a week
    week = env(ddb, queue_half_life_s=7 * 86400)
    # Then its usage still reads about 4 GPU-hours, not the 4,096 of its sum read with a week
    assert usage_of(week, "halved") == pytest.approx(4.0, rel=0.05)
    # and a check-out charged with the week's half-life rescales it, and adds to it
    taken = week.checkout(member("hal"), CheckoutRequest(backend="mig", ttl_seconds=3600, group="halved"))
    share = week.registry.get_session(taken.session_id).gpu_fraction
    acct = week.registry.get_account("halved")
    assert (acct.usage_ref, acct.usage_hl) == (fairshare.ref_for(now, 7 * 86400), 7 * 86400)
    assert usage_of(week, "halved") == pytest.approx(4.0 + share, rel=0.05)

"""A monthly limit's refusal quotes its figures to the cent, as quota show and group show do,
but never where the cents would hide why it was refused: then as the counters keep them."""

from __future__ import annotations

import pytest

from calque.contracts.economics import GroupCreate, GroupLimits
from calque.contracts.tenancy import CheckinRequest, CheckoutRequest, ExtendRequest
from calque.errors import QuotaExceeded
from calque.members.groups import Groups
from calque.members.limits import usd_exact
from tests.unit.tenancy.conftest import ADMIN, World, member

pytestmark = pytest.mark.unit

BOB = member("bob")


def test_a_refusal_near_a_dollar_limit_quotes_figures_that_pass_it(world: World):
    # Given a group budget of 0.05 USD and a 1g.24gb slice at 0.84 USD an hour
    world.ready_host()
    g = Groups(world.registry, clock=world.clock)
    g.create(ADMIN, GroupCreate(name="tight", max_usd_per_month=0.05))
    g.add(ADMIN, "tight", ["bob"])
    # When bob asks for 215 s (0.050167 USD, one more second than fits)
    with pytest.raises(QuotaExceeded) as refused:
        world.tenancy.checkout(BOB, CheckoutRequest(backend="mig", ttl_seconds=215))
    # Then the refusal says what passes the limit (to the cent: "0.05 more" of 0.05)
    d = refused.value.details
    assert (d["used"], d["reserved"], d["asked"]) == ("0.00", "0.00", "0.050167")
    assert "would reserve 0.050167 more" in refused.value.message
    # When 214 s (0.049934) are granted and one second more (0.000234) is asked
    world.tenancy.checkout(BOB, CheckoutRequest(backend="mig", ttl_seconds=214))
    with pytest.raises(QuotaExceeded) as refused:
        world.tenancy.checkout(BOB, CheckoutRequest(backend="mig", ttl_seconds=10))
    # Then its figures add up past the limit, as the decision did (to the cent they read
    # 0.05 reserved and 0.00 asked of 0.05, as if they fitted)
    d = refused.value.details
    assert (d["used"], d["reserved"], d["asked"]) == ("0.00", "0.049934", "0.002334")
    assert "reserve 0.049934 of 0.05 USD" in refused.value.message
    assert "would reserve 0.002334 more" in refused.value.message


def test_a_refusal_the_cents_explain_quotes_the_cents(world: World):
    # Given the same budget, 0.042 of it reserved (180 s)
    world.ready_host()
    g = Groups(world.registry, clock=world.clock)
    g.create(ADMIN, GroupCreate(name="tight", max_usd_per_month=0.05))
    g.add(ADMIN, "tight", ["bob"])
    world.tenancy.checkout(BOB, CheckoutRequest(backend="mig", ttl_seconds=180))
    # When a 10-minute check-out (0.14) is refused, its cents (0.04 + 0.14 > 0.05) say why
    with pytest.raises(QuotaExceeded) as refused:
        world.tenancy.checkout(BOB, CheckoutRequest(backend="mig", ttl_seconds=600))
    d = refused.value.details
    assert (d["used"], d["reserved"], d["asked"]) == ("0.00", "0.04", "0.14")


@pytest.mark.parametrize(
    ("musd", "shown"),
    [(0, "0.00"), (840_000, "0.84"), (1_000_000, "1.00"), (1_988_000, "1.988"), (49_934, "0.049934"),
     (1, "0.000001"), (123_456_789, "123.456789"), (250_000_000, "250.00")],
)  # fmt: skip
def test_micro_dollars_are_shown_with_the_cents_and_every_digit_that_counts(musd: int, shown: str):
    assert usd_exact(musd) == shown


def test_a_refusal_gives_only_the_advice_that_can_help(world: World):
    # Given bob's group budget of 1.68 USD (two hours) and an hour of his checked out
    world.ready_host()
    g = Groups(world.registry, clock=world.clock)
    g.create(ADMIN, GroupCreate(name="lab", max_usd_per_month=1.68))
    g.add(ADMIN, "lab", ["bob"])
    grant = world.tenancy.checkout(BOB, CheckoutRequest(backend="mig", ttl_seconds=3600))
    # While the month has room, a shorter time may fit: the refusal says so
    with pytest.raises(QuotaExceeded) as refused:
        world.tenancy.checkout(BOB, CheckoutRequest(backend="mig", ttl_seconds=7200))
    assert "ask for a shorter --ttl, check a live session in" in refused.value.message
    # When an admin lowers the budget below what is reserved, no extension however short fits
    g.set_limits(ADMIN, "lab", GroupLimits(max_usd_per_month=0.5))
    with pytest.raises(QuotaExceeded) as refused:
        world.tenancy.extend(BOB, grant.session_id, ExtendRequest(ttl_seconds=10))
    assert "shorter" not in refused.value.message
    assert "; check a live session in (calque session list" in refused.value.message
    # And once the hour was used and checked in, nothing but the next month or the admin helps
    world.clock.advance(3600)
    world.tenancy.checkin(BOB, grant.session_id, CheckinRequest())
    with pytest.raises(QuotaExceeded) as refused:
        world.tenancy.checkout(BOB, CheckoutRequest(backend="mig", ttl_seconds=60))
    message = refused.value.message
    assert "shorter" not in message
    assert "check a live session in" not in message
    assert message.endswith(
        "; wait for next month, or ask an admin to raise it (calque group limits lab --max-usd-per-month X)"
    )


def test_group_show_counts_gpu_hours_as_its_refusals_quote_them(world: World):
    # Given a group whose member used 14 s of a quarter card (0.000972 GPU-hours)
    world.ready_host()
    g = Groups(world.registry, clock=world.clock)
    g.create(ADMIN, GroupCreate(name="lab", max_gpu_hours_per_month=0.001))
    g.add(ADMIN, "lab", ["bob"])
    grant = world.tenancy.checkout(BOB, CheckoutRequest(backend="mig", ttl_seconds=14))
    world.clock.advance(14)
    world.tenancy.checkin(BOB, grant.session_id, CheckinRequest())
    # When the next check-out is refused
    with pytest.raises(QuotaExceeded) as refused:
        world.tenancy.checkout(BOB, CheckoutRequest(backend="mig", ttl_seconds=60))
    # Then group show's used figure is the one the refusal quotes (not rounded to 0.001)
    assert refused.value.details["used"] == 0.000972
    assert g.show(ADMIN, "lab").gpu_hours_used_this_month == 0.000972

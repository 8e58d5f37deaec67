"""``calque.session.expiring``: published once per expiry, the configured time before it."""

from __future__ import annotations

from calque.contracts.tenancy import CheckoutRequest, ExtendRequest
from calque.events import RecordingPublisher
from tests.unit.tenancy.conftest import World, member


def test_the_reaper_announces_a_session_about_to_expire_once_per_expiry(dynamo_world: World):
    world = dynamo_world
    world.ready_host("i-00000001")
    events = RecordingPublisher()
    world.tenancy.publisher = events
    grant = world.tenancy.checkout(member("m1"), CheckoutRequest(backend="mig", ttl_seconds=1200))
    # 20 minutes left: more than the 10-minute notice, nothing said
    world.tenancy.reap()
    assert events.of("calque.session.expiring") == []
    world.clock.advance(700)
    world.tenancy.reap()
    world.tenancy.reap()
    said = events.of("calque.session.expiring")
    assert [e["session_id"] for e in said] == [grant.session_id]
    # an extend makes a new expiry, announced again when it nears
    world.tenancy.extend(member("m1"), grant.session_id, ExtendRequest(token=grant.token, ttl_seconds=1200))
    world.tenancy.reap()
    assert len(events.of("calque.session.expiring")) == 1
    world.clock.advance(1200)
    world.tenancy.reap()
    assert len(events.of("calque.session.expiring")) == 2


def test_every_session_about_to_expire_is_announced_even_past_the_first_page(dynamo_world: World):
    """More sessions near their end than the reaper reads in one page: the first page holds
    the soonest, announced by an earlier run; the later ones are announced all the same."""
    world = dynamo_world
    for n in range(2):
        world.ready_host(f"i-0000000{n + 1}")
    world.tenancy.config = world.tenancy.config._replace(list_limit=3)
    events = RecordingPublisher()
    world.tenancy.publisher = events
    first = [
        world.tenancy.checkout(member(f"a{n}"), CheckoutRequest(backend="mig", ttl_seconds=900)).session_id
        for n in range(3)
    ]
    world.clock.advance(60)
    later = [
        world.tenancy.checkout(member(f"b{n}"), CheckoutRequest(backend="mig", ttl_seconds=900)).session_id
        for n in range(3)
    ]
    world.clock.advance(400)  # all six end within the 10-minute notice
    world.tenancy.reap()
    world.tenancy.reap()
    said = [e["session_id"] for e in events.of("calque.session.expiring")]
    assert sorted(said) == sorted(first + later)

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

"""The host lifecycle on the DynamoDB adapter: deregistration is conditional and complete."""

from __future__ import annotations

import pytest

from calque.contracts.hosts import HostRegistration
from calque.contracts.tenancy import CheckoutRequest
from calque.members.ports import StaleWrite
from tests.unit.tenancy.conftest import ADMIN, World, member

pytestmark = pytest.mark.unit

HOST = "i-0aaa0001"


def _items_of(world: World, instance_id: str) -> list[dict]:
    items = world.ddb.scan(TableName=world.registry.table)["Items"]  # type: ignore[attr-defined]
    return [i for i in items if instance_id in i["pk"]["S"] or instance_id in i["sk"]["S"]]


def test_forced_deregister_on_dynamodb_removes_host_and_slices_and_keeps_the_events(dynamo_world: World):
    # Given a ready host with a live session
    dynamo_world.ready_host(HOST)
    grant = dynamo_world.tenancy.checkout(member("alice"), CheckoutRequest(backend="mig"))

    # When an admin deregisters it with force
    out = dynamo_world.tenancy.lifecycle().deregister(ADMIN, HOST, force=True, reason=None)

    # Then the session ended, no host or slice item is left, and the lease history stays
    assert out.ended_sessions == [grant.session_id]
    assert [i for i in _items_of(dynamo_world, HOST) if i["type"]["S"] in ("host", "slice")] == []
    day = f"{dynamo_world.clock():%Y-%m-%d}"
    kinds = [e.kind for e in dynamo_world.registry.events_on(day)]
    assert "granted" in kinds
    assert "deregistered" in kinds


def test_delete_host_refuses_while_a_slice_is_held(dynamo_world: World):
    dynamo_world.ready_host(HOST)
    dynamo_world.tenancy.checkout(member("alice"), CheckoutRequest(backend="mig"))
    host = dynamo_world.registry.get_host(HOST)

    with pytest.raises(StaleWrite):
        dynamo_world.registry.delete_host(host, dynamo_world.registry.slices(HOST))

    assert dynamo_world.registry.get_host(HOST) is not None
    assert any(s.state == "held" for s in dynamo_world.registry.slices(HOST))


def test_a_host_with_more_slices_than_one_transaction_is_forgotten_whole(dynamo_world: World):
    # 8 GPUs with 20 MPS slots each: 160 slices, more than one transaction holds
    dynamo_world.tenancy.register_host(
        ADMIN,
        HostRegistration.model_validate(
            {
                "instance_id": HOST,
                "instance_type": "g6e.48xlarge",
                "layout": {"version": "v1", "gpus": [{"devices": "all", "mps": {"clients": 20}}]},
            }
        ),
    )
    assert len(dynamo_world.registry.slices(HOST)) == 160

    dynamo_world.tenancy.lifecycle().deregister(ADMIN, HOST, force=False, reason=None)

    assert dynamo_world.registry.get_host(HOST) is None
    assert dynamo_world.registry.slices(HOST) == []

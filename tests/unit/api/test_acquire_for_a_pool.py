"""POST /v1/hosts/acquire takes no `pool`: only a warm pool's scaler, in process, acquires
for a pool (an instance asked for a pool through the API would be neither a host nor a worker
of the pool, and run, charged, until released)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.api.test_bad_input import assert_error_shape, call
from tests.unit.api.test_bad_input import world as world  # the fixture, shared

pytestmark = pytest.mark.unit


def test_an_acquisition_for_a_pool_is_refused_from_the_api_before_anything_is_reserved(world, monkeypatch):
    # Given a fleet that would reserve and launch what it is asked for
    import functions.api.routes.fleet as fleet_routes

    asked: list[Any] = []
    monkeypatch.setattr(fleet_routes, "fleet", lambda: asked.append("fleet") or pytest.fail("reached"))
    # When an admin asks for an instance tagged for a warm pool (which only a pool's scaler, in
    # process, may do: such an instance is neither a host nor a worker of the pool)
    status, doc, _ = call(
        "POST",
        "/v1/hosts/acquire",
        user="admin",
        body={"instance_type": "g7e.2xlarge", "accept_spend": True, "pool": "llama"},
    )
    # Then it is refused, naming the field, and the fleet is never asked
    err = assert_error_shape(doc)
    assert (status, err["code"]) == (422, "validation_failed")
    assert err["details"]["fields"][0]["field"] == "pool"
    assert "warm pool's scaler" in err["message"]
    assert asked == []


def test_the_api_document_does_not_offer_pool_on_an_acquisition():
    from calque.contracts.fleet import AcquireRequest

    assert "pool" not in AcquireRequest.model_json_schema()["properties"]

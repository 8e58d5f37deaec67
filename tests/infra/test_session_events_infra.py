"""Every function that starts or ends sessions publishes calque.session.* itself: it is told
the bus and may PutEvents on the default bus, and on nothing else."""

from __future__ import annotations

import json

import pytest

from calque import resources

from .conftest import Synthesized, resources_of
from .test_fleet_infra import _actions, _function_role, _role_statements

pytestmark = pytest.mark.infra

# api: check-out, check-in, drain, deregister; reaper: expiry; the fleet's functions and the
# pools' (which release hosts through the fleet): the sessions a release, a TTL, a spot
# interruption or a lost host ends.
PUBLISHERS = ("api", "reaper", "acquirer", "fleet_events", "reconciler", "pool_scaler", "pool_dlq")


@pytest.mark.parametrize("function_id", PUBLISHERS)
def test_each_function_that_ends_sessions_may_put_events_on_the_default_bus_only(
    synthesized: Synthesized, function_id: str
):
    template = synthesized.service_json
    handler = resources.function(function_id).handler
    (fn,) = [
        f for f in resources_of(template, "AWS::Lambda::Function") if f["Properties"]["Handler"] == handler
    ]
    assert fn["Properties"]["Environment"]["Variables"][resources.ENV_EVENT_BUS] == "default"
    statements = _role_statements(template)[_function_role(template, function_id)]
    put = [s for s in statements if "events:PutEvents" in _actions(s)]
    assert put, f"{function_id} may not PutEvents"
    for s in put:
        assert s["Effect"] == "Allow"
        assert _actions(s) == {"events:PutEvents"}
        assert "event-bus/default" in json.dumps(s["Resource"])
        assert "*" not in json.dumps(s["Resource"])

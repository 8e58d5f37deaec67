"""A 422's message names each field with its own problem."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

pytestmark = pytest.mark.unit


def _message(model, **fields) -> dict:
    from functions.api.errors import from_validation

    with pytest.raises(ValidationError) as exc:
        model(**fields)
    return json.loads(from_validation(list(exc.value.errors())).body)["error"]


def test_two_fields_over_their_limits_are_each_said_with_their_own_limit():
    from calque.contracts.fleet import BudgetUpdate

    # Given an admin who asks for a budget with both numbers over their (different) maxima
    error = _message(BudgetUpdate, max_instances=10**12, max_hourly_usd=1e30)

    # Then the one-line message says each field's own limit, not the first field's for both
    assert error["message"] == (
        "invalid max_instances: Input should be less than or equal to 10000; "
        "max_hourly_usd: Input should be less than or equal to 1000000"
    )
    assert [f["field"] for f in error["details"]["fields"]] == ["max_instances", "max_hourly_usd"]


def test_one_field_reads_as_before():
    from calque.contracts.fleet import BudgetUpdate

    error = _message(BudgetUpdate, max_instances=10**12, max_hourly_usd=1)

    assert error["message"] == "invalid max_instances: Input should be less than or equal to 10000"

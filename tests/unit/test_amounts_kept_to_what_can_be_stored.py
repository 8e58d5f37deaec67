"""Amounts that reach DynamoDB are kept to what it can store and what can be billed: a
value that rounds to nothing is refused with the field named, never a 500 later."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from calque.contracts.economics import GroupCreate, GroupLimits
from calque.contracts.fleet import AcquireRequest, BudgetUpdate
from calque.contracts.quotas import QuotaUpdate

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("model", "body", "field", "said"),
    [
        (
            GroupCreate,
            {"name": "lab", "max_gpu_hours_per_month": 1.9e-267},
            "max_gpu_hours_per_month",
            "must be 0 or at least 0.001 GPU-hours",
        ),
        (GroupLimits, {"max_usd_per_month": 5e-324}, "max_usd_per_month", "must be 0 or at least 0.01 USD"),
        (
            BudgetUpdate,
            {"max_instances": 1, "max_hourly_usd": 5e-324},
            "max_hourly_usd",
            "must be 0 or at least 0.01 USD",
        ),
        # a spot max price of 0 is refused too (more than 0): the refusal does not offer it,
        # and names the smallest price as a price, not as 1e-05
        (
            AcquireRequest,
            {"instance_type": "g6e.xlarge", "spot": True, "spot_max_price": 1e-200},
            "spot_max_price",
            "must be at least 0.00001 USD/hour",
        ),
        (
            AcquireRequest,
            {"instance_type": "g6e.xlarge", "spot": True, "spot_max_price": 0.000001},
            "spot_max_price",
            "must be at least 0.00001 USD/hour",
        ),
    ],
)
def test_an_amount_that_rounds_to_nothing_is_refused_naming_its_field(model, body, field, said):
    with pytest.raises(ValidationError) as refused:
        model.model_validate(body)
    assert refused.value.errors()[0]["loc"] == (field,)
    assert said in refused.value.errors()[0]["msg"]


def test_amounts_are_kept_to_a_cent_and_gpu_hours_to_a_thousandth():
    assert BudgetUpdate.model_validate({"max_instances": 1, "max_hourly_usd": 12.34}).max_hourly_usd == 12.34
    # a float's own noise is not a finer amount (0.1 + 0.2 is 0.30000000000000004)
    assert (
        BudgetUpdate.model_validate({"max_instances": 1, "max_hourly_usd": 0.1 + 0.2}).max_hourly_usd == 0.3
    )
    limits = GroupLimits.model_validate({"max_usd_per_month": 0.0, "max_gpu_hours_per_month": 2.004})
    assert (limits.max_usd_per_month, limits.max_gpu_hours_per_month) == (0.0, 2.004)


@pytest.mark.parametrize(
    ("model", "body", "field", "said"),
    [
        (BudgetUpdate, {"max_instances": 1, "max_hourly_usd": 12.345}, "max_hourly_usd", "2 decimal places"),
        (GroupLimits, {"max_gpu_hours_per_month": 2.0004}, "max_gpu_hours_per_month", "3 decimal places"),
        (QuotaUpdate, {"max_sessions": 1, "max_usd_per_month": 1.005}, "max_usd_per_month", "got 1.005"),
        (
            QuotaUpdate,
            {"max_sessions": 1, "max_gpu_hours_per_month": 0.0006},
            "max_gpu_hours_per_month",
            "0.001",
        ),
    ],
)
def test_an_amount_given_more_finely_than_it_is_kept_is_refused_not_rounded(model, body, field, said):
    # 1.005 USD would be stored as 1.00 and shown back as what was set: refused, naming the field
    with pytest.raises(ValidationError) as refused:
        model.model_validate(body)
    assert refused.value.errors()[0]["loc"] == (field,)
    assert said in refused.value.errors()[0]["msg"]

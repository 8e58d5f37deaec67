"""A host's report carries its own clock's times and the fence it was sent: out-of-range values
(a year 9999 start, a 41-digit fence) were answered 500 (the date arithmetic overflowed, the
store could not hold the number); they are refused by name (422), and nothing changes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from calque.contracts.agent import AgentReport

pytestmark = pytest.mark.unit

REPORT = {
    "instance_id": "i-0aaa0001",
    "verb": "reclaim",
    "ok": True,
    "started_at": "2026-12-02T10:00:00Z",
    "finished_at": "2026-12-02T10:00:01Z",
    "reclaimed_slice_id": "g0-1g.24gb-1",
    "fence": 3,
}


def test_a_report_in_range_is_read():
    assert AgentReport.model_validate(REPORT).fence == 3


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("started_at", "9999-12-31T23:59:59Z", "check its clock"),
        ("finished_at", "1970-01-01T00:00:00Z", "check its clock"),
        ("fence", 10**40, "less than or equal"),
        ("fence", -1, "greater than or equal"),
    ],
)
def test_a_value_no_real_host_sends_is_refused_by_name(field, value, says):
    with pytest.raises(ValidationError) as refused:
        AgentReport.model_validate({**REPORT, field: value})
    (error,) = refused.value.errors()
    assert error["loc"] == (field,)
    assert says in error["msg"]


@pytest.mark.parametrize(
    ("model", "doc"),
    [
        ("WorkerReport", {"instance_id": "i-0aaa0001", "state": "idle", "enter_seconds": 1e308}),
        ("WorkerReport", {"instance_id": "i-0aaa0001", "state": "idle", "enter_seconds": -1}),
        (
            "ClaimReport",
            {"event": "started", "worker_id": "w1", "instance_id": "i-0aaa0001", "attempt": 10**40},
        ),
    ],
)
def test_pool_reports_out_of_range_are_refused(model, doc):
    """A worker's report with a 1e308 s enter or a 41-digit attempt answered 500 (a number the
    store could not hold); refused by name (422)."""
    from calque.contracts import pools

    with pytest.raises(ValidationError):
        getattr(pools, model).model_validate(doc)
    ok = {**doc, "enter_seconds": 12.5} if model == "WorkerReport" else {**doc, "attempt": 3}
    getattr(pools, model).model_validate(ok)

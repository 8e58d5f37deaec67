"""`calque usage`: the table, the JSON document and the CSV carry the same figures."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime

import pytest

from calque.accounting.service import Usage
from calque.cli.commands.usage import CSV_LINE_COLUMNS, CSV_ROW_COLUMNS
from calque.contracts.economics import UsageQuery
from calque.contracts.tenancy import CheckinRequest, CheckoutRequest
from tests.unit.tenancy.conftest import ADMIN, World, member

pytestmark = pytest.mark.unit


@pytest.fixture
def served(api):
    """A real report of a real history, served by the fake API for whatever query the CLI sends."""
    w = World()
    w.clock.now = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    w.ready_host()
    for who in ("alice", "bob"):
        g = w.tenancy.checkout(member(who), CheckoutRequest(backend="mig", ttl_seconds=7200))
        w.clock.advance(3600)
        w.tenancy.checkin(member(who), g.session_id, CheckinRequest(token=g.token))
    usage = Usage(w.registry, clock=w.clock)

    def answer(_body):
        q = api.requests[-1][3] or {}
        return usage.usage(ADMIN, UsageQuery.model_validate(q)).model_dump(mode="json")

    api.responses[("GET", "/v1/usage")] = answer
    return api


def test_usage_by_user_prints_a_row_per_member_and_idle_with_the_total(served, cli):
    code, out, _ = cli("usage", "--month", "2026-12", "--by", "user")
    assert code == 0
    assert served.requests[0][3] == {"month": "2026-12", "by": "user"}
    lines = out.splitlines()
    assert lines[1].split()[0] == "KEY"
    assert [ln.split()[0] for ln in lines[2:5]] == ["alice", "bob", "(idle)"]
    assert lines[-1] == "total  6.72 USD"  # 2 h of a $3.36 instance


def test_csv_rows_and_json_rows_carry_the_same_figures(served, cli):
    _, out_csv, _ = cli("usage", "--by", "user", "--output", "csv", "--month", "2026-12")
    _, out_json, _ = cli("usage", "--by", "user", "--output", "json", "--month", "2026-12")
    rows = list(csv.DictReader(io.StringIO(out_csv)))
    assert list(rows[0]) == CSV_ROW_COLUMNS
    doc = json.loads(out_json)
    assert [(r["key"], r["amount_usd"]) for r in rows] == [(r["key"], r["amount_usd"]) for r in doc["rows"]]
    assert {r["key"]: r["amount_usd"] for r in rows}["alice"] == "0.84"  # 1 h x 1/4 x 3.36


def test_output_csv_is_the_same_option_before_the_command_and_after_it(served, cli):
    # docs/cli.md: global options are given before or after the command, alike
    after = cli("usage", "--by", "user", "--output", "csv", "--month", "2026-12")
    before = cli("--output", "csv", "usage", "--by", "user", "--month", "2026-12")
    assert after == before
    assert after[0] == 0
    # and where no csv is written, it is refused either way as a usage error, asking nothing
    asked = len(served.requests)
    for argv in (("--output", "csv", "group", "list"), ("group", "list", "--output", "csv")):
        code, out, err = cli(*argv)
        assert (code, out) == (2, "")
        assert "--output csv is for `calque usage`" in err
    assert len(served.requests) == asked


def test_csv_without_by_is_every_line_with_the_stable_columns(served, cli):
    code, out, _ = cli("usage", "--since", "2026-12-01", "--until", "2026-12-02", "--output", "csv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == CSV_LINE_COLUMNS
    assert [r["kind"] for r in rows] == ["session", "session", "idle"]


def test_until_without_since_and_a_bad_month_are_refused_before_asking(api, cli):
    code, _, err = cli("usage", "--until", "2026-12-02")
    assert code == 2  # a usage error, as docs/cli.md says of arguments that need another
    assert "--until needs --since" in err
    code, _, _ = cli("usage", "--month", "2026-13")
    assert code == 2
    code, _, err = cli("usage", "--since", "yesterday")
    assert code == 2
    assert "'yesterday' is not a date like 2026-12-01" in err
    code, _, _ = cli("usage", "--since", "2026-12-01", "--until", "2026-02-30")
    assert code == 2
    assert api.requests == []


@pytest.mark.parametrize("month", ["1999-12", "0000-01", "3000-01"])
def test_a_month_the_api_cannot_take_is_a_usage_error_before_asking(api, cli, month):
    # the API takes years 2000 to 2999: a month outside them was sent, and its refusal quoted
    # the API's regular expression
    code, _, err = cli("usage", "--month", month)
    assert code == 2
    assert f"'{month}' is not a month like 2026-12 (years 2000 to 2999)" in err
    assert "pattern" not in err
    assert api.requests == []


def test_a_query_with_csv_is_a_usage_error_not_dropped(api, cli):
    # the CSV was written whole, the --query silently ignored
    code, out, err = cli("usage", "--output", "csv", "--query", "total_usd")
    assert code == 2
    assert out == ""
    assert "--query selects from the JSON document" in err
    assert api.requests == []


def test_the_csv_line_columns_only_ever_grow_at_the_end():
    # finance's imports read these by position: the first eighteen are as they shipped,
    # and a claim's id came last
    assert CSV_LINE_COLUMNS == [
        "month", "instance_id", "instance_type", "pool", "rate_usd_per_hour", "rate_as_of", "kind",
        "user", "group", "session_id", "slice_id", "start", "end", "seconds", "share", "gpu_hours",
        "amount_usd", "running", "claim_id",
    ]  # fmt: skip


def test_usage_by_host_reads_running_for_a_host_still_paid_for_with_nobody_on_it(served, cli):
    # Given both members checked in, and the host still registered (paid for up to now)
    # When an admin asks for this month by host
    code, out, _ = cli("usage", "--month", "2026-12", "--by", "host")
    # Then the host's row reads running
    assert code == 0
    lines = out.splitlines()
    header = lines[1].split()
    (row,) = [ln.split() for ln in lines[2:] if ln.startswith("i-0aaa0001")]
    assert (header[-1], row[header.index("SESSIONS")], row[-1]) == ("RUNNING", "2", "yes")
    # And the CSV for finance says the same
    _, out_csv, _ = cli("usage", "--month", "2026-12", "--by", "host", "--output", "csv")
    (csv_row,) = csv.DictReader(io.StringIO(out_csv))
    assert (csv_row["key"], csv_row["running"]) == ("i-0aaa0001", "true")


def test_csv_cells_are_plain_decimals_and_lowercase_booleans():
    from calque.cli.commands.usage import _cell

    # a spreadsheet would read 6.9e-05 as text in some locales, and True/False as Python's
    assert [_cell(v) for v in (6.9e-05, 1e-07, 12.5, 3.0, 7, True, False, None, "x")] == [
        "0.000069", "0.0000001", "12.5", "3.0", 7, "true", "false", "", "x",
    ]  # fmt: skip
    report = {
        "period": {"since": "a", "until": "b"},
        "by": "user",
        "rows": [{"key": "alice", "amount_usd": "0.01", "gpu_hours": 6.9e-05, "session_hours": 0.0003,
                  "sessions": 1, "running": False}],
    }  # fmt: skip
    from calque.cli.commands.usage import to_csv

    (row,) = csv.DictReader(io.StringIO(to_csv(report, grouped=True)))
    assert (row["gpu_hours"], row["session_hours"], row["running"]) == ("0.000069", "0.0003", "false")


def test_usage_separates_sessions_and_claims_with_what_each_cost(api, cli):
    from decimal import Decimal
    from fractions import Fraction

    from calque.accounting.chargeback import Line
    from calque.accounting.service import rows_by

    def line(kind: str, ident: str, cents: str) -> Line:
        at = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
        return Line(
            month="2026-12", instance_id="i-1", instance_type="g6e.xlarge",
            pool="embed" if kind == "claim" else None,
            hourly_usd=Decimal("1.86"), rate_as_of=None, kind=kind, user="alice", group=None,
            session_id=ident if kind == "session" else None, slice_id=None, start=at, end=at,
            seconds=Fraction(60), share=Fraction(1), exact_usd=Fraction(cents), amount_usd=Decimal(cents),
            claim_id=ident if kind == "claim" else None,
        )  # fmt: skip

    (row,) = rows_by(
        [line("session", "s-1", "0.50"), line("claim", "c-1", "0.10"), line("claim", "c-2", "0.20")], "user"
    )
    assert (row.sessions, row.claims, row.session_usd, row.claim_usd) == (3, 2, "0.50", "0.30")
    api.responses[("GET", "/v1/usage")] = {
        "period": {"since": "2026-12-01", "until": "2026-12-02"}, "as_of": "2026-12-02T00:00:00Z",
        "by": "user", "scope": "everyone", "total_usd": "0.80", "rows": [row.model_dump(mode="json")],
        "lines": [],
    }  # fmt: skip
    code, out, _ = cli("usage", "--by", "user")
    assert code == 0
    header, values = out.splitlines()[1].split(), out.splitlines()[2].split()
    cells = dict(zip(header, values, strict=True))
    assert (cells["SESSIONS"], cells["SESSION_USD"], cells["CLAIMS"], cells["CLAIM_USD"]) == (
        "1",
        "0.50",
        "2",
        "0.30",
    )
    _, out_csv, _ = cli("usage", "--by", "user", "--output", "csv")
    (csv_row,) = csv.DictReader(io.StringIO(out_csv))
    assert (csv_row["claims"], csv_row["session_usd"], csv_row["claim_usd"]) == ("2", "0.50", "0.30")

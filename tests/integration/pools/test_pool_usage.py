"""A claim on the local plane is a usage line: alice submits to a pool charged to one of her
groups, a real worker runs it, and `calque usage` shows the claim for her and that group,
while the pool instance's lines add up to its cost."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from tests.integration.pools.conftest import EXAMPLES, claim, create_pool, wait_claims

pytestmark = pytest.mark.integration


def test_a_claim_run_on_a_pool_is_charged_to_its_member_and_group(plane, tmp_path):
    # Given alice is in groups lab (her default) and course, and a pool of the example runner
    for args in (("group", "create", "lab"), ("group", "create", "course"), ("group", "add", "lab", "alice")):
        code, doc = plane.cli_json(*args, profile="admin")
        assert code == 0, doc
    code, doc = plane.cli_json("group", "add", "course", "alice", profile="admin")
    assert code == 0, doc
    create_pool(plane, "billed", runner="textstats:TextStats", package=EXAMPLES, max_workers=1)
    items = tmp_path / "items.jsonl"
    # (claims are timed to the second: this one runs at least two)
    items.write_text(json.dumps({"text": "three small words", "pause": 2.5}) + "\n")
    # When she submits a claim to a group she is not in, it is refused and nothing is queued
    code, doc = plane.cli_json("pool", "submit", "billed", "--items", str(items), "--group", "other")
    assert code == 1
    assert doc["error"]["code"] == "unknown_group"
    # And a claim charged to course runs to the end
    code, doc = plane.cli_json("pool", "submit", "billed", "--items", str(items), "--group", "course")
    assert code == 0, doc
    claim_id = doc["claim_id"]
    (done,) = wait_claims(plane, [claim_id])
    assert done["state"] == "succeeded", done
    assert claim(plane, claim_id)["group"] == "course"
    code, shown = plane.cli_json("claim", "show", claim_id)
    assert code == 0, shown
    assert shown["group"] == "course"
    # Then her usage shows the claim, charged to course, at one GPU of the g6e.xlarge
    code, mine = plane.cli_json("usage")
    assert code == 0, mine
    lines = [x for x in mine["lines"] if x["kind"] == "claim"]
    assert [(x["user"], x["group"], x["claim_id"], x["pool"]) for x in lines] == [
        ("alice", "course", claim_id, "billed")
    ]
    assert lines[0]["share"] == 1.0
    assert lines[0]["seconds"] >= 2
    assert all(x["user"] == "alice" for x in mine["lines"])  # her own lines, no idle
    # And for an admin, the pool instance's lines (the claim, then idle) add up to its cost
    code, every = plane.cli_json("usage", profile="admin")
    assert code == 0, every
    iid = lines[0]["instance_id"]
    for month in {m["month"] for m in every["instances"] if m["instance_id"] == iid}:
        (cost,) = [m for m in every["instances"] if m["instance_id"] == iid and m["month"] == month]
        mine_here = [x for x in every["lines"] if x["instance_id"] == iid and x["month"] == month]
        assert {x["kind"] for x in mine_here} >= {"idle"}
        assert sum(Decimal(x["amount_usd"]) for x in mine_here) == Decimal(cost["cost_usd"])
    assert any(x["kind"] == "claim" and x["claim_id"] == claim_id for x in every["lines"])
    # And the CSV export carries the claim's id in its last column
    csv_out = plane.cli("usage", "--output", "csv")
    assert csv_out.returncode == 0, csv_out.stderr
    header, *rows = csv_out.stdout.splitlines()
    assert header.endswith(",running,claim_id")
    assert any(r.endswith("," + claim_id) and ",claim," in r for r in rows)


def test_claims_count_against_a_members_monthly_dollars_until_a_submit_is_refused(plane, tmp_path):
    # Given bob may spend one cent a month, and a pool of the example runner on a g6e.xlarge
    # (1.861 USD an hour: a cent is about 19.4 seconds of a claim)
    code, doc = plane.cli_json(
        "quota", "set", "bob", "--max-sessions", "2", "--max-usd-per-month", "0.01", profile="admin"
    )
    assert code == 0, doc
    create_pool(plane, "budgeted", runner="textstats:TextStats", package=EXAMPLES, max_workers=1)
    items = tmp_path / "slow.jsonl"
    items.write_text(json.dumps({"text": "a long inference", "pause": 10.5}) + "\n")
    # When he runs claims until his month is spent
    ran: list[str] = []
    refused = None
    for _ in range(4):
        code, doc = plane.cli_json("pool", "submit", "budgeted", "--items", str(items), profile="bob")
        if code != 0:
            refused = doc
            break
        (done,) = wait_claims(plane, [doc["claim_id"]], profile="bob")
        assert done["state"] == "succeeded", done
        ran.append(done["claim_id"])
    # Then the next submit is refused, naming his limit, once what ran reached a cent
    assert refused is not None, f"never refused after {ran}"
    assert code == 1
    assert refused["error"]["code"] == "quota_exceeded"
    assert refused["error"]["details"]["limit"] == "user.max_usd_per_month"
    assert 1 <= len(ran) <= 2  # two claims of at least 10 seconds each pass the cent
    # And nothing was queued for the refused one
    code, listed = plane.cli_json("claim", "list", "--pool", "budgeted", profile="bob")
    assert code == 0, listed
    assert sorted(c["claim_id"] for c in listed) == sorted(ran)
    # And quota show counts the claims' time and dollars as used this month
    code, quota = plane.cli_json("quota", "show", profile="bob")
    assert code == 0, quota
    assert Decimal(quota["usd_used_this_month"]) >= Decimal("0.01")
    assert quota["gpu_hours_used_this_month"] >= 20 / 3600
    assert quota["usd_used_this_month"] == refused["error"]["details"]["used"]


def test_quick_claims_are_each_a_usage_line_and_the_worker_counts_what_it_served(plane, tmp_path):
    import re

    # Given a pool of one worker that ran two quick claims to success (under a second each,
    # as likely as not: times are recorded to the second)
    create_pool(plane, "quick", runner="textstats:TextStats", package=EXAMPLES, max_workers=1)
    items = tmp_path / "quick.jsonl"
    items.write_text(json.dumps({"text": "two words"}) + "\n")
    ids = []
    for _ in range(2):
        code, doc = plane.cli_json("pool", "submit", "quick", "--items", str(items))
        assert code == 0, doc
        ids.append(doc["claim_id"])
    done = wait_claims(plane, ids)
    assert [c["state"] for c in done] == ["succeeded", "succeeded"], done
    # When an admin asks for usage by pool
    code, report = plane.cli_json("usage", "--by", "pool", profile="admin")
    assert code == 0, report
    # Then the pool's row counts both claims, each a line
    (row,) = [r for r in report["rows"] if r["key"] == "quick"]
    assert row["sessions"] == 2
    lines = [x for x in report["lines"] if x["kind"] == "claim" and x["pool"] == "quick"]
    assert {x["claim_id"] for x in lines} == set(ids)
    # And the pool's status says its worker served 2 claims, its times in ISO 8601 UTC
    code, status = plane.cli_json("pool", "status", "quick", profile="admin")
    assert code == 0, status
    workers = status["status"]["workers"]
    assert sum(w["claims_served"] for w in workers) == 2
    iso = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
    assert all(iso.match(w["launched_at"]) for w in workers)
    assert all(iso.match(x["at"]) for x in status["status"]["decisions"])

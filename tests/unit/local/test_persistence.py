"""The DynamoDB journal and snapshot the local plane restarts from: a whole record comes
back, a torn one does not, and nothing already in the snapshot is applied twice."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from calque.local.moto_state import write_durably
from calque.local.persistence import DynamoJournal, Persistence
from calque.local.restored import Restored

pytestmark = pytest.mark.unit


def _journal(tmp_path, *records: tuple[int, str, dict]) -> DynamoJournal:
    j = DynamoJournal(tmp_path)
    j.journal_file.write_bytes(
        b"".join(j.encode(seq, op, json.dumps(body).encode()) for seq, op, body in records)
    )
    return j


def test_whole_records_come_back_in_order(tmp_path):
    j = _journal(tmp_path, (1, "PutItem", {"a": 1}), (2, "TransactWriteItems", {"b": 2}))
    records, dropped = j.records()
    assert [(r["seq"], r["op"], json.loads(r["body"])) for r in records] == [
        (1, "PutItem", {"a": 1}),
        (2, "TransactWriteItems", {"b": 2}),
    ]
    assert dropped == 0


def test_a_record_torn_by_a_crash_is_dropped_whole(tmp_path):
    # Given a transaction whose line the crash cut in the middle
    j = _journal(tmp_path, (1, "PutItem", {"a": 1}))
    whole = j.encode(2, "TransactWriteItems", json.dumps({"TransactItems": [1, 2, 3]}).encode())
    with open(j.journal_file, "ab") as fh:
        fh.write(whole[: len(whole) // 2])
    # Then only the whole record before it comes back: none of the transaction does
    records, dropped = j.records()
    assert [r["seq"] for r in records] == [1]
    assert dropped == 1


def test_a_corrupt_record_drops_it_and_everything_after_it(tmp_path):
    j = _journal(tmp_path, (1, "PutItem", {"a": 1}), (2, "PutItem", {"b": 2}), (3, "PutItem", {"c": 3}))
    lines = j.journal_file.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b'\\"b\\"', b'\\"x\\"')  # a flipped byte: the checksum no longer matches
    j.journal_file.write_bytes(b"\n".join(lines))
    records, dropped = j.records()
    assert [r["seq"] for r in records] == [1]
    assert dropped == 2


class FakeMoto:
    """moto's DynamoDB as the restore sees it: calls recorded, one table."""

    def __init__(self, items: list[dict]):
        self.calls: list[tuple[str, dict]] = []
        self.items = items

    def __call__(self, service: str, *, target: str, body: bytes, **_: object) -> tuple[int, bytes]:
        op = target.rpartition(".")[2]
        req = json.loads(body)
        self.calls.append((op, req))
        if op == "ListTables":
            return 200, json.dumps({"TableNames": ["registry"]}).encode()
        return 200, b"{}"

    def tables(self) -> dict[str, list[dict]]:
        """What the snapshot reads: the table's items."""
        return {"registry": self.items}


def test_records_already_in_the_snapshot_are_not_replayed(tmp_path):
    # Given a snapshot holding writes up to 5, and a journal the crash left with 4..7
    # (the snapshot was written, the journal not yet emptied)
    write_durably(
        tmp_path / "dynamodb.snapshot.json",
        json.dumps({"seq": 5, "tables": {"registry": [{"pk": {"S": "a"}, "type": {"S": "host"}}]}}).encode(),
    )
    _journal(tmp_path, *[(n, "UpdateItem", {"n": n}) for n in (4, 5, 6, 7)])
    moto = FakeMoto(
        items=[{"pk": {"S": "a"}, "type": {"S": "host"}}, {"pk": {"S": "b"}, "type": {"S": "slice"}}]
    )
    p = Persistence(tmp_path, account="123456789012", region="us-east-1")
    p.attach(moto, tables=moto.tables)
    out = Restored()
    # When the plane restores
    p._restore_dynamodb(out)
    # Then the snapshot's items are loaded, and only 6 and 7 are applied on top, once each
    replayed = [req["n"] for op, req in moto.calls if op == "UpdateItem"]
    assert replayed == [6, 7]
    assert [op for op, _ in moto.calls].count("BatchWriteItem") == 1
    # And a new snapshot holds everything up to 7, with an empty journal
    snapshot = json.loads((tmp_path / "dynamodb.snapshot.json").read_bytes())
    assert snapshot["seq"] == 7
    assert (tmp_path / "dynamodb.journal").read_bytes() == b""
    assert out.items == Counter({"host": 1, "slice": 1})
    assert out.journal_records == 2
    # And the next write continues the sequence
    p.active = True
    p.dynamodb_written("PutItem", b'{"x": 1}')
    records, _ = p.dynamo.records()
    assert [r["seq"] for r in records] == [8]
    p.close()


def test_what_came_back_reads_as_a_person_would_say_it():
    out = Restored(items=Counter({"slice": 4, "host": 1, "session": 2, "event": 1}), instances=1, messages=3)
    assert (
        out.summary() == "1 host, 4 slices, 2 sessions, 1 lease history event, 1 instance, 3 queued messages"
    )
    assert Restored().empty


def test_what_came_back_names_slice_profiles_and_member_quotas_for_what_they_are():
    # Given a registry with slice profile size items, member quotas, replay records and pool items
    # (which carry no type)
    out = Restored(
        items=Counter({"profile": 2, "quota": 5, "request": 9, "other": 3, "host": 1}),
        instances=1,
    )
    # When the banner says what came back
    line = out.summary()
    # Then nobody reads "2 user profiles" for two slice profiles, and untyped items are counted last
    assert line == (
        "1 host, 5 member quotas, 2 slice profiles, 9 check-out replay records, "
        "3 other registry items, 1 instance, 0 queued messages"
    )
    assert "user profile" not in line
    # And the fleet's and groups' items read as words too, not as "<type> item"
    fleet = Restored(items=Counter({"acquisition": 2, "budget": 1, "group": 1})).summary()
    assert fleet == "2 fleet acquisitions, 1 budget, 1 group, 0 instances, 0 queued messages"

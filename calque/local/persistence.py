"""What the local plane's moto services hold, kept in the state directory across a clean
stop and a kill -9.

moto keeps everything in memory. The plane's moto layer (calque/local/moto_server.py)
tells this module about every call that changed something, before the caller gets
its answer, so a caller that saw success finds it again after any restart; a call in
flight when the plane died may be lost, as if it never arrived.

    aws/dynamodb.snapshot.json   every table's items (DynamoDB JSON) and the journal
                                 sequence number they include
    aws/dynamodb.journal         each successful item write since that snapshot, one line
                                 per call (PutItem, UpdateItem, DeleteItem, BatchWriteItem,
                                 TransactWriteItems), checksummed and fsync'd before the
                                 caller is answered
    aws/sqs.json                 every queue's messages (body, attributes, group and
                                 deduplication ids, receive count)
    aws/ec2.json                 every instance (id, type, image, zone, state, tags)
    aws/ssm/<command-id>.json    each live or recent Run Command command and its
                                 invocations (calque/local/moto_ssm.py)
    aws/s3/<bucket>/             every object (content, content type, user metadata)

DynamoDB: writes run one at a time (the moto layer's lock), so the journal's order is
the order they took effect. One call is one line: a transaction comes back whole or not
at all, never half (a torn last line fails its checksum and is dropped with everything
after it). At start the snapshot is loaded and the journal replayed through moto itself,
then both are compacted into a new snapshot; a running plane compacts every
``COMPACT_EVERY`` writes (or as many as the last snapshot held items, if more) and at a
clean stop. A snapshot records the last sequence number
it includes, so a crash between writing it and emptying the journal replays nothing twice.

SQS, EC2, SSM and S3 are small (calque/local/moto_state.py, moto_ssm.py): after each
call that changed one, what changed is written (to a temporary file, fsync'd, renamed)
under that service's lock, so the file on disk is never older than an answer already
given: SQS's and EC2's whole state, each changed object of S3, each changed SSM command
(finished ones past the latest few hundred are forgotten). A kill in the middle of a save
leaves a temporary file, removed at the next start.

Restart time and memory follow what the services hold now, not their history: the
journal is compacted every ``COMPACT_EVERY`` writes or ``COMPACT_BYTES`` bytes, whichever
comes first (each raised to the last snapshot's items and bytes, so that reading every
table costs the same per write however large they are), and is read one record at a
time. Messages come back visible (a receipt handle given out before
the stop is no longer valid, as after a visibility timeout), with their receive counts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from moto.dynamodb.models import dynamodb_backends

from calque.local import moto_compact
from calque.local.moto_ssm import SsmCommands
from calque.local.moto_state import (
    ServiceSnapshots,
    fsync_dir,
    read_json,
    remove_stale_temps,
    write_durably,
)
from calque.local.restored import OTHER_ITEMS, Restored

log = logging.getLogger("calque.local")

DYNAMODB_WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"})
COMPACT_EVERY = 2000
COMPACT_BYTES = 16 * 1024 * 1024  # a few large transactions compact as soon as many small writes
_DDB_TARGET = "DynamoDB_20120810."

# (status, body) of one call made straight to moto's own WSGI app, past the plane's checks
InternalCall = Callable[..., tuple[int, bytes]]
# every table's items (DynamoDB JSON), by table name
TableReader = Callable[[], Mapping[str, Iterable[dict[str, Any]]]]


class DynamoJournal:
    """The write-ahead journal and snapshot of the DynamoDB tables."""

    def __init__(self, directory: Path):
        self.snapshot_file = directory / "dynamodb.snapshot.json"
        self.journal_file = directory / "dynamodb.journal"
        self._fd: int | None = None
        self.seq = 0
        self.since_compaction = 0
        self.bytes_since_compaction = 0
        self.snapshot_items = 0  # items and bytes of the last snapshot written
        self.snapshot_bytes = 0

    # records
    @staticmethod
    def encode(seq: int, operation: str, body: bytes) -> bytes:
        doc = json.dumps({"seq": seq, "op": operation, "body": body.decode("utf-8")}, separators=(",", ":"))
        return b"%08x %s\n" % (zlib.crc32(doc.encode()), doc.encode())

    def records(self) -> tuple[list[dict[str, Any]], int]:
        """The journal's whole records in order, and how many torn or corrupt ones were dropped."""
        dropped: list[int] = []
        return list(self.iter_records(dropped)), sum(dropped)

    def iter_records(self, dropped: list[int]) -> Iterator[dict[str, Any]]:
        """The journal's whole records in order, read one line at a time (a restart holds one
        record, not the journal); appends to ``dropped`` how many torn or corrupt ones end it."""
        try:
            fh = open(self.journal_file, "rb")  # noqa: SIM115 (closed below, also when abandoned)
        except FileNotFoundError:
            return
        with fh:
            for line in fh:
                if line == b"\n":
                    continue
                crc, _, doc = line.rstrip(b"\n").partition(b" ")
                try:
                    ok = line.endswith(b"}\n") and int(crc, 16) == zlib.crc32(doc)
                    record = json.loads(doc) if ok else None
                except ValueError:
                    record = None
                if record is None:
                    # a write cut short by the crash: it and anything after it never took effect
                    dropped.append(1 + sum(1 for rest in fh if rest.strip(b"\n")))
                    return
                yield record

    def open(self) -> None:
        self._fd = os.open(self.journal_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def append(self, operation: str, body: bytes) -> None:
        assert self._fd is not None, "the journal is not open"
        self.seq += 1
        line = self.encode(self.seq, operation, body)
        os.write(self._fd, line)
        os.fdatasync(self._fd)
        self.since_compaction += 1
        self.bytes_since_compaction += len(line)

    def due(self) -> bool:
        """Whether the journal has grown enough to fold into the snapshot: ``COMPACT_EVERY``
        writes or ``COMPACT_BYTES`` bytes, or as many writes as the last snapshot held items
        and as many bytes as it had, whichever is more (a compaction reads every table, so
        its cost per write stays the same however much the tables hold, and a restart
        replays no more records than the snapshot has items)."""
        return self.since_compaction >= max(
            COMPACT_EVERY, self.snapshot_items
        ) or self.bytes_since_compaction >= max(COMPACT_BYTES, self.snapshot_bytes)

    def write_snapshot(self, tables: Mapping[str, Iterable[dict[str, Any]]]) -> None:
        """The tables as they are now, then an empty journal (records up to ``seq`` are in it).
        Each table's items are written as they come (an iterator reading one item at a time
        keeps that item in memory, not every table), to a temporary file renamed over the
        snapshot once whole: a crash leaves the old snapshot or the new one."""
        tmp = self.snapshot_file.with_name(f".{self.snapshot_file.name}.{threading.get_ident()}.tmp")
        items = size = 0
        with contextlib.ExitStack() as cleanup:
            cleanup.callback(tmp.unlink, missing_ok=True)  # a snapshot cut short is not kept
            fh = cleanup.enter_context(open(tmp, "wb"))  # closed by the stack

            def put(data: bytes) -> None:
                nonlocal size
                fh.write(data)
                size += len(data)

            put(b'{"format":1,"seq":%d,"tables":{' % self.seq)
            for t, (name, rows) in enumerate(tables.items()):
                put(b"%s%s:[" % (b"," if t else b"", json.dumps(name).encode()))
                for n, row in enumerate(rows):
                    put(b"%s%s" % (b"," if n else b"", json.dumps(row, separators=(",", ":")).encode()))
                    items += 1
                put(b"]")
            put(b"}}")
            fh.flush()
            os.fsync(fh.fileno())
            fh.close()
            os.replace(tmp, self.snapshot_file)
        fsync_dir(self.snapshot_file.parent)
        self.snapshot_items = items
        self.snapshot_bytes = size
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        write_durably(self.journal_file, b"")
        self.open()
        self.since_compaction = 0
        self.bytes_since_compaction = 0

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Persistence:
    """Keeps the moto services' contents in ``directory``; see the module's docstring."""

    def __init__(self, directory: Path, *, account: str, region: str):
        self.dir = directory
        self.account = account
        self.region = region
        self.dynamo = DynamoJournal(directory)
        self._call: InternalCall | None = None
        self._tables: TableReader | None = None
        self._locks = {name: threading.Lock() for name in ("sqs", "ec2", "ssm", "s3")}
        self.services = ServiceSnapshots(directory, account=account, region=region)
        self.ssm = SsmCommands(directory, account=account, region=region)
        self.stale_temps = 0
        self.restoring = False
        self.active = False

    # wiring
    def attach(self, call: InternalCall, *, tables: TableReader | None = None) -> None:
        """How to reach moto's own app (for restores), past the plane's checks, and what the
        snapshot reads the tables from (moto's own backend in this process unless ``tables``)."""
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._call = call
        self._tables = tables
        # the plane holds its lock and nothing writes yet: a temporary file is a save a kill cut
        self.stale_temps = remove_stale_temps(self.dir)
        if self.stale_temps:
            log.info("removed %d temporary file(s) of saves cut short by the last stop", self.stale_temps)

    def _ddb(self, operation: str, body: dict[str, Any]) -> dict[str, Any]:
        assert self._call is not None
        status, raw = self._call("dynamodb", target=_DDB_TARGET + operation, body=json.dumps(body).encode())
        doc = json.loads(raw or b"{}")
        if status != 200:
            raise RuntimeError(f"DynamoDB {operation} failed during restore: {status} {doc}")
        return dict(doc)

    # --- DynamoDB ---------------------------------------------------------------------
    def dynamodb_written(self, operation: str, body: bytes) -> None:
        """Called under the moto layer's DynamoDB lock after a write succeeded, before its answer."""
        if not self.active or self.restoring:
            return
        self.dynamo.append(operation, body)
        if self.dynamo.due():
            self.compact_dynamodb()

    def _moto_tables(self) -> dict[str, Iterator[dict[str, Any]]]:
        """Every table's items as DynamoDB JSON, read where moto holds them, one at a time
        (a Scan would copy a page of items into moto's objects, then into its answer, and
        leave the heap that much larger at every compaction)."""
        tables = dynamodb_backends[self.account][self.region].tables
        return {
            name: (moto_compact.item_json(item) for item in moto_compact.table_items(table))
            for name, table in tables.items()
        }

    @staticmethod
    def _counted(rows: Iterable[dict[str, Any]], kinds: Counter[str]) -> Iterator[dict[str, Any]]:
        for row in rows:
            # pools' and claims' items carry no type
            kinds[(row.get("type") or {}).get("S") or OTHER_ITEMS] += 1
            yield row

    def compact_dynamodb(self) -> Counter[str]:
        """Write every table to the snapshot and empty the journal (under the DynamoDB lock:
        nothing changes a table while it is read), an item at a time; returns how many items
        of each type it wrote."""
        kinds: Counter[str] = Counter()
        tables = self._tables() if self._tables is not None else self._moto_tables()
        self.dynamo.write_snapshot({name: self._counted(rows, kinds) for name, rows in tables.items()})
        return kinds

    def _restore_dynamodb(self, out: Restored) -> None:
        snapshot = read_json(self.dynamo.snapshot_file) or {"seq": 0, "tables": {}}
        existing = set(self._ddb("ListTables", {}).get("TableNames", []))
        for name, items in snapshot.get("tables", {}).items():
            if name not in existing:
                log.warning("restore: table %s no longer exists; its %d items are dropped", name, len(items))
                continue
            for i in range(0, len(items), 25):
                batch = [{"PutRequest": {"Item": it}} for it in items[i : i + 25]]
                self._ddb("BatchWriteItem", {"RequestItems": {name: batch}})
        seq = int(snapshot.get("seq", 0))
        dropped: list[int] = []
        for record in self.dynamo.iter_records(dropped):
            if record["seq"] <= seq:
                continue  # already in the snapshot (a crash between snapshot and journal reset)
            assert self._call is not None
            status, raw = self._call(
                "dynamodb", target=_DDB_TARGET + record["op"], body=record["body"].encode("utf-8")
            )
            if status != 200:
                log.warning(
                    "restore: journal record %s (%s) failed again: %s", record["seq"], record["op"], raw[:300]
                )
            seq = record["seq"]
            out.journal_records += 1
        out.dropped_records = sum(dropped)
        self.dynamo.seq = seq
        for kind, n in self.compact_dynamodb().items():
            out.items[kind] += n

    # --- SQS, EC2, SSM, S3: the whole service's state after each change -----------------
    def _save(self, service: str) -> None:
        if not self.active or self.restoring:
            return
        with self._locks[service]:
            if service == "ssm":
                self.ssm.save()
            else:
                getattr(self.services, f"save_{service}")()

    def sqs_changed(self) -> None:
        self._save("sqs")

    def ec2_changed(self) -> None:
        self._save("ec2")

    def ssm_changed(self) -> None:
        self._save("ssm")

    def s3_changed(self) -> None:
        self._save("s3")

    # --- the whole ----------------------------------------------------------------------
    @contextlib.contextmanager
    def restoring_state(self) -> Iterator[None]:
        self.restoring = True
        try:
            yield
        finally:
            self.restoring = False

    def restore(self, clients: Any) -> tuple[Restored, set[str]]:
        """Load everything saved into the (freshly created) moto resources, then start keeping it.

        Returns what came back and the ids of the instances restored."""
        out = Restored()
        with self.restoring_state():
            self._restore_dynamodb(out)
            self.services.restore_sqs(clients.client("sqs"), out)
            instances = self.services.restore_ec2(clients.client("ec2"), out)
            self.ssm.restore(out)
            self.services.restore_s3(clients.client("s3"), out)
        self.active = True
        # what is on disk from here on is what the services hold now
        self.sqs_changed()
        self.ec2_changed()
        self.ssm_changed()
        self.s3_changed()
        return out, instances

    def close(self) -> None:
        """At a clean stop: compact the journal into the snapshot (the caller holds writes off)."""
        if self.active:
            for step in (
                self.compact_dynamodb,
                self.sqs_changed,
                self.ec2_changed,
                self.ssm_changed,
                self.s3_changed,
            ):
                try:
                    step()
                except Exception:  # the others still get written; what each saved last is on disk
                    log.exception("could not save the local plane's state at stop (%s)", step.__name__)
            self.active = False
        self.dynamo.close()

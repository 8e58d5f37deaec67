"""The small moto services' contents on disk: SQS, EC2 and S3 (SSM's commands:
calque/local/moto_ssm.py). The plane's persistence (calque/local/persistence.py) decides
when; this module knows what.

Each ``save_<service>`` reads that service's whole state from moto's backend and
replaces its file durably; each ``restore_<service>`` puts a saved state back into a
freshly started moto. See persistence.py for the guarantees.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:
    from calque.local.restored import Restored

log = logging.getLogger("calque.local")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new file."""
    tmp = path.with_name(f".{path.name}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


TEMP_GLOB = ".*.tmp"  # what write_durably names its temporary files


def remove_stale_temps(root: Path) -> int:
    """Remove the temporary files a kill left behind mid-save under ``root`` (only at start,
    while nothing writes): each is a half-written copy whose rename never happened."""
    removed = 0
    if root.is_dir():
        for tmp in root.rglob(TEMP_GLOB):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                tmp.unlink()
                removed += 1
    return removed


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        return None


KEEP_TERMINATED = 200

# queue attributes a CreateQueue may set (the rest moto computes)
_QUEUE_SETTABLE = frozenset(
    {
        "DelaySeconds",
        "MaximumMessageSize",
        "MessageRetentionPeriod",
        "Policy",
        "RedrivePolicy",
        "ReceiveMessageWaitTimeSeconds",
        "VisibilityTimeout",
        "ContentBasedDeduplication",
        "DeduplicationScope",
        "FifoQueue",
        "FifoThroughputLimit",
    }
)


class ServiceSnapshots:
    """Save and restore SQS, EC2 and S3 for one account and region of moto."""

    def __init__(self, directory: Path, *, account: str, region: str):
        self.dir = directory
        self.account = account
        self.region = region
        self._s3_index: dict[str, dict[str, str]] = {}

    # --- SQS --------------------------------------------------------------------------
    def _sqs_backend(self) -> Any:
        from moto.sqs.models import sqs_backends

        return sqs_backends[self.account][self.region]

    def save_sqs(self) -> None:
        queues: dict[str, list[dict[str, Any]]] = {}
        attributes: dict[str, dict[str, str]] = {}
        for name, q in list(self._sqs_backend().queues.items()):
            attributes[name] = {
                k: str(v) for k, v in q.attributes.items() if k in _QUEUE_SETTABLE and v not in (None, "")
            }
            queues[name] = [
                {
                    "id": m.id,
                    "body": m.body,
                    "message_attributes": m.message_attributes,
                    "system_attributes": m.system_attributes,
                    "group_id": m.group_id,
                    "deduplication_id": m.deduplication_id,
                    "receive_count": m.approximate_receive_count,
                    "sent_timestamp": m.sent_timestamp,
                    "first_receive_timestamp": m.approximate_first_receive_timestamp,
                }
                for m in list(q._messages)
            ]
        doc = {"format": 1, "queues": queues, "attributes": attributes}
        write_durably(self.dir / "sqs.json", json.dumps(doc).encode())

    def restore_sqs(self, sqs: Any, out: Restored) -> None:
        doc = read_json(self.dir / "sqs.json") or {"queues": {}}
        backend = self._sqs_backend()
        made_at_runtime = {n: a for n, a in (doc.get("attributes") or {}).items() if n not in backend.queues}
        # dead-letter queues first: a queue's redrive policy names its DLQ
        for name, attrs in sorted(made_at_runtime.items(), key=lambda na: "RedrivePolicy" in na[1]):
            sqs.create_queue(QueueName=name, Attributes=attrs)
        for name, messages in doc["queues"].items():
            if name not in backend.queues:
                log.warning(
                    "restore: queue %s no longer exists; its %d messages are dropped", name, len(messages)
                )
                continue
            for saved in messages:
                try:
                    m = backend.send_message(
                        name,
                        saved["body"],
                        message_attributes=saved.get("message_attributes") or {},
                        deduplication_id=saved.get("deduplication_id"),
                        group_id=saved.get("group_id"),
                        system_attributes=saved.get("system_attributes") or {},
                        validate_group_id=False,
                    )
                except Exception as exc:
                    out.problems.append(f"a message of queue {name} could not be restored: {exc}")
                    continue
                m.id = saved["id"]
                m.approximate_receive_count = saved.get("receive_count") or 0
                m.approximate_first_receive_timestamp = saved.get("first_receive_timestamp")
                if saved.get("sent_timestamp"):
                    m.sent_timestamp = saved["sent_timestamp"]
                out.messages += 1

    # --- EC2 --------------------------------------------------------------------------
    def _ec2_backend(self) -> Any:
        from moto.ec2.models import ec2_backends

        return ec2_backends[self.account][self.region]

    def save_ec2(self) -> None:
        instances = []
        everyone = list(self._ec2_backend().all_instances())
        # terminated instances, as EC2 forgets them after a while: the latest few are kept
        # (a reconciler may still ask about one), not every instance the plane ever launched
        terminated = [i for i in everyone if i._state.name == "terminated"]
        forgotten = {id(i) for i in terminated[: max(0, len(terminated) - KEEP_TERMINATED)]}
        for i in everyone:
            if id(i) in forgotten:
                continue
            instances.append(
                {
                    "id": i.id,
                    "instance_type": i.instance_type,
                    "image_id": i.image_id,
                    "zone": i.placement.zone,
                    "state": i._state.name,
                    "tags": {t["key"]: t["value"] for t in i.get_tags()},
                    "client_token": i.client_token,
                    # a spot instance stays one (EC2's InstanceLifecycle: spot interruptions and
                    # the fleet's spot rates go by it)
                    "lifecycle": i.lifecycle,
                }
            )
        write_durably(self.dir / "ec2.json", json.dumps({"format": 1, "instances": instances}).encode())

    def restore_ec2(self, ec2: Any, out: Restored) -> set[str]:
        """Each saved instance again, under its own id, in its state; returns the ids."""
        from unittest import mock

        doc = read_json(self.dir / "ec2.json") or {"instances": []}
        back: set[str] = set()
        for saved in doc["instances"]:
            kwargs: dict[str, Any] = {
                "ImageId": saved["image_id"],
                "InstanceType": saved["instance_type"],
                "MinCount": 1,
                "MaxCount": 1,
            }
            if saved.get("zone"):
                kwargs["Placement"] = {"AvailabilityZone": saved["zone"]}
            if saved.get("tags"):
                kwargs["TagSpecifications"] = [
                    {
                        "ResourceType": "instance",
                        "Tags": [{"Key": k, "Value": v} for k, v in saved["tags"].items()],
                    }
                ]
            if saved.get("client_token"):
                kwargs["ClientToken"] = saved["client_token"]
            if saved.get("lifecycle") == "spot":
                kwargs["InstanceMarketOptions"] = {"MarketType": "spot"}
            # moto names every new instance at random; this one takes back its own id
            try:
                with mock.patch("moto.ec2.models.instances.random_instance_id", return_value=saved["id"]):
                    try:
                        ec2.run_instances(**kwargs)
                    except Exception:  # e.g. an AMI this moto no longer ships: any image will do
                        from calque.local.hosts import _image_id

                        kwargs.pop("Placement", None)
                        ec2.run_instances(**{**kwargs, "ImageId": _image_id(ec2)})
            except Exception as exc:
                out.problems.append(f"instance {saved['id']} could not be restored: {exc}")
                continue
            state = saved.get("state")
            if state in ("stopping", "stopped"):
                ec2.stop_instances(InstanceIds=[saved["id"]])
            elif state in ("shutting-down", "terminated"):
                ec2.terminate_instances(InstanceIds=[saved["id"]])
            back.add(saved["id"])
            out.instances += 1
        return back

    # --- S3 ---------------------------------------------------------------------------
    def _s3_backend(self) -> Any:
        from moto.s3.models import s3_backends

        return s3_backends[self.account]["global"]

    @staticmethod
    def _object_name(key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()

    def save_s3(self) -> None:
        root = self.dir / "s3"
        seen: dict[str, dict[str, str]] = {}
        for bucket_name, bucket in list(self._s3_backend().buckets.items()):
            bdir = root / quote(bucket_name, safe="")
            bdir.mkdir(parents=True, exist_ok=True, mode=0o700)
            before = self._s3_index.get(bucket_name, {})
            now: dict[str, str] = {}
            for key in list(bucket.keys.keys()):
                obj = bucket.keys.get(key)
                if obj is None:
                    continue
                name = self._object_name(key)
                now[key] = obj.etag
                if before.get(key) == obj.etag:
                    continue
                meta = {
                    "key": key,
                    "metadata": {str(k).lower(): str(v) for k, v in obj.metadata.items()},
                    "etag": obj.etag,
                    "body": base64.b64encode(obj.value).decode(),
                }
                write_durably(bdir / f"{name}.json", json.dumps(meta).encode())
            for gone in set(before) - set(now):
                with contextlib.suppress(FileNotFoundError):
                    (bdir / f"{self._object_name(gone)}.json").unlink()
            seen[bucket_name] = now
        self._s3_index = seen

    def restore_s3(self, s3: Any, out: Restored) -> None:
        root = self.dir / "s3"
        if not root.is_dir():
            return
        from urllib.parse import unquote

        existing = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
        for bdir in sorted(p for p in root.iterdir() if p.is_dir()):
            bucket = unquote(bdir.name)
            if bucket not in existing:
                s3.create_bucket(Bucket=bucket)
            index: dict[str, str] = {}
            for f in sorted(bdir.glob("*.json")):
                try:
                    meta = json.loads(f.read_bytes())
                except ValueError as exc:
                    out.problems.append(f"object file {f} could not be read: {exc}")
                    continue
                headers = meta.get("metadata") or {}
                s3.put_object(
                    Bucket=bucket,
                    Key=meta["key"],
                    Body=base64.b64decode(meta["body"]),
                    ContentType=headers.get("content-type") or "binary/octet-stream",
                    Metadata={
                        k[len("x-amz-meta-") :]: v for k, v in headers.items() if k.startswith("x-amz-meta-")
                    },
                )
                index[meta["key"]] = ""
                out.objects += 1
            self._s3_index[bucket] = index

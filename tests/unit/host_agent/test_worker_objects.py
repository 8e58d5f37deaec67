"""The worker's claim objects: an input read back with another SHA-256 is refused, files go to
the bucket with their SHA-256, and the runner's output is shipped as numbered chunks of what
was appended since the last shipment."""

from __future__ import annotations

import hashlib
import io
from typing import Any

import pytest

from host_agent.worker import objects

pytestmark = pytest.mark.unit


class S3:
    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.metadata: dict[str, dict[str, str]] = {}
        self.fail_puts = 0

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        return {"Body": io.BytesIO(self.objects[Key])}

    def put_object(self, Bucket: str, Key: str, Body: Any, Metadata: Any = None, **_: Any) -> None:
        if self.fail_puts:
            self.fail_puts -= 1
            raise OSError("connection reset")
        self.objects[Key] = Body if isinstance(Body, bytes) else Body.read()
        self.metadata[Key] = dict(Metadata or {})


def test_an_input_is_streamed_to_disk_and_checked(tmp_path):
    s3 = S3()
    s3.objects["in"] = b'{"items": [1, 2]}' * 100_000
    good = hashlib.sha256(s3.objects["in"]).hexdigest()
    assert objects.fetch(s3, "b", "in", str(tmp_path / "a"), good) == len(s3.objects["in"])
    assert (tmp_path / "a").read_bytes() == s3.objects["in"]
    with pytest.raises(objects.InputChecksumMismatch):
        objects.fetch(s3, "b", "in", str(tmp_path / "b"), "0" * 64)


def test_a_file_goes_to_the_bucket_with_its_sha256(tmp_path):
    s3 = S3()
    path = tmp_path / "result.json"
    path.write_bytes(b"x" * 3_000_000)
    sha, size = objects.put_file(s3, "b", "k", str(path))
    assert (sha, size) == (hashlib.sha256(b"x" * 3_000_000).hexdigest(), 3_000_000)
    assert s3.metadata["k"] == {"sha256": sha}


def test_logs_are_shipped_as_chunks_of_what_was_appended(tmp_path):
    s3 = S3()
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    prefix = objects.log_chunks_prefix("pools/p/claims/c-1", 2, "w-1")
    assert prefix == "pools/p/claims/c-1/logs/0002-w-1/"
    shipper = objects.LogShipper(s3, "b", prefix, {"stdout": str(out), "stderr": str(err)}, every_s=60)
    shipper.ship()  # nothing written yet: nothing shipped
    assert s3.objects == {}
    out.write_text("one\n")
    shipper.ship()
    with out.open("a") as f:
        f.write("two\n")
    err.write_text("oops\n")
    s3.fail_puts = 1  # a failed put is shipped with the next beat, nothing lost or repeated
    shipper.ship()
    shipper.ship()
    assert [(k[len(prefix) :], v) for k, v in sorted(s3.objects.items())] == [
        ("00000001-stdout.txt", b"one\n"),
        ("00000002-stdout.txt", b"two\n"),
        ("00000003-stderr.txt", b"oops\n"),
    ]

"""A claim's objects as the worker moves them: its input streamed to disk and checked against
its SHA-256, its result and logs streamed from disk to the bucket with theirs, and the
runner's stdout and stderr shipped as numbered chunks while the claim runs (read back by
``calque claim logs``; calque/pools/claim_io.py names the chunk keys).

Nothing here holds a whole object in memory: a claim's input or result may be a GiB.
Python 3.9+, botocore only (the host agent's bundle carries no boto3); the checksum is
calque.contracts.checksum's, the one the SDK computes over what it uploads.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from typing import Any

from calque.contracts.checksum import file_sha256

log = logging.getLogger("calque.worker")

CHUNK_BYTES = 1024 * 1024  # what is read or written at a time
LOG_CHUNK_MAX_BYTES = 1024 * 1024  # one log chunk object at most
STREAMS = ("stdout", "stderr")


class InputChecksumMismatch(Exception):
    """The claim's input, as read back, is not the document its member uploaded."""


def fetch(s3: Any, bucket: str, key: str, path: str, sha256: str | None = None) -> int:
    """Stream the object to ``path``; its size. With ``sha256``, InputChecksumMismatch when
    the bytes read are not those (the file is left for the caller's temporary directory)."""
    body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    digest = hashlib.sha256()
    size = 0
    with open(path, "wb") as out:
        for block in iter(lambda: body.read(CHUNK_BYTES), b""):
            digest.update(block)
            out.write(block)
            size += len(block)
    if sha256 is not None and digest.hexdigest() != sha256:
        raise InputChecksumMismatch(
            f"the input {key} read back has SHA-256 {digest.hexdigest()}, not the {sha256} uploaded"
        )
    return size


def put_file(s3: Any, bucket: str, key: str, path: str, content_type: str = "text/plain") -> tuple:
    """Stream the file to the object, its SHA-256 as the object's metadata; (sha256, size)."""
    sha = file_sha256(path)
    size = os.path.getsize(path)
    with open(path, "rb") as body:
        s3.put_object(
            Bucket=bucket,
            Key=key,
            Body=body,
            ContentLength=size,
            ContentType=content_type,
            Metadata={"sha256": sha},
        )
    return sha, size


def log_chunks_prefix(results_prefix: str, attempt: int, worker_id: str) -> str:
    """Where one attempt's log chunks go: ``{claim prefix}/logs/{attempt:04d}-{worker}/``."""
    return f"{results_prefix.rstrip('/')}/logs/{attempt:04d}-{worker_id}/"


class LogShipper:
    """Every ``every_s`` while a claim runs (and once more when stopped), puts what the runner
    appended to its stdout and stderr files since the last time as the next numbered chunk.
    A failed put is retried with the next beat (the bytes stay in the files)."""

    def __init__(self, s3: Any, bucket: str, prefix: str, paths: dict, every_s: float) -> None:
        self.s3, self.bucket, self.prefix, self.paths = s3, bucket, prefix, paths
        self.every_s = every_s
        self.offsets = {name: 0 for name in paths}
        self.seq = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="log-shipper", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.ship()

    def ship(self) -> None:
        with self._lock:
            for name in STREAMS:
                path = self.paths.get(name)
                if not path:
                    continue
                while True:
                    try:
                        with open(path, "rb") as f:
                            f.seek(self.offsets[name])
                            data = f.read(LOG_CHUNK_MAX_BYTES)
                    except OSError:
                        break  # not written yet
                    if not data:
                        break
                    key = f"{self.prefix}{self.seq + 1:08d}-{name}.txt"
                    try:
                        self.s3.put_object(Bucket=self.bucket, Key=key, Body=data, ContentType="text/plain")
                    except Exception as exc:
                        log.warning("log chunk %s not shipped (retried): %s", key, exc)
                        return
                    self.seq += 1
                    self.offsets[name] += len(data)

    def __enter__(self) -> LogShipper:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(10)
        self.ship()  # what was written last

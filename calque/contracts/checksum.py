"""A claim document's SHA-256 as both ends compute it: the SDK and the CLI over an input
before they upload it, the pool worker over a result or a log before it writes it (and the
API records and checks that hex digest). Read a block at a time: a document may be a GiB.

Standard library only, and Python 3.9+: the pool worker (host_agent.worker, botocore and
nothing else) imports it from the host bundle."""

from __future__ import annotations

import hashlib

BLOCK_BYTES = 1024 * 1024


def file_sha256(path: str) -> str:
    """The hex SHA-256 of the file at ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(BLOCK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()

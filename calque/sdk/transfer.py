"""Claim documents of any size to and from the bucket by the presigned URLs the API hands
out, streamed (a block at a time, never the whole document in memory) with their SHA-256
checked: the SDK and the CLI both move inputs and results this way."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from typing import IO, Any

from calque.cli.errors import CliError
from calque.contracts.checksum import file_sha256
from calque.contracts.pools import INPUT_MAX_BYTES

BLOCK = 1024 * 1024
TIMEOUT_S = 300


def write_input(items: Iterable[Any], path: str, *, limit: int = INPUT_MAX_BYTES) -> tuple[str, int, int]:
    """The input document ``{"items": [...]}`` written to ``path`` as it is encoded;
    (sha256, bytes, items). Past ``limit`` bytes (what one claim's input may be) it stops
    there, refused (``input_too_large``), rather than writing the rest to disk first."""
    count = 0
    size = len(b'{"items": [' + b"]}")
    with open(path, "wb") as f:
        f.write(b'{"items": [')
        for item in items:
            part = (", " if count else "").encode() + json.dumps(item, allow_nan=False).encode()
            size += len(part)
            if size > limit:
                raise CliError(
                    f"the claim's input passes {limit:,} bytes at item {count} (the most one claim "
                    "may take): split the items into several claims (Pool.map does)",
                    code="input_too_large",
                    details={"limit_bytes": limit, "item": count},
                )
            f.write(part)
            count += 1
        f.write(b"]}")
    return file_sha256(path), size, count


def upload_input(request: Callable[..., Any], claims_path: str, items: Iterable[Any]) -> dict[str, Any]:
    """Stage a claim's items in the bucket: the input document written to a temporary file as
    it is encoded, the URL asked for (``POST {claims_path}/input``), the file PUT there; the
    ``input`` a submit then names (``request(method, path, body)`` is the caller's API call)."""
    with tempfile.TemporaryDirectory(prefix="calque-input-") as tmp:
        doc = os.path.join(tmp, "input.json")
        sha, size, count = write_input(items, doc)
        if count == 0:
            raise CliError("a claim needs at least one item", code="invalid_input")
        target = request("POST", claims_path + "/input", {"sha256": sha, "bytes": size})
        put_file(target, doc)
    return {"claim_id": target["claim_id"], "sha256": sha, "bytes": size, "items": count}


def put_file(target: dict[str, Any], path: str) -> None:
    """PUT the claim's input file to the presigned URL ``target``, streamed from disk."""
    with open(path, "rb") as body:
        put_presigned(
            target, body, os.path.getsize(path), what="the claim's input", code="input_upload_failed"
        )


def put_presigned(
    target: dict[str, Any], body: bytes | IO[bytes], size: int, *, what: str, code: str
) -> None:
    """PUT ``body`` (``size`` bytes; a file is streamed) to the presigned URL the API answered
    in ``target`` (``url``, its ``headers``, the object's ``key``). CliError ``code``, naming
    ``what`` was uploaded, when the bucket refuses it or cannot be reached."""
    req = urllib.request.Request(  # noqa: S310 - the URL the API answered
        target["url"],
        data=body,
        method="PUT",
        headers={**dict(target.get("headers") or {}), "Content-Length": str(size)},
    )
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:  # noqa: S310
            resp.read()
    except urllib.error.HTTPError as exc:
        raise CliError(
            f"uploading {what} was refused ({exc.code}): {exc.read().decode(errors='replace')[:200]}",
            code=code,
            details={"key": target.get("key")},
        ) from None
    except OSError as exc:
        raise CliError(
            f"cannot upload {what}: {exc}", code=code, details={"key": target.get("key")}
        ) from None


def stream_to(download: dict[str, Any], out: IO[bytes]) -> int:
    """Stream the document at ``download["url"]`` into ``out``; its size. CliError
    ``result_checksum_mismatch`` when its SHA-256 is not the one the worker recorded (what
    was written to ``out`` by then is not that document: stage it, see ``download_to``). A
    write to ``out`` that fails raises its own OSError: the download did not fail."""
    digest = hashlib.sha256()
    size = 0
    try:
        resp = urllib.request.urlopen(download["url"], timeout=TIMEOUT_S)  # noqa: S310
    except urllib.error.HTTPError as exc:
        raise CliError(
            f"downloading the claim's result was refused ({exc.code})", code="result_download_failed"
        ) from None
    except OSError as exc:
        raise CliError(f"cannot download the claim's result: {exc}", code="result_download_failed") from None
    with resp:
        while True:
            try:
                block = resp.read(BLOCK)
            except OSError as exc:
                raise CliError(
                    f"cannot download the claim's result: {exc}", code="result_download_failed"
                ) from None
            if not block:
                break
            digest.update(block)
            out.write(block)
            size += len(block)
    want = download.get("sha256")
    if want and digest.hexdigest() != want:
        raise CliError(
            f"the result downloaded has SHA-256 {digest.hexdigest()}, not the {want} its worker wrote",
            code="result_checksum_mismatch",
            details={"sha256": digest.hexdigest(), "expected": want},
        )
    return size


def download_to(download: dict[str, Any], path: str | os.PathLike[str]) -> int:
    """The document at ``download["url"]`` written to ``path`` only once its SHA-256 is checked:
    streamed to a temporary file beside it, renamed over ``path`` at the end; a download that
    fails or does not match leaves ``path`` as it was (no partial or corrupt result there).
    A ``path`` that is no regular file (``/dev/stdout``, a pipe) is written as it comes. Its
    size."""
    target = os.path.realpath(os.fspath(path))  # a link to a file: the file is replaced, not the link
    if os.path.exists(target) and not os.path.isfile(target):
        with open(target, "wb") as out:
            return stream_to(download, out)
    folder, name = os.path.split(target)
    staged = os.path.join(folder, f".{name}.{uuid.uuid4().hex[:12]}.part")
    # made as open(path, "wb") would make it (the umask's mode), never over another file
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            size = stream_to(download, f)
        os.replace(staged, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(staged)
        raise
    return size

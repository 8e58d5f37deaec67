"""A claim's input and output of any size, and its logs.

Input: a claim's items that do not fit in a request body are uploaded first, straight to the
artifact bucket by a presigned PUT under the claim's own prefix (the claim id is chosen when
the URL is handed out); the submit then names that upload, and the control plane checks that
it is there, of the size stated, with the SHA-256 stated and uploaded by the same member (all
three signed into the URL as object metadata). The worker streams it to disk and checks the
SHA-256 again before running anything.

Output: the result document a worker wrote (its SHA-256 recorded in the claim's summary) is
answered inline when small, and always as a presigned GET the client streams.

Logs: a worker appends its runner's stdout and stderr as numbered chunks under the claim's
``logs/`` prefix while the claim runs; a page of them is read after a point (``after``), so a
follower asks again from where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from typing import Any

from calque.contracts.pools import ClaimInput, ClaimInputUpload
from calque.errors import Conflict, InvalidInput, NotFound
from calque.identity import Caller
from calque.pools import domain as d
from calque.pools.core import PoolsCore
from calque.pools.ports import ObjectStore, PoolStore

INPUT_CONTENT_TYPE = "application/json"
INPUT_URL_EXPIRES_S = 3600
RESULT_URL_EXPIRES_S = 3600
# A result document up to this size is also answered in the API's own body (a Lambda answer is
# at most 6 MB); a larger one only by its URL.
RESULT_INLINE_BYTES = 4 * 1024 * 1024
LOG_PAGE_BYTES = 1024 * 1024  # a page of logs holds at most this many bytes of chunks
LOG_PAGE_CHUNKS = 200
# logs/{attempt:04d}-{worker}/{seq:08d}-{stdout|stderr}.txt, written by host_agent/worker/objects.py
LOG_CHUNK = re.compile(r"^(\d{4})-([A-Za-z0-9._-]{1,100})/(\d{8})-(stdout|stderr)\.txt$")


def input_key(pool: str, claim_id: str) -> str:
    return f"{d.claim_prefix(pool, claim_id)}input.json"


def logs_prefix(pool: str, claim_id: str) -> str:
    return f"{d.claim_prefix(pool, claim_id)}logs/"


def owner_tag(principal: str) -> str:
    """Who uploaded an input, as object metadata (ASCII, short): a digest of the principal."""
    return hashlib.sha256(principal.encode()).hexdigest()[:32]


def claim_for(store: PoolStore, who: Caller, claim_id: str) -> d.ClaimRecord:
    """The claim, when the caller may read it (their own; an admin: any); another's is not found."""
    claim = store.get_claim(claim_id)
    if claim is None or (claim.user != who.principal and not who.admin):
        raise NotFound(f"no claim {claim_id!r}", details={"claim_id": claim_id})
    return claim


def uploaded_input(objects: ObjectStore, store: PoolStore, who: Caller, name: str, given: ClaimInput) -> str:
    """The key of the input a submit names, once it is checked: uploaded, by this member,
    to this pool, of the size and SHA-256 the submit states; refused otherwise."""
    key = input_key(name, given.claim_id)
    info = objects.head(key)
    field = {"field": "input.claim_id", "claim_id": given.claim_id}
    if info is None or info.metadata.get("owner") != owner_tag(who.principal):
        raise Conflict(
            f"no input was uploaded for claim {given.claim_id} of pool {name!r}: ask for its URL "
            f"(POST /v1/pools/{name}/claims/input) and PUT the document there first",
            code="input_not_uploaded",
            details=field,
        )
    if info.size != given.bytes or info.metadata.get("sha256") != given.sha256:
        raise Conflict(
            f"the input uploaded for claim {given.claim_id} is {info.size} bytes with SHA-256 "
            f"{info.metadata.get('sha256')}, not the {given.bytes} bytes and {given.sha256} stated",
            code="input_checksum_mismatch",
            details={**field, "bytes": info.size},
        )
    if store.get_claim(given.claim_id) is not None:
        raise Conflict(
            f"the input uploaded for claim {given.claim_id} was submitted already: "
            "upload it again for another claim",
            code="input_used",
            details=field,
        )
    return key


class ClaimIOMixin(PoolsCore):
    def input_upload(self, who: Caller, name: str, req: ClaimInputUpload) -> dict[str, Any]:
        """Where to PUT a claim's input (the document ``{"items": [...]}``), and the claim id
        the submit that names it will make."""
        pool = self._pool(name)
        if pool.state != d.POOL_ACTIVE:
            raise Conflict(
                f"pool {name!r} is being deleted and takes no claims",
                code="pool_deleting",
                details={"pool": name},
            )
        claim_id = f"c-{secrets.token_hex(8)}"
        key = input_key(name, claim_id)
        metadata = {"sha256": req.sha256, "owner": owner_tag(who.principal)}
        url = self.objects.presign_put(
            key, expires_s=INPUT_URL_EXPIRES_S, content_type=INPUT_CONTENT_TYPE, metadata=metadata
        )
        return {
            "claim_id": claim_id,
            "key": key,
            "url": url,
            "method": "PUT",
            "headers": {
                "Content-Type": INPUT_CONTENT_TYPE,
                **{f"x-amz-meta-{k}": v for k, v in metadata.items()},
            },
            "expires_in_s": INPUT_URL_EXPIRES_S,
        }

    def claim_result(self, who: Caller, claim_id: str) -> dict[str, Any]:
        """A succeeded claim's result: its per-item entries inline when the document is small,
        and always where to stream the document from, with its size and SHA-256."""
        claim = claim_for(self.store, who, claim_id)
        if claim.state != d.SUCCEEDED or not claim.result_key:
            raise Conflict(
                f"claim {claim_id} has no result: it is {claim.state}"
                + (f" ({claim.reason})" if claim.reason else ""),
                code="no_result",
                details={"claim_id": claim_id, "state": claim.state},
            )
        if not d.in_claim_prefix(claim.result_key, claim.pool, claim_id):
            # a worker named another object as the result: never read it for the caller
            raise Conflict(
                f"claim {claim_id}'s result is not among its own objects",
                code="no_result",
                details={"claim_id": claim_id, "state": claim.state},
            )
        summary = claim.summary or {}
        info = self.objects.head(claim.result_key)
        size = info.size if info is not None else 0
        download = {
            "url": self.objects.presign_get(claim.result_key, expires_s=RESULT_URL_EXPIRES_S),
            "bytes": size,
            "sha256": summary.get("result_sha256"),
            "expires_in_s": RESULT_URL_EXPIRES_S,
        }
        inline = size <= RESULT_INLINE_BYTES
        results = self._inline_results(claim_id, claim.result_key, summary) if inline else None
        return {"claim_id": claim_id, "summary": claim.summary, "results": results, "download": download}

    def _inline_results(self, claim_id: str, key: str, summary: dict[str, Any]) -> list[Any]:
        """The entries of a small result document, held to the SHA-256 its worker recorded, as a
        client holds a download to it: a stored document changed since (or never one) is
        refused 409, saying so, not a 500 or another document's entries passed on."""
        data = self.objects.get_bytes(key)
        want = summary.get("result_sha256")
        got = hashlib.sha256(data).hexdigest()
        if want and got != want:
            raise Conflict(
                f"claim {claim_id}'s stored result has SHA-256 {got}, not the {want} its worker wrote",
                code="result_checksum_mismatch",
                details={"claim_id": claim_id, "sha256": got, "expected": want},
            )
        try:
            results = json.loads(data).get("results")
        except (ValueError, AttributeError):
            results = None
        if not isinstance(results, list):
            raise Conflict(
                f'claim {claim_id}\'s stored result is not a result document ({{"results": [...]}})',
                code="no_result",
                details={"claim_id": claim_id, "state": d.SUCCEEDED},
            )
        return results

    def claim_logs(
        self, who: Caller, claim_id: str, *, after: str | None = None, limit_bytes: int = LOG_PAGE_BYTES
    ) -> dict[str, Any]:
        """The runner's stdout and stderr chunks of a claim written after ``after`` (a page's
        ``next``), oldest first, every attempt's in turn; ``ended``: the claim has ended, so a
        page with no chunks is the last one."""
        claim = claim_for(self.store, who, claim_id)
        # every next a page gives is a chunk's key under the logs' prefix (or the after it was given)
        if after is not None and (not LOG_CHUNK.match(after) or ".." in after):
            raise InvalidInput(
                "after is not a point this claim's logs gave: pass a page's next, unchanged",
                code="invalid_next_token",
                details={"field": "after"},
            )
        prefix = logs_prefix(claim.pool, claim_id)
        ended = claim.state not in d.LIVE  # read before the chunks: none is missed at the end
        found = self.objects.list_keys(
            prefix, start_after=prefix + after if after else None, limit=LOG_PAGE_CHUNKS
        )
        chunks: list[dict[str, Any]] = []
        taken = 0
        last, cut = after, False
        for obj in found:
            m = LOG_CHUNK.match(obj.key[len(prefix) :])
            if m is None:
                continue  # not a chunk a worker wrote: never shown
            if chunks and taken + obj.size > limit_bytes:
                cut = True
                break
            text = self.objects.get_bytes(obj.key).decode("utf-8", "replace")
            chunks.append(
                {"attempt": int(m.group(1)), "worker": m.group(2), "stream": m.group(4), "text": text}
            )
            taken += obj.size
            last = obj.key[len(prefix) :]
        more = cut or len(found) == LOG_PAGE_CHUNKS
        return {
            "claim_id": claim_id,
            "state": claim.state,
            "ended": ended and not more,
            "chunks": chunks,
            "next": last,
        }

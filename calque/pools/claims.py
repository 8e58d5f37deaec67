"""A pool's claims: submitted (recorded, manifest staged, pointer queued; idempotent with a
key), charged to a group, read, answered with their results, and cancelled. Every member
sees only their own claims (another's is "not found", never revealed)."""

from __future__ import annotations

import base64
import binascii
import json
import secrets
from typing import Any

from calque.contracts.pools import ClaimSubmit
from calque.errors import (
    CalqueError,
    Conflict,
    DependencyUnavailable,
    InvalidInput,
    NotFound,
    idempotency_key_reused,
)
from calque.identity import Caller
from calque.members import requests
from calque.pools import domain as d
from calque.pools.claim_io import claim_for, uploaded_input
from calque.pools.core import PoolsCore, _epoch, _iso
from calque.pools.ports import PoolClosed, QueueMissing, RequestRecorded
from calque.pools.store.items import pool_index

CLAIM_PAGE = 100  # claims per page at most


class ClaimsMixin(PoolsCore):
    def _not_taking(self, name: str) -> CalqueError:
        """Why pool ``name`` takes no claim now: it is gone (404) or being deleted (409)."""
        if self.store.get_pool(name) is None:
            return NotFound(f"no pool {name!r}", details={"pool": name})
        return Conflict(
            f"pool {name!r} is being deleted and takes no claims",
            code="pool_deleting",
            details={"pool": name},
        )

    def _submitted(self, who: Caller, rid: str | None, fingerprint: str) -> d.ClaimRecord | None:
        """The claim this submit (its request id) made already: a replay's answer. The same
        key with another body (items, group or pool) is ``idempotency_key_reused``."""
        found = self.store.claim_request(rid, now=self.clock.now()) if rid else None
        if found is None:
            return None
        if found.fingerprint != fingerprint:
            raise idempotency_key_reused("claim submit")
        claim = self.store.get_claim(found.claim_id)
        return claim if claim is not None and claim.user == who.principal else None

    def submit(
        self, who: Caller, name: str, req: ClaimSubmit, *, idempotency_key: str | None = None
    ) -> d.ClaimRecord:
        """Record a claim, stage its manifest and queue its pointer. With an Idempotency-Key a
        replay (a retry after a lost answer or a 503) is answered with the first attempt's
        claim, as it is now, and makes no second claim; an attempt that failed to queue its
        claim leaves the key free, so its retry submits anew."""
        key = requests.check_key(idempotency_key)
        rid = requests.request_id(who.principal, key) if key else None
        fingerprint = requests.fingerprint(f"{name}\0{req.model_dump_json()}") if rid else ""
        replayed = self._submitted(who, rid, fingerprint)
        if replayed is not None:
            return replayed
        pool = self._pool(name)
        if pool.state != d.POOL_ACTIVE:
            raise self._not_taking(name)
        if pool.start_failures >= self.config.start_failure_limit:
            raise Conflict(
                f"pool {name!r} takes no claims now: {pool.start_failures} of its worker starts in a row "
                f"failed before serving (the last: {pool.start_failure or 'no reason given'}); an "
                f"admin fixes its runner and runs `calque pool update {name} ...` to start it again",
                code="pool_failing",
                details={"pool": name, "start_failures": pool.start_failures, "reason": pool.start_failure},
            )
        group = self._claim_group(who, req.group)
        manifest: dict[str, Any] = {}
        if req.input is not None:
            # uploaded beforehand under the claim id its URL named (calque/pools/claim_io.py)
            claim_id, count = req.input.claim_id, req.input.items
            manifest_key = uploaded_input(self.objects, self.store, who, name, req.input)
            manifest = {"sha256": req.input.sha256, "bytes": req.input.bytes}
        else:
            claim_id, count = f"c-{secrets.token_hex(8)}", len(req.items or [])
            manifest_key = f"{d.claim_prefix(name, claim_id)}manifest.json"
        now = self.clock.now()
        claim = d.ClaimRecord(
            claim_id=claim_id,
            pool=name,
            user=who.principal,
            items=count,
            manifest_key=manifest_key,
            submitted_at=_iso(now),
            group=group,
        )
        request = (
            d.ClaimRequestRecord(
                request_id=rid,
                claim_id=claim_id,
                fingerprint=fingerprint,
                at=now,
                expires_at=now + requests.REPLAY_WINDOW_S,
            )
            if rid
            else None
        )
        # Recorded first, on condition the pool is still active (a delete writes its state
        # before it cancels the pool's claims and deletes its queue) and, with a key, that no
        # attempt of this request recorded one: a refusal here has written nothing.
        for _ in range(3):
            try:
                self.store.create_claim(claim, pool_active=True, request=request)
                break
            except PoolClosed:
                raise self._not_taking(name) from None
            except RequestRecorded:
                # a racing attempt of this request recorded its claim first: answer that one
                # (unless it failed to queue it and freed the key meanwhile: then try again)
                replayed = self._submitted(who, rid, fingerprint)
                if replayed is not None:
                    return replayed
        else:
            raise DependencyUnavailable(
                "attempts of this request with the same Idempotency-Key kept racing; ask again",
                details={"field": "Idempotency-Key"},
            )
        pointer = {
            "v": 1,
            "claim_id": claim_id,
            "pool": name,
            "manifest": {"bucket": self.objects.bucket, "key": manifest_key, **manifest},
            "results": {"bucket": self.objects.bucket, "prefix": d.claim_prefix(name, claim_id).rstrip("/")},
        }
        try:
            if req.items is not None:
                self.objects.put_json(manifest_key, {"claim_id": claim_id, "pool": name, "items": req.items})
            self.queues.send(pool.queue_url, json.dumps(pointer))
        except QueueMissing as exc:
            after = self.store.get_pool(name)
            if after is None or after.state != d.POOL_ACTIVE:
                # The pool's delete got past this claim's write: its queue is gone, nothing
                # was sent. The claim never was: no record (a --now delete may have cancelled
                # it meanwhile), no charge, the key free; the member is told why.
                self.store.discard_claim(claim)
                if rid:
                    self.store.release_request(rid, claim_id)
                raise self._not_taking(name) from None
            self._unqueued(pool, claim_id, rid, f"could not be queued: {exc.message}")
            raise Conflict(
                f"pool {name!r} cannot take claims: its queue {pool.queue_url} does not exist (deleted "
                f"outside calque?); an admin deletes the pool (`calque pool delete {name} --now "
                "--i-understand-this-terminates-instances`) and creates it again",
                code="pool_queue_missing",
                details={"pool": name, "queue_url": pool.queue_url},
            ) from None
        except Exception as exc:
            self._unqueued(pool, claim_id, rid, f"could not be queued: {type(exc).__name__}")
            raise
        self.nudger.nudge(name)
        return claim

    def _unqueued(self, pool: d.PoolRecord, claim_id: str, rid: str | None, reason: str) -> None:
        """A claim whose pointer could not be sent: no worker will ever take it, so it ends
        now rather than stay queued forever (nothing ran: nothing is charged), saying why;
        its key is freed so that the member's retry submits anew."""
        self._end(
            pool, claim_id, {"state": d.FAILED, "finished_at": _iso(self.clock.now()), "reason": reason}
        )
        if rid:
            self.store.release_request(rid, claim_id)

    def _claim_group(self, who: Caller, requested: str | None) -> str | None:
        """The group a claim is charged to, resolved as a check-out's is. A claim's run time
        is unknown when it is submitted, so it reserves nothing; it is refused (QuotaExceeded,
        naming the limit) when the member's or that group's month has already reached a
        monthly limit: what was used plus what live sessions reserve."""
        if self.groups is None:
            if requested is not None:
                raise InvalidInput(f"no group {requested}", code="unknown_group", details={"field": "group"})
            return None
        from calque.members import limits
        from calque.members.groups import member_group

        quota, mine = self.groups.quota_and_groups(who.principal)
        g = member_group(self.groups, who.principal, requested, mine)
        month = _iso(self.clock.now())[:7]
        refused = limits.claim_user_refusal(who.principal, quota, month) or limits.claim_group_refusal(
            g, month
        )
        if refused is not None:
            raise refused
        return g.name if g is not None else None

    def _claim_for(self, who: Caller, claim_id: str) -> d.ClaimRecord:
        return claim_for(self.store, who, claim_id)

    def get_claim(self, who: Caller, claim_id: str) -> d.ClaimRecord:
        return self._claim_for(who, claim_id)

    def list_claims(
        self, who: Caller, pool: str | None = None, limit: int = CLAIM_PAGE
    ) -> list[d.ClaimRecord]:
        """The first page of ``claim_page``."""
        return self.claim_page(who, pool, limit=limit)[0]

    def claim_page(
        self, who: Caller, pool: str | None = None, *, limit: int = CLAIM_PAGE, token: str | None = None
    ) -> tuple[list[d.ClaimRecord], str | None]:
        """A page of claims and the token of the next one (None: the last page). An admin
        naming a pool: its live claims, oldest submitted first, then its ended ones, the
        latest to end first. Anyone else: their own claims, the latest submitted first (only
        that pool's, when one is named)."""
        if pool is not None and who.admin:
            kind, after = claim_token(token, ("live", "ended"))
            out: list[d.ClaimRecord] = []
            if kind == "live":
                out = self.store.live_claims(pool, limit + 1, after=after)
                if len(out) > limit:
                    return out[:limit], encode_claim_token("live", pool_index(out[limit - 1])["expiry_sk"])
                after, limit = None, limit - len(out)
            if limit > 0:
                ended = self.store.ended_claims(pool, limit + 1, before=after if kind == "ended" else None)
                out += ended[:limit]
                if len(ended) > limit:
                    return out, encode_claim_token("ended", pool_index(ended[limit - 1])["expiry_sk"])
            return out, None
        _, before = claim_token(token, ("mine",))
        mine = self.store.claims_of_user(who.principal, limit + 1, before=before)
        page, more = mine[:limit], len(mine) > limit
        nxt = encode_claim_token("mine", f"{page[-1].submitted_at}#{page[-1].claim_id}") if more else None
        return [c for c in page if pool is None or c.pool == pool], nxt

    def cancel_claim(
        self, who: Caller, claim_id: str, *, idempotency_key: str | None = None
    ) -> d.ClaimRecord:
        """End a live claim ``cancelled``. With an Idempotency-Key, a replay of the cancel that
        ended it (its stamp is kept on the claim, written with the end) is answered with the
        claim, as the first attempt was; another cancel of an ended claim is 409."""
        key = requests.check_key(idempotency_key)
        stamp = requests.stamp(
            requests.request_id(who.principal, key) if key else None, f"cancel\0{claim_id}"
        )
        claim = self._claim_for(who, claim_id)
        if requests.is_replay(claim.cancel_request, stamp, "claim cancel"):
            return claim
        now = self.clock.now()
        # cancelled while queued: its message stays on the queue until a worker receives and
        # deletes it unrun; meanwhile the scaler does not count it (pending_discards). The
        # entry is dated when the message was sent (the claim's submission): SQS's retention
        # counts from then, not from the cancel, and an entry outliving its message would
        # hold a real claim back.
        sent = _epoch(claim.submitted_at)
        changed = self._end(
            claim.pool,
            claim_id,
            {
                "state": d.CANCELLED,
                "finished_at": _iso(now),
                "reason": f"cancelled by {who.principal}",
                "cancel_request": stamp,
            },
            discard_at=sent,
        )
        if changed is None:
            again = self.store.get_claim(claim_id)
            if again is not None and requests.is_replay(again.cancel_request, stamp, "claim cancel"):
                return again  # a racing attempt of this cancel ended it
            raise Conflict(
                f"claim {claim_id} is already {self.store.get_claim(claim_id).state if claim else 'gone'}",  # type: ignore[union-attr]
                code="claim_finished",
                details={"claim_id": claim_id},
            )
        return changed


def encode_claim_token(kind: str, after: str) -> str:
    return base64.urlsafe_b64encode(f"claims:{kind}:{after}".encode()).decode().rstrip("=")


def claim_token(token: str | None, kinds: tuple[str, ...]) -> tuple[str, str | None]:
    """(kind, resume point) of a claims list's next token; the first kind and None for the
    first page; 400 invalid_next_token for a token this list never gave."""
    if token is None:
        return kinds[0], None
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raw = ""
    tag, _, rest = raw.partition(":")
    kind, _, after = rest.partition(":")
    if tag != "claims" or kind not in kinds or not after:
        raise InvalidInput(
            "next is not a token this list gave: pass the next token of the page before, unchanged",
            code="invalid_next_token",
            details={"field": "next"},
        )
    return kind, after

"""Release: drain (every live session ends), out of placement at once, then the acquirer
terminates the instance; the budget comes back when EC2 confirms it terminated."""

from __future__ import annotations

from calque.contracts.fleet import OPEN_STATES, Acquisition, ReleaseRequest
from calque.contracts.tenancy import INSTANCE_ID_PATTERN
from calque.errors import Conflict, ConsentRequired, Forbidden, NotFound
from calque.fleet.core import FleetCore
from calque.fleet.ports import Gone
from calque.fleet.records import CLOSED_STATES
from calque.identity import Caller


class ReleaseMixin(FleetCore):
    # ---- release ---------------------------------------------------------------------------------

    def release_request(self, caller: Caller, instance_id: str, req: ReleaseRequest) -> Acquisition:
        """POST /v1/hosts/{instance_id}/release: admin, then consent, checked before anything
        changes (a member learns the route is not theirs, not what it would ask of them)."""
        if not caller.admin:
            raise Forbidden("releasing instances is for admins only", details={"principal": caller.principal})
        if not req.accept_terminate:
            raise ConsentRequired(
                "releasing terminates the instance and ends every session on it; ask again with "
                "accept_terminate (--i-understand-this-terminates-instances)",
                details={"field": "accept_terminate"},
            )
        return self.release(instance_id, req.reason or f"released by {caller.principal}")

    def release(self, instance_id: str, reason: str, *, end_reason: str = "released") -> Acquisition:
        """Drain (live sessions end with ``end_reason``), out of placement at once, terminate.
        The budget is released when EC2 confirms the instance terminated."""
        import re

        rec = self.store.by_instance(instance_id) if re.fullmatch(INSTANCE_ID_PATTERN, instance_id) else None
        if rec is None:
            raise NotFound(
                f"no instance {instance_id} was launched by the fleet; a host registered by hand "
                f"leaves with calque host deregister {instance_id}",
                details={"instance_id": instance_id},
            )
        if rec.state in CLOSED_STATES:
            raise Conflict(
                f"{instance_id} is already {rec.state}",
                code="already_released",
                details={"instance_id": instance_id, "state": rec.state},
            )
        ended = self.hosts.drain(instance_id, end_sessions=True, end_reason=end_reason, note=reason)
        if rec.state != "releasing":
            try:
                rec = self.store.update(
                    rec, expect=OPEN_STATES, state="releasing", state_reason=reason, state_since=self.clock()
                )
            except Gone:
                rec = self._must(rec.request_id)
        self.queue.send_terminate([rec.request_id])
        self._publish(
            "calque.host.releasing",
            {
                "instance_id": instance_id,
                "request_id": rec.request_id,
                "reason": reason,
                "sessions_ended": len(ended),
                "pool": rec.pool,
            },
        )
        return self._view(rec)

    def terminate(self, request_id: str) -> Acquisition | None:
        """The acquirer's half of a release: terminate the instance of a releasing acquisition."""
        rec = self.store.get(request_id)
        if rec is None or rec.instance_id is None or rec.state != "releasing":
            return self._view(rec) if rec else None
        # The release's read of the prices, where EC2 may be called (the API may not): the
        # termination's own read, when EC2 confirms it, covers the last minutes.
        iid = rec.instance_id
        rec = self.refresh_spot_rate(rec, final=True)
        self.ec2.terminate([iid])
        return self._view(rec)

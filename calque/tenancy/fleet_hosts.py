"""The fleet's Hosts port (calque.fleet.ports.Hosts) over the tenancy domain: registration
and draining go through calque.tenancy exactly as an admin's would, as the fleet's own
principal."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from calque.errors import Conflict, NotFound
from calque.fleet.ports import FLEET_CALLER

if TYPE_CHECKING:
    from calque.tenancy.service import Tenancy


class TenancyHosts:
    def __init__(self, tenancy: Tenancy) -> None:
        self.tenancy = tenancy

    def register(
        self, instance_id: str, instance_type: str, layout: dict[str, Any] | None, spot: bool
    ) -> None:
        from calque.contracts.hosts import HostRegistration
        from calque.contracts.layout import parse_layout

        req = HostRegistration(
            instance_id=instance_id,
            instance_type=instance_type,
            layout=parse_layout(layout) if layout else None,
            spot=spot,
        )
        try:
            # one key per instance: registering it again (the acquirer or the reconciler after
            # a crash between the host's write and its apply task) is a replay, which sends the
            # apply again while the host is still pending
            self.tenancy.register_host(FLEET_CALLER, req, idempotency_key=f"fleet-register-{instance_id}")
        except Conflict as exc:
            if exc.code != "already_registered":
                raise

    def drain(
        self, instance_id: str, *, end_sessions: bool, end_reason: str, note: str
    ) -> list[tuple[str, str]]:
        try:
            before = self.tenancy.get_host(FLEET_CALLER, instance_id)
        except NotFound:
            return []
        held = {s.session_id: s.holder or "" for s in before.slices if s.state == "held" and s.session_id}
        after = self.tenancy.drain(
            FLEET_CALLER, instance_id, force=end_sessions, reason=note, end_reason=end_reason
        )
        out = []
        for sid in after.ended_sessions:
            if sid not in held:  # won between the read above and the drain's fence
                session = self.tenancy.registry.get_session(sid)
                held[sid] = session.user if session is not None else ""
            out.append((sid, held[sid]))
        return sorted(out)

    def retire(self, instance_id: str, note: str) -> bool:
        try:
            self.tenancy.lifecycle().deregister(FLEET_CALLER, instance_id, force=True, reason=note)
        except NotFound:
            return False
        return True

    def registered(self) -> list[str]:
        # Draining and drained hosts too: one whose instance went is forgotten like any other
        # (left registered, it would stay listed and its idle time charged for ever).
        return [h.instance_id for h in self.tenancy.registry.list_hosts()]

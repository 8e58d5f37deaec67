"""Layer 2: which users occupy which slices inside hosts the fleet already handed over.

Receives its registry and host-task queue in its constructor; never calls EC2 and
never imports an HTTP or event type. Every lease change goes through one registry
transaction whose conditions are the truth; what this module reads first only
chooses what to try. The capabilities live in their own modules (hosts, sessions,
quotas, reaper); ``Tenancy`` composes them.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from calque.tenancy.core import (
    REAPER,
    TOKEN_PREFIX,
    ReapSummary,
    TenancyConfig,
    TenancyCore,
    hash_token,
    new_token,
    utcnow,
)
from calque.tenancy.hosts import HostsMixin
from calque.tenancy.listing import ListingMixin
from calque.tenancy.queue import QueueMixin
from calque.tenancy.quotas import QuotasMixin
from calque.tenancy.reaper import ReaperMixin
from calque.tenancy.sessions import SessionsMixin
from calque.tenancy.store.models import SessionRecord

if TYPE_CHECKING:
    from calque.tenancy.lifecycle import HostLifecycle, Instances

__all__ = [
    "REAPER",
    "TOKEN_PREFIX",
    "ReapSummary",
    "Tenancy",
    "TenancyConfig",
    "TenancyCore",
    "hash_token",
    "new_token",
    "utcnow",
]


class Tenancy(HostsMixin, QueueMixin, SessionsMixin, ListingMixin, QuotasMixin, ReaperMixin):
    """Hosts, sessions, quotas and the reaper over one registry and one host-task queue."""

    # ---- host lifecycle: deregister, register again, stalled applies (calque.tenancy.lifecycle) ----

    def lifecycle(self, *, apply_timeout_s: int = 900, instances: Instances | None = None) -> HostLifecycle:
        """``instances``: EC2, which an admin's registration is checked against (None: not checked)."""
        from calque.tenancy.lifecycle import HostLifecycle

        return HostLifecycle(self, apply_timeout_s=apply_timeout_s, instances=instances)

    def end_session(
        self, session: SessionRecord, *, at: datetime, reason: str, kind: str, by: str, note: str | None
    ) -> SessionRecord:
        """End a live session the one way every path does: recorded, counted, reclaimed."""
        return self._end(session, at=at, reason=reason, kind=kind, by=by, note=note)

"""Layer 2: which users occupy which slices inside hosts the fleet already handed over.

Receives its registry and host-task queue in its constructor; never calls EC2 and
never imports an HTTP or event type. Every lease change goes through one registry
transaction whose conditions are the truth; what this module reads first only
chooses what to try. The capabilities live in their own modules (hosts, sessions,
quotas, reaper); ``Tenancy`` composes them.
"""

from __future__ import annotations

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
from calque.tenancy.quotas import QuotasMixin
from calque.tenancy.reaper import ReaperMixin
from calque.tenancy.sessions import SessionsMixin

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


class Tenancy(HostsMixin, SessionsMixin, QuotasMixin, ReaperMixin):
    """Hosts, sessions, quotas and the reaper over one registry and one host-task queue."""

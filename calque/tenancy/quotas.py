"""Quotas: what an admin sets, what a user has used and holds, and the refusal that says so.

How monthly limits are held (a reservation at check-out, settled at the end) is in
calque.members.limits."""

from __future__ import annotations

from typing import TYPE_CHECKING

from calque.errors import Forbidden
from calque.identity import Caller
from calque.members import limits
from calque.members.records import LIMITS, QuotaRecord, month_use
from calque.tenancy.core import TenancyCore

if TYPE_CHECKING:  # built by get_quota only: the Tenancy service mixes this class into every request
    from calque.contracts.quotas import Quota, QuotaUpdate


class QuotasMixin(TenancyCore):
    def set_quota(
        self, who: Caller, user: str, req: QuotaUpdate, *, idempotency_key: str | None = None
    ) -> Quota:
        """Replace the user's three limits; with ``if_version``, only while their version is
        that one (limits_changed otherwise: calque.members.limits.write_versioned)."""
        self._check_user(user)

        def put(stamp: str | None) -> QuotaRecord:
            return self.registry.put_quota(
                user,
                **req.model_dump(include=set(LIMITS)),
                by=who.principal,
                at=self.clock(),
                if_version=req.if_version,
                request=stamp,
            )

        limits.write_versioned(
            who, req, idempotency_key, scope="user", name=user, read=self.registry.get_quota, write=put
        )
        return self.get_quota(who, user)

    def list_quotas(self, who: Caller) -> list[Quota]:
        """Admins: every member with a quota item (set, or moved by a session); members: their own."""
        users = self.registry.quota_users() if who.admin else [who.principal]
        return [self.get_quota(who, u) for u in users]

    def get_quota(self, who: Caller, user: str) -> Quota:
        from calque.contracts.quotas import Quota

        user = who.principal if user == "me" else user
        self._check_user(user)
        if user != who.principal and not who.admin:
            raise Forbidden("members may read only their own quota", details={"field": "user"})
        now = self.clock()
        month = f"{now:%Y-%m}"
        quota = self.registry.get_quota(user)
        # "Used" is what ended sessions (and ended pool claims) settled; "reserved" is what
        # live sessions hold for their whole TTL. Their sum is exactly what the monthly limit
        # checks (calque.members.limits): a live session's elapsed time is in its reservation
        # only, never counted twice. What ended sessions used is the month's settled amount on
        # the quota item: the figure the refusal quotes as used, kept by the transaction that
        # ends each session. A table kept from a version before the counters existed
        # may hold a USER#<user>/USAGE#<month> item with ends the counters never saw. It is
        # not folded in: since the counters came in every end added to both, so the item and
        # the counter overlap by an amount nothing records (adding them double-counts, taking
        # either drops ends), and the limit never counted those ends either; showing the
        # counter keeps this figure and the refusal's in agreement. The usage report (calque
        # usage) reads the lease history and still charges every one of them.
        use = month_use(quota.use if quota else {}, month)
        # The member's live-session counter: the one every grant and end moves in its own
        # transaction, and the one max_sessions is held by (exact, however many there are).
        live = quota.live if quota else 0
        explicit = quota is not None and quota.explicit
        from calque.members.groups import default_group

        charged = default_group(self.registry, user)
        return Quota(
            user=user,
            max_sessions=quota.max_sessions if explicit and quota else self.config.default_max_sessions,
            max_gpu_hours_per_month=quota.max_gpu_hours_per_month if quota else None,
            max_usd_per_month=quota.max_usd_per_month if quota else None,
            live_sessions=live,
            gpu_hours_used_this_month=limits.gpu_hours(use.settled_ugh),
            gpu_hours_reserved_this_month=limits.gpu_hours(use.reserved_ugh),
            usd_used_this_month=limits.usd(use.settled_musd),
            usd_reserved_this_month=limits.usd(use.reserved_musd),
            month=month,
            default=not explicit,
            version=quota.version if quota else 0,
            default_group=charged.name if charged else None,
        )

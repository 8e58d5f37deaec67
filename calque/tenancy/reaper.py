"""The reaper: ends sessions past their expiry and quarantines slices whose reclaim never came."""

from __future__ import annotations

from datetime import datetime, timedelta

from calque.tenancy.core import REAPER, ReapSummary, TenancyCore, _reclaims, session_ended, session_expiring
from calque.tenancy.store import keys
from calque.tenancy.store.models import LeaseEvent


class ReaperMixin(TenancyCore):
    def reap(self) -> ReapSummary:
        """End sessions past their expiry; quarantine slices whose host never reported a reclaim."""
        now = self.clock()
        out = ReapSummary()
        # Ended sessions leave the index, so each page is fresh; bounded, the next run continues.
        for _page in range(self.config.reaper_pages):
            page = self.registry.live_sessions(expiring_at_or_before=now, limit=self.config.list_limit)
            # One batched write for the page's ends, one batched send for its reclaim tasks.
            ended = self.registry.end_sessions(
                [
                    self._ending(
                        session,
                        at=now,
                        reason="expired",
                        kind="expired",
                        by=REAPER,
                        note="the TTL passed",
                        expired_by=now,
                    )
                    for session in page
                ]
            )
            done = {s.session_id for s in ended}
            self._publish([session_ended(s) for s in ended])
            self.tasks.send_many([t for s in page if s.session_id in done for t in _reclaims(s)])
            for session in page:
                # Not ended: extended or checked in meanwhile; theirs wins.
                (out.expired if session.session_id in done else out.raced).append(session.session_id)
            if len(page) < self.config.list_limit:
                break
        cutoff = now - timedelta(seconds=self.config.reclaim_timeout_s)
        for sl in self.registry.reclaiming_before(cutoff, self.config.list_limit):
            event = LeaseEvent(
                kind="quarantined",
                at=now,
                who=REAPER,
                why=f"no reclaim report within {self.config.reclaim_timeout_s} s",
                instance_id=sl.instance_id,
                slice_id=sl.slice_id,
                fence=sl.fence,
            )
            if self.registry.quarantine(sl, at=now, event=event):
                out.quarantined.append(f"{sl.instance_id}/{sl.slice_id}")
        self._announce_expiring(now)
        # The queue's backstop: whatever freed without its own trigger is granted here.
        self._capacity_freed()
        return out

    def _announce_expiring(self, now: datetime) -> None:
        """``calque.session.expiring``, once per session, ``expiring_notice_s`` before its end."""
        mark = getattr(self.registry, "mark_expiring", None)
        if mark is None or self.config.expiring_notice_s <= 0:
            return
        soon = now + timedelta(seconds=self.config.expiring_notice_s)
        after: str | None = None
        # Page on: the first page alone holds the soonest ones, already announced by an earlier
        # run, and would keep any later ones from ever being announced.
        for _page in range(self.config.reaper_pages):
            page = self.registry.live_sessions(
                expiring_at_or_before=soon, limit=self.config.list_limit, after=after
            )
            for s in page:
                if s.expires_at > now and mark(s.session_id, s.expires_at):
                    self._publish([session_expiring(s)])
            if len(page) < self.config.list_limit:
                break
            after = keys.expiry_sk(page[-1].expires_at, page[-1].session_id)

"""Property: whatever sequence of check-outs, check-ins (right or wrong token), extends,
forced ends, expiries and reclaim reports (timely or stale) happens, the lease rules hold."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from calque.contracts.tenancy import CheckinRequest, CheckoutRequest, ExtendRequest
from calque.errors import CalqueError
from calque.tenancy.service import TenancyConfig
from tests.unit.tenancy.conftest import ADMIN, World, member

pytestmark = pytest.mark.unit

USERS = [member(n) for n in ("alice", "bob", "carol")]
HOSTS = ("i-0aaa0001", "i-0bbb0002")
LAYOUT = {"gpus": [{"devices": "all", "mig": {"1g.24gb": 2, "2g.48gb": 1}}]}


class LeaseMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.world = World(TenancyConfig(reclaim_timeout_s=300, ttl_max_s=3600), seed=1)
        for h in HOSTS:
            self.world.ready_host(h, layout=LAYOUT)
        self.tokens: dict[str, str] = {}
        self.fence_seen: dict[tuple[str, str], int] = {}
        self.granted_fences: dict[tuple[str, str], list[int]] = {}

    def _pick(self, n: int) -> str | None:
        ids = sorted(self.tokens)
        return ids[n % len(ids)] if ids else None

    @rule(user=st.sampled_from(USERS), memory=st.sampled_from([None, 20.0, 40.0]), ttl=st.integers(10, 600))
    def checkout(self, user, memory, ttl):
        try:
            g = self.world.tenancy.checkout(
                user, CheckoutRequest(backend="mig", min_memory_gib=memory, ttl_seconds=ttl)
            )
        except CalqueError as exc:
            assert exc.code in ("no_free_slice", "quota_exceeded")  # noqa: PT017
            return
        self.tokens[g.session_id] = g.token
        key = (g.instance_id, g.slice_id)
        self.granted_fences.setdefault(key, []).append(self.world.registry.sessions[g.session_id].fence)

    @rule(n=st.integers(0, 50), right=st.booleans())
    def checkin(self, n, right):
        sid = self._pick(n)
        if sid is None:
            return
        s = self.world.registry.sessions[sid]
        before = s.state
        token = self.tokens[sid] if right else "wrong-token"
        try:
            self.world.tenancy.checkin(member(s.user), sid, CheckinRequest(token=token))
        except CalqueError as exc:
            if not right:
                assert self.world.registry.sessions[sid].state == before  # a wrong token releases nothing
            assert exc.code in ("invalid_token", "already_checked_in", "slice_state_changed")  # noqa: PT017

    @rule(n=st.integers(0, 50), seconds=st.integers(1, 1200))
    def extend(self, n, seconds):
        sid = self._pick(n)
        if sid is None:
            return
        s = self.world.registry.sessions[sid]
        try:
            self.world.tenancy.extend(
                member(s.user), sid, ExtendRequest(token=self.tokens[sid], ttl_seconds=seconds)
            )
        except CalqueError as exc:
            assert exc.code in ("session_ended", "session_expired", "invalid_ttl", "session_changed")  # noqa: PT017

    @rule(n=st.integers(0, 50))
    def force(self, n):
        sid = self._pick(n)
        if sid is None:
            return
        try:
            self.world.tenancy.checkin(ADMIN, sid, CheckinRequest(force=True, reason="property"))
        except CalqueError as exc:
            assert exc.code in ("already_checked_in", "slice_state_changed")  # noqa: PT017

    @rule(seconds=st.integers(1, 400))
    def time_passes(self, seconds):
        self.world.clock.advance(seconds)

    @rule()
    def reaper_runs(self):
        self.world.tenancy.reap()

    @rule(host=st.sampled_from(HOSTS), n=st.integers(0, 10), stale_by=st.sampled_from([0, 0, 30, 900]))
    def agent_reports_reclaim(self, host, n, stale_by):
        slices = self.world.registry.slices(host)
        sl = slices[n % len(slices)]
        self.world.clock.advance(1)
        started = self.world.clock() - timedelta(seconds=stale_by)
        self.world.reclaimed(host, sl.slice_id, started_at=started)

    # ---- the rules ----------------------------------------------------------------------------

    @invariant()
    def a_slice_is_held_by_at_most_one_live_session_and_agrees_with_it(self):
        live = [s for s in self.world.registry.sessions.values() if s.state == "live"]
        per_slice = Counter((s.instance_id, s.slice_id) for s in live)
        assert all(c == 1 for c in per_slice.values())
        for s in live:
            sl = self.world.registry.slice_map[(s.instance_id, s.slice_id)]
            assert (sl.state, sl.session_id, sl.fence) == ("held", s.session_id, s.fence)
        held = [k for k, sl in self.world.registry.slice_map.items() if sl.state == "held"]
        assert sorted(held) == sorted(per_slice)

    @invariant()
    def fences_never_go_back_and_every_grant_raises_them(self):
        for key, sl in self.world.registry.slice_map.items():
            assert sl.fence >= self.fence_seen.get(key, 0)
            self.fence_seen[key] = sl.fence
        for fences in self.granted_fences.values():
            assert fences == sorted(set(fences))

    @invariant()
    def live_counts_match_and_are_never_negative(self):
        live = Counter(s.user for s in self.world.registry.sessions.values() if s.state == "live")
        for user, q in self.world.registry.quotas.items():
            assert q.live >= 0
            assert q.live == live.get(user, 0)

    @invariant()
    def no_placeable_slice_is_anything_but_free(self):
        for sl in self.world.registry.slice_map.values():
            assert not sl.placeable or sl.state == "free"


TestLeaseMachine = LeaseMachine.TestCase
TestLeaseMachine.settings = settings(
    max_examples=40, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

"""EC2's word on the fleet's instances (state changes, spot interruption warnings, rebalance
recommendations) and the reconciler, which makes the store and EC2 agree after a crash or a
lost event (adopting, registering, timing out, releasing at the TTL, forgetting lost hosts)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from calque.contracts.fleet import OPEN_STATES
from calque.fleet.core import TAG_REQUEST
from calque.fleet.ports import Gone, Instance
from calque.fleet.records import CLOSED_STATES
from calque.fleet.release import ReleaseMixin


@dataclass
class ReconcileSummary:
    adopted: list[str] = field(default_factory=list)
    registered: list[str] = field(default_factory=list)
    terminated_untracked: list[str] = field(default_factory=list)
    waiting_untracked: list[str] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)
    hosts_lost: list[str] = field(default_factory=list)
    timed_out: list[str] = field(default_factory=list)
    ttl_released: list[str] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, list[str]]:
        return {k: list(v) for k, v in self.__dict__.items()}


SPOT_WARNING = "spot interruption warning"  # an acquisition's state_reason once EC2 warned


class ReconcileMixin(ReleaseMixin):
    # ---- EC2's word (EventBridge) ----------------------------------------------------------------

    def on_instance_state(self, instance_id: str, state: str) -> str:
        """An EC2 Instance State-change Notification. Returns what it did, for the log."""
        rec = self.store.by_instance(instance_id)
        if rec is None:
            return "ignored: not launched by the fleet"
        if state == "running":
            before = rec.state
            rec = self._try_register(rec)
            return f"{before} -> {rec.state}"
        if state in ("shutting-down", "terminated", "stopping", "stopped"):
            if rec.state not in CLOSED_STATES:
                reason = "released" if rec.state == "releasing" else "host_lost"
                rec = self._end_host(rec, reason=reason, note=f"EC2 reports the instance {state}")
            if state == "terminated":
                closed = self._close_terminated(rec, "EC2 confirmed the instance terminated")
                return "terminated, budget released" if closed else "already closed"
            return f"drained ({state})"
        return f"noted {state}"

    def on_spot_interruption(self, instance_id: str) -> str:
        """EC2 Spot Instance Interruption Warning: two minutes left. Drain at once and end every
        session there with ``spot_interrupted``; EC2 terminates it, which releases the budget."""
        rec = self.store.by_instance(instance_id)
        ended = self.hosts.drain(
            instance_id,
            end_sessions=True,
            end_reason="spot_interrupted",
            note="EC2 is reclaiming this spot instance (interruption warning)",
        )
        # EC2's warning is delivered at least once: one already handled is not announced again
        again = rec is not None and rec.state_reason == SPOT_WARNING and not ended
        if not again:
            self._publish(
                "calque.host.spot_interrupted",
                {
                    "instance_id": instance_id,
                    "request_id": rec.request_id if rec else None,
                    "sessions_ended": len(ended),
                    "pool": rec.pool if rec else None,
                },
            )
        if rec is not None and rec.state in OPEN_STATES and rec.state_reason != SPOT_WARNING:
            with contextlib.suppress(Gone):
                self.store.update(rec, expect=(rec.state,), state_reason=SPOT_WARNING)
        return f"drained, {len(ended)} session(s) ended"

    def on_rebalance(self, instance_id: str) -> str:
        """EC2 Instance Rebalance Recommendation: stop placing sessions there; live ones stay."""
        self.hosts.drain(
            instance_id,
            end_sessions=False,
            end_reason="drained",
            note="EC2 recommends rebalancing: this spot instance is at elevated risk of interruption",
        )
        rec = self.store.by_instance(instance_id)
        self._publish(
            "calque.host.draining",
            {
                "instance_id": instance_id,
                "reason": "rebalance_recommendation",
                "pool": rec.pool if rec else None,
            },
        )
        return "placements stopped"

    # ---- the reconciler --------------------------------------------------------------------------

    def reconcile(self) -> ReconcileSummary:
        """Make the store and EC2 agree. Cost: DescribeInstances pages filtered by tag, one
        read of the acquisitions, one of the hosts; per-instance calls only for what changes
        (and a spot instance's price history once its read is due: ``refresh_spot_rate``)."""
        now = self.clock()
        out = ReconcileSummary()
        live: dict[str, Instance] = {i.instance_id: i for i in self.ec2.managed_instances()}
        records = self.store.list()
        by_request = {r.request_id: r for r in records}
        tracked = {r.instance_id for r in records if r.instance_id and r.state in OPEN_STATES}
        untracked: list[str] = []
        for inst in live.values():
            rid = inst.tags.get(TAG_REQUEST)
            if rid is None or inst.instance_id in tracked:
                continue  # adopted by hand (host register), or ours and known
            rec = by_request.get(rid)
            if rec is not None and rec.state in ("queued", "launching") and rec.instance_id is None:
                rec = self._launched(rec, inst, None)  # a crash between RunInstances and the record
                by_request[rid] = rec
                tracked.add(inst.instance_id)
                out.adopted.append(inst.instance_id)
                continue
            if inst.state in ("shutting-down",):
                continue
            if (now - inst.launched_at).total_seconds() >= self.config.untracked_grace_s:
                untracked.append(inst.instance_id)
            else:
                out.waiting_untracked.append(inst.instance_id)
        if untracked:
            self.ec2.terminate(untracked)
            out.terminated_untracked += untracked
            for iid in untracked:
                self._publish("calque.host.terminated", {"instance_id": iid, "reason": "untracked"})

        open_recs = [r for r in by_request.values() if r.state in OPEN_STATES]
        missing = [r.instance_id for r in open_recs if r.instance_id and r.instance_id not in live]
        still = self.ec2.existing(missing) if missing else set()
        booting = [r for r in open_recs if r.state == "booting" and r.instance_id in live]
        running = [r.instance_id for r in booting if r.instance_id and live[r.instance_id].state == "running"]
        online = self.ec2.agent_online(running) if running else set()
        releasing_live: list[str] = []
        for rec in open_recs:
            if rec.instance_id is None:
                if (now - rec.created_at).total_seconds() >= self.config.launch_timeout_s:
                    self._fail(
                        rec, f"no instance after {self.config.launch_timeout_s}s: the launch timed out"
                    )
                    out.timed_out.append(rec.request_id)
                continue
            iid = rec.instance_id
            if iid not in live and iid not in still:
                reason = "released" if rec.state == "releasing" else "host_lost"
                rec = self._end_host(rec, reason=reason, note="EC2 no longer knows the instance")
                if self._close_terminated(rec, "EC2 no longer knows the instance"):
                    out.vanished.append(iid)
                continue
            expired = rec.expires_at is not None and rec.expires_at <= now
            if not expired:  # (a release reads the prices itself, once more)
                rec = self.refresh_spot_rate(rec)
            if rec.state == "releasing":
                releasing_live.append(iid)
                continue
            if expired:
                self.release(iid, f"its TTL of {rec.ttl_s}s passed", end_reason="host_ttl")
                out.ttl_released.append(iid)
                releasing_live.append(iid)
                continue
            if rec.state == "booting":
                after = self._try_register(rec, online)
                if after.state == "registered":
                    out.registered.append(iid)
                elif (now - rec.state_since).total_seconds() >= self.config.boot_timeout_s:
                    self.release(iid, f"its SSM agent never came online within {self.config.boot_timeout_s}s")
                    releasing_live.append(iid)
        if releasing_live:
            self.ec2.terminate(releasing_live)  # idempotent: a lost terminate is sent again

        known = tracked | set(live)
        orphans = [h for h in self.hosts.registered() if h not in known]
        gone = set(orphans) - (self.ec2.existing(orphans) if orphans else set())
        for iid in sorted(gone):
            ended = self.hosts.drain(
                iid, end_sessions=True, end_reason="host_lost", note="EC2 no longer knows the instance"
            )
            self.hosts.retire(iid, "EC2 no longer knows the instance")
            self._publish("calque.host.lost", {"instance_id": iid, "sessions_ended": len(ended)})
            out.hosts_lost.append(iid)
        return out

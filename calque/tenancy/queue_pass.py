"""One scheduling pass of the session queue (``calque.tenancy.queue.grant_waiting``): what it
reads, how a pick fits and what it holds from those behind it, and how a refusal is scoped.
Pure over the records it is given, but for the fleet read at most once (``FleetRead``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from calque.contracts.tenancy import CheckoutRequest
from calque.tenancy import fairshare, queue_cards
from calque.tenancy.placement import _fits
from calque.tenancy.store.queue_records import AccountRecord, QueuedRecord, account_of

if TYPE_CHECKING:
    from calque.tenancy.store.models import HostRecord, SessionRecord, SliceRecord

# Why a pick was not granted where a limit holds: the member's own (as many live sessions as
# they may hold: every request of theirs), their group's (full: every request charged to it),
# or this request's alone (a monthly limit its size and TTL would pass).
REFUSED_USER, REFUSED_GROUP, REFUSED = "refused:user", "refused:group", "refused"
REFUSALS = (REFUSED_USER, REFUSED_GROUP, REFUSED)


def refused_with(rec: QueuedRecord, why: str, waiting: Iterable[QueuedRecord]) -> set[str]:
    """The requests a refusal of ``rec`` refuses this pass as well: no plan of the pass would
    grant them (those of the same member, or charged to the same group, as ``why`` says)."""
    if why == REFUSED_USER:
        return {r.request_id for r in waiting if r.user == rec.user} | {rec.request_id}
    if why == REFUSED_GROUP and rec.group is not None:
        return {r.request_id for r in waiting if r.group == rec.group} | {rec.request_id}
    return {rec.request_id}


Fleet = tuple[list[tuple["HostRecord", list["SliceRecord"]]], list["SessionRecord"]]


@dataclass
class FleetRead:
    """The fleet with its live sessions, read at most once, and only when a request for
    several cards needs it (to reserve, or for its estimate)."""

    read: Callable[[], Fleet]
    _got: Fleet | None = None

    def __call__(self) -> Fleet:
        if self._got is None:
            self._got = self.read()
        return self._got


@dataclass
class PassState:
    """What a scheduling pass read, and what its own grants changed since."""

    now: datetime
    t: float
    waiting: dict[str, QueuedRecord]
    asks: dict[str, CheckoutRequest]
    free: list[SliceRecord]
    accounts: dict[str, AccountRecord]
    seq: int
    usage: dict[str, float]
    shares: dict[str, float]
    # the fleet and its live sessions, read only when a multi-card request first reserves
    cards: FleetRead
    _held: dict[str, Callable[[fairshare.Waiting, SliceRecord], bool]] = field(default_factory=dict)

    def fits(self, w: fairshare.Waiting, s: SliceRecord) -> bool:
        return self.fits_ask(self.asks[w.request_id], s)

    @staticmethod
    def fits_ask(ask: CheckoutRequest, s: SliceRecord, *, any_state: bool = False) -> bool:
        return _fits(s, ask, any_state=any_state) and ask.instance_id in (None, s.instance_id)

    def take(self, w: fairshare.Waiting, open_: Sequence[SliceRecord]) -> list[SliceRecord] | None:
        """The slots a request takes: its best fit, or ``gpus`` whole cards of one host."""
        ask = self.asks[w.request_id]
        fitting = [s for s in open_ if self.fits_ask(ask, s)]
        if ask.gpus > 1:
            return queue_cards.cards_of_one_host(ask.gpus, fitting)
        return fitting[:1] or None

    def hold(
        self, r: fairshare.Waiting, _free: Sequence[SliceRecord]
    ) -> Callable[[fairshare.Waiting, SliceRecord], bool]:
        """What a reserving request keeps from those behind it: every slot that fits it, or,
        for several cards, the cards of the host it reserves (queue_cards.reserve)."""
        if r.request_id in self._held:
            return self._held[r.request_id]
        ask = self.asks[r.request_id]
        kept: Callable[[fairshare.Waiting, SliceRecord], bool]
        if ask.gpus <= 1:
            kept = lambda _w, s: self.fits_ask(ask, s)  # noqa: E731
        else:
            fleet, live = self.cards()
            rule = queue_cards.holds(
                queue_cards.reserve(
                    ask.gpus, lambda s: self.fits_ask(ask, s, any_state=True), fleet, live, self.now
                ),
                lambda s: self.fits_ask(ask, s, any_state=True),
                lambda rid: self.now + timedelta(seconds=self.waiting[rid].ttl_seconds),
            )
            kept = lambda w, s: rule(w.request_id, s)  # noqa: E731
        self._held[r.request_id] = kept
        return kept

    def cost(self, w: fairshare.Waiting, s: SliceRecord) -> float:
        """GPU-hours a grant charges its account: the slice's share of a card for the TTL."""
        return s.gpu_fraction * self.waiting[w.request_id].ttl_seconds / 3600


def decayed(accounts: dict[str, AccountRecord], t: float, policy: fairshare.Policy) -> dict[str, float]:
    """Each account's usage at ``t``, decayed with the half-life it was weighed with."""
    return {
        a: fairshare.Usage(r.usage_v, r.usage_ref if r.usage_ref is not None else t).at(
            t, r.usage_hl if r.usage_hl is not None else policy.half_life_s
        )
        for a, r in accounts.items()
    }


def waiting_of(r: QueuedRecord) -> fairshare.Waiting:
    return fairshare.Waiting(r.request_id, account_of(r.group, r.user), r.submitted_us / 1_000_000)

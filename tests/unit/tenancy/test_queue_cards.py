"""The queue's rules for requests of several cards (calque.tenancy.queue_cards), on records
built by hand: the order free slots are offered in, N cards of one host, the host a waiting
request reserves and when, and what that reservation keeps from those behind it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from calque.tenancy import queue_cards as qc
from calque.tenancy.store.models import HostRecord, SessionRecord, SliceRecord

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def _card(
    iid: str, gpu: int, state: str = "free", backend: str = "exclusive", mem: float = 96.0
) -> SliceRecord:
    return SliceRecord(
        instance_id=iid,
        slice_id=f"g{gpu}-whole" if backend == "exclusive" else f"g{gpu}-s",
        gpu_index=gpu,
        backend=backend,  # type: ignore[arg-type]
        profile="whole" if backend == "exclusive" else "1g.24gb",
        memory_gib=mem,
        state=state,  # type: ignore[arg-type]
        placeable=state == "free",
        state_since=T0,
    )


def _host(iid: str, state: str = "ready") -> HostRecord:
    return HostRecord(
        instance_id=iid,
        instance_type="g7e.24xlarge",
        sharing="exclusive",
        state=state,  # type: ignore[arg-type]
        registered_at=T0,
        registered_by="t",
        state_since=T0,
    )


def _session(iid: str, cards: list[int], ends_in_s: int) -> SessionRecord:
    return SessionRecord(
        session_id=f"s-{iid}-{cards[0]}",
        user="u",
        instance_id=iid,
        slice_id=f"g{cards[0]}-whole",
        extra_slices=[f"g{c}-whole" for c in cards[1:]],
        backend="exclusive",
        profile="whole",
        memory_gib=96.0 * len(cards),
        state="live",
        fence=1,
        token_hash="x",
        created_at=T0,
        expires_at=T0 + timedelta(seconds=ends_in_s),
    )


def _whole(s: SliceRecord) -> bool:
    return s.backend == "exclusive"


def test_slices_are_offered_before_cards_and_cards_of_the_fullest_host_first() -> None:
    free = [_card("i-b", 0), _card("i-b", 1), _card("i-a", 3), _card("i-c", 0, backend="mig", mem=24.0)]
    order = [(s.instance_id, s.slice_id) for s in qc.offer_order(free)]
    # the slice first; then the lone free card of i-a before the pair on i-b (kept whole)
    assert order == [("i-c", "g0-s"), ("i-a", "g3-whole"), ("i-b", "g0-whole"), ("i-b", "g1-whole")]


def test_n_cards_come_from_one_host_the_one_with_fewest_that_still_has_n() -> None:
    fitting = [_card("i-a", g) for g in (3, 0, 1)] + [_card("i-b", g) for g in (2, 1)] + [_card("i-c", 0)]
    got = qc.cards_of_one_host(2, fitting)
    assert got is not None
    assert [(s.instance_id, s.gpu_index) for s in got] == [("i-b", 1), ("i-b", 2)]
    taken = qc.cards_of_one_host(3, fitting)
    assert taken is not None
    assert [(s.instance_id, s.gpu_index) for s in taken] == [("i-a", 0), ("i-a", 1), ("i-a", 3)]
    assert qc.cards_of_one_host(4, fitting) is None


def test_the_reserved_host_is_where_n_cards_free_soonest() -> None:
    fleet = [
        # i-a: one free card, the others end in 1 h, 3 h, 5 h
        (_host("i-a"), [_card("i-a", 0), *(_card("i-a", g, "held") for g in (1, 2, 3))]),
        # i-b: none free, but one session of two cards ends in 30 min and one is reclaiming
        (_host("i-b"), [_card("i-b", 0, "reclaiming"), *(_card("i-b", g, "held") for g in (1, 2, 3))]),
        # i-c: four free, but draining
        (_host("i-c", "draining"), [_card("i-c", g) for g in range(4)]),
    ]
    live = [
        _session("i-a", [1], 3600),
        _session("i-a", [2], 3 * 3600),
        _session("i-a", [3], 5 * 3600),
        _session("i-b", [1, 2], 1800),
        _session("i-b", [3], 7200),
    ]
    two = qc.reserve(2, _whole, fleet, live, T0)
    assert two == qc.Reservation("i-b", T0 + timedelta(seconds=1800))
    # four cards: i-a's last ends at 5 h, i-b's at 2 h
    assert qc.reserve(4, _whole, fleet, live, T0) == qc.Reservation("i-b", T0 + timedelta(seconds=7200))
    # a held card whose session is not known never counts: i-b cannot hold four without it
    assert qc.reserve(4, _whole, fleet, live[:4], T0) == qc.Reservation("i-a", T0 + timedelta(hours=5))
    assert qc.reserve(5, _whole, fleet, live, T0) is None


def test_a_reservation_keeps_its_hosts_cards_from_what_would_end_after_it_starts() -> None:
    start = T0 + timedelta(seconds=1800)
    ends = {"short": T0 + timedelta(seconds=900), "long": T0 + timedelta(seconds=3600)}
    keeps = qc.holds(qc.Reservation("i-b", start), _whole, ends.__getitem__)
    assert keeps("long", _card("i-b", 0))
    assert not keeps("short", _card("i-b", 0))  # ends before the reservation starts
    assert not keeps("long", _card("i-a", 0))  # another host's card
    assert not keeps("long", _card("i-b", 0, backend="mig", mem=24.0))  # not what it waits for
    # no host could hold it: it keeps every fitting slot, as a one-slot request does
    everything = qc.holds(None, _whole, ends.__getitem__)
    assert everything("short", _card("i-a", 0))
    assert not everything("short", _card("i-a", 0, backend="mig", mem=24.0))

"""``calque catalog types | cards | profiles``: what the GPU catalog (calque/catalog) knows,
with no call to the control plane: instance types with their cards, GPU counts and on-demand
rates; cards with their memory, MIG and MPS limits; MIG profiles with memory and counts."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    from calque.cli.main import command_group

    group = command_group(
        subparsers, "catalog", help="instance types, cards, MIG profiles, MPS limits and on-demand rates"
    )
    p = group.add_parser("types", help="GPU instance types: card, GPUs, memory and on-demand rate")
    p.add_argument(
        "--card", metavar="CARD", help="only types with this card, e.g. L40S (default: every type)"
    )
    p.set_defaults(func=lambda ctx, args: do_types(ctx, card=args.card))
    p = group.add_parser("cards", help="GPU cards: memory, MIG and MPS support and limits")
    p.set_defaults(func=lambda ctx, args: do_cards(ctx))
    p = group.add_parser("profiles", help="MIG profiles: memory of one instance and how many fit on one GPU")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--card", metavar="CARD", help="only this card's profiles (default: every card's)")
    which.add_argument(
        "--instance-type", metavar="T", help="only the profiles of this type's card (default: every card's)"
    )
    p.set_defaults(func=_profiles)


def do_types(ctx: Any, *, card: str | None = None) -> None:
    from calque import catalog

    wanted = catalog.card(card).name if card else None
    rows = [
        {
            "instance_type": t.name,
            "card": t.card.name,
            "gpus": t.gpu_count,
            "gpu_memory_gib": t.card.memory_gib,
            "mig": t.card.mig_capable,
            "mps": t.card.mps_capable,
            "on_demand_usd_per_hour": t.hourly_usd,
            "price_as_of": t.price_as_of.isoformat(),
            "price_verified": t.price_verified,
        }
        for t in catalog.instance_types()
        if wanted is None or t.card.name == wanted
    ]
    ctx.emit(
        rows,
        columns=[
            ("instance type", "instance_type"),
            ("card", "card"),
            ("gpus", "gpus"),
            ("GiB/gpu", lambda r: f"{r['gpu_memory_gib']:g}"),
            ("mig", "mig"),
            ("mps", "mps"),
            ("usd/hour", lambda r: f"{r['on_demand_usd_per_hour']:.3f}"),
            ("as of", "price_as_of"),
            ("verified", "price_verified"),
        ],
    )


def do_cards(ctx: Any) -> None:
    from calque import catalog

    rows = [
        {
            "card": c.name,
            "family": c.family,
            "memory_gib": c.memory_gib,
            "mig": c.mig_capable,
            "mig_profiles": [p.name for p in c.mig_profiles],
            "mps": c.mps_capable,
            "max_mps_clients": c.max_mps_clients if c.mps_capable else None,
            "verified_on_hardware": c.verified_on_hardware,
        }
        for c in catalog.cards()
    ]
    ctx.emit(
        rows,
        columns=[
            ("card", "card"),
            ("family", "family"),
            ("GiB", lambda r: f"{r['memory_gib']:g}"),
            ("mig", "mig"),
            ("mps", "mps"),
            ("max mps clients", "max_mps_clients"),
            ("mig profiles", "mig_profiles"),
        ],
    )


def _profiles(ctx: Any, args: argparse.Namespace) -> None:
    do_profiles(ctx, card=args.card, instance_type=args.instance_type)


def do_profiles(ctx: Any, *, card: str | None = None, instance_type: str | None = None) -> None:
    from calque import catalog

    if instance_type is not None:
        cards = [catalog.instance_type(instance_type).card]
    elif card is not None:
        cards = [catalog.card(card)]
    else:
        cards = [c for c in catalog.cards() if c.mig_capable]
    rows = [
        {
            "card": c.name,
            "profile": p.name,
            "memory_gib": p.memory_gib,
            "max_per_gpu": p.max_count,
            "compute_slices": p.compute_slices,
            "memory_slices": p.memory_slices,
        }
        for c in cards
        for p in c.mig_profiles
    ]
    ctx.emit(
        rows,
        columns=[
            ("card", "card"),
            ("profile", "profile"),
            ("GiB", lambda r: f"{r['memory_gib']:g}"),
            ("max/gpu", "max_per_gpu"),
            ("compute slices", "compute_slices"),
            ("memory slices", "memory_slices"),
        ],
    )

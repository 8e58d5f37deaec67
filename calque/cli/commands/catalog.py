"""``calque catalog [TYPE] | types | cards | profiles``: what the GPU catalog (calque/catalog) knows,
with no call to the control plane: instance types with their cards, GPU counts and on-demand
rates; cards with their memory, MIG and MPS limits; MIG profiles with memory and counts."""

from __future__ import annotations

import argparse
from typing import Any

VERBS = ("types", "cards", "profiles")


def register(subparsers: Any) -> None:
    from calque.cli.main import command_group

    group = command_group(
        subparsers, "catalog", help="instance types, cards, MIG profiles, MPS limits and on-demand rates"
    )
    # `calque catalog` alone: every type; `calque catalog TYPE`: that type in full (CONTRACT.md)
    parent = subparsers.choices["catalog"]
    parent.set_defaults(func=lambda ctx, args: do_types(ctx))
    parent.usage = (
        "calque catalog [TYPE | types [--card C] | cards | profiles [--card C | --instance-type T]]"
    )
    parent.description = (
        "instance types, cards, MIG profiles, MPS limits and on-demand rates; with no command, "
        "every instance type; with an instance type, that type in full"
    )
    group.fallback = "_type"
    p = group.add_parser(  # no help=: argparse then lists no line for it
        "_type",
        usage="calque catalog TYPE",
        description="one instance type: its card, GPUs, on-demand rate, MIG profiles and MPS limit",
        epilog="example:\n  calque catalog g7e.2xlarge\n  calque catalog p5e.48xlarge --output json",
    )
    p.add_argument("instance_type", metavar="TYPE", help="an instance type of the catalog (required)")
    p.set_defaults(func=lambda ctx, args: do_type(ctx, instance_type=args.instance_type))
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


def _type_row(t: Any) -> dict[str, Any]:
    """An instance type as ``catalog types`` lists it (``catalog TYPE`` says more)."""
    return {
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


def _profile_row(p: Any) -> dict[str, Any]:
    """A MIG profile as ``catalog profiles`` and ``catalog TYPE`` list it."""
    return {
        "profile": p.name,
        "memory_gib": p.memory_gib,
        "max_per_gpu": p.max_count,
        "compute_slices": p.compute_slices,
        "memory_slices": p.memory_slices,
    }


PROFILE_COLUMNS: list[Any] = [
    ("profile", "profile"),
    ("GiB", lambda r: f"{r['memory_gib']:g}"),
    ("max/gpu", "max_per_gpu"),
    ("compute slices", "compute_slices"),
    ("memory slices", "memory_slices"),
]


def do_types(ctx: Any, *, card: str | None = None) -> None:
    from calque import catalog

    wanted = catalog.card(card).name if card else None
    rows = [_type_row(t) for t in catalog.instance_types() if wanted is None or t.card.name == wanted]
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


def do_type(ctx: Any, *, instance_type: str) -> None:
    """One instance type in full; a word that is neither a verb nor a type is a usage error."""
    from calque import catalog
    from calque.cli.errors import UsageError
    from calque.cli.helptext import did_you_mean
    from calque.cli.output import render_fields, render_table
    from calque.errors import InvalidInput

    try:
        t = catalog.instance_type(instance_type)
    except InvalidInput as exc:
        guess = did_you_mean(instance_type, VERBS) or f": {exc.message.split('; ', 1)[-1]}"
        raise UsageError(
            f"{instance_type!r} is neither a catalog command ({', '.join(VERBS)}) nor an instance "
            f"type of the catalog{guess}",
            code="invalid_input",
            details={"field": "instance_type", "value": instance_type},
        ) from None
    c = t.card
    profiles = [_profile_row(p) for p in c.mig_profiles]
    doc: dict[str, Any] = {
        **_type_row(t),
        "family": c.family,
        "mig_profiles": profiles,
        "max_mps_clients": c.max_mps_clients if c.mps_capable else None,
    }
    fields: list[Any] = [
        ("instance type", "instance_type"),
        ("card", "card"),
        ("family", "family"),
        ("gpus", "gpus"),
        ("GiB/gpu", lambda r: f"{r['gpu_memory_gib']:g}"),
        ("usd/hour", lambda r: f"{r['on_demand_usd_per_hour']:.3f} (on demand)"),
        ("as of", "price_as_of"),
        ("verified", "price_verified"),
        ("mig", "mig"),
        ("mps", "mps"),
        ("max mps clients", "max_mps_clients"),
    ]
    text = render_fields(doc, fields)
    if profiles:
        text += "\n\n" + render_table(profiles, PROFILE_COLUMNS)
    ctx.emit(doc, text=text)


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
    rows = [{"card": c.name, **_profile_row(p)} for c in cards for p in c.mig_profiles]
    ctx.emit(rows, columns=[("card", "card"), *PROFILE_COLUMNS])

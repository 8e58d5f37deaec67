"""LAYOUT flags -> the LayoutSpec document they describe, for every command that takes a layout
(``host register``, ``host acquire``, ``pool create``, ``simulate pool``).

The flags cover every GPU of the host (``devices: "all"``):
``--mig 1g.24gb=4`` -> ``{"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]}``;
``--mps-slots 4 --mps-thread-percentage 25`` -> an ``mps`` entry; ``--spec FILE`` reads the
host agent's own spec (JSON or YAML); no flag leaves the layout to the card's default.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from calque.cli.errors import CliError, UsageError

# What each layout flag means, said once for every command that takes a layout.
MIG_HELP = "MIG instances on every GPU, e.g. 1g.24gb=4 (default: none)"
MPS_SLOTS_HELP = "MPS client slots on every GPU, a count (default: none)"
MPS_THREAD_HELP = "each MPS client's share of the SMs, in percent, 1-100 (default: the card's, all)"
MPS_MEMORY_HELP = "each MPS client's device memory cap, in MiB (default: no cap)"
SPEC_HELP = "the host agent's layout spec, a JSON or YAML file (default: none)"

# A MIG profile's name as the catalog writes them: 1g.24gb, 1g.10gb+me, 1g.24gb-me,
# 1g.24gb+me.all, 2g.48gb+gfx (tests/unit/cli_tenancy/test_host_cli.py holds it to every name
# the catalog has).
MIG_PROFILE = r"[0-9]+g\.[0-9]+gb(?:[+-][a-z]+(?:\.[a-z]+)?)?"
_MIG_ITEM = re.compile(rf"^\s*({MIG_PROFILE})\s*=\s*([0-9]+)\s*$", re.IGNORECASE)


# ---- flags -> LayoutSpec (pure) -------------------------------------------------------------------


def parse_mig(text: str) -> dict[str, int]:
    """``1g.24gb=4,2g.48gb=1`` -> ``{"1g.24gb": 4, "2g.48gb": 1}``; ValueError naming what is wrong."""
    out: dict[str, int] = {}
    items = [item for item in text.split(",") if item.strip()]
    if not items:
        raise ValueError("--mig needs PROFILE=COUNT[,PROFILE=COUNT...], e.g. 1g.24gb=4")
    for item in items:
        m = _MIG_ITEM.match(item)
        if not m:
            raise ValueError(f"--mig item {item.strip()!r} is not PROFILE=COUNT (e.g. 1g.24gb=4)")
        profile, count = m.group(1).lower(), int(m.group(2))
        if count < 1:
            raise ValueError(f"--mig count for {profile} must be at least 1")
        if profile in out:
            raise ValueError(f"--mig names {profile} twice")
        out[profile] = count
    return out


def mig_arg(text: str) -> dict[str, int]:
    """argparse ``type=``: a malformed --mig is a usage error (exit 2)."""
    try:
        return parse_mig(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def layout_from_flags(
    *,
    mig: dict[str, int] | None = None,
    mps_slots: int | None = None,
    mps_thread_percentage: int | None = None,
    mps_memory_limit_mib: int | None = None,
    spec: str | None = None,
) -> dict[str, Any] | None:
    """The LayoutSpec document the flags describe, validated; None for the card's default.

    Raises CliError (exit 1) for a spec file that cannot be read or is not a valid
    spec; UsageError (exit 2) for two layouts, or MPS limits without ``--mps-slots``.
    """
    from calque.contracts.layout import load_layout, parse_layout
    from calque.errors import InvalidInput

    chosen = [
        name
        for name, value in (("--mig", mig), ("--mps-slots", mps_slots), ("--spec", spec))
        if value is not None
    ]
    # usage errors (exit 2), as argparse's own: the flags, not their values, are wrong
    if len(chosen) > 1:
        raise UsageError(
            f"give one layout: {' or '.join(chosen)}", code="invalid_layout", details={"field": "layout"}
        )
    if mps_slots is None and (mps_thread_percentage is not None or mps_memory_limit_mib is not None):
        raise UsageError(
            "--mps-thread-percentage and --mps-memory-limit-mib need --mps-slots",
            code="invalid_layout",
            details={"field": "layout"},
        )
    try:
        if spec is not None:
            layout = load_layout(spec)
        elif mig is not None:
            layout = parse_layout({"version": "v1", "gpus": [{"devices": "all", "mig": dict(mig)}]})
        elif mps_slots is not None:
            mps: dict[str, int] = {"clients": mps_slots}
            if mps_thread_percentage is not None:
                mps["active_thread_percentage"] = mps_thread_percentage
            if mps_memory_limit_mib is not None:
                mps["pinned_memory_limit_mib"] = mps_memory_limit_mib
            layout = parse_layout({"version": "v1", "gpus": [{"devices": "all", "mps": mps}]})
        else:
            return None
    except InvalidInput as exc:
        raise CliError(exc.message, code="invalid_layout", details=exc.details) from None
    doc: dict[str, Any] = layout.model_dump(mode="json", exclude_none=True)
    return doc

"""What fraction of an instance one slice is: the ``share`` chargeback multiplies by.

- MIG: the profile's compute slices over the card's (e.g. 1g.24gb on an RTX PRO 6000
  Blackwell: 1/4), divided by the instance's GPU count.
- MPS: the slot's active thread percentage over 100, divided by the GPU count. A slot
  with no percentage set counts as an equal part of its card (1 / clients). When the
  percentages of one card's slots add up past 100 (MPS allows it: SMs are shared in
  time), each is scaled down so the card's slots add up to exactly the card, so no
  combination of tenants is ever charged more than the card costs.
- A whole card (exclusive): 1 over the GPU count.

Compute, not memory: the catalog's MIG memory sizes are not proportional to their
compute slices on every card, and compute is what a tenant takes from others.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from calque import catalog
from calque.contracts.layout import LayoutSpec


def slice_shares(
    instance_type: str, layout: dict[str, Any] | None, slices: list[tuple[str, int, str, str]]
) -> dict[str, Fraction]:
    """Shares of a host's slices, given as (slice_id, gpu_index, backend, profile)."""
    itype = catalog.instance_type(instance_type)
    card = itype.card
    gpus = itype.gpu_count
    mps_pct: dict[int, int | None] = {}
    mps_clients: dict[int, int] = {}
    if layout:
        spec = LayoutSpec.model_validate(layout)
        for index, entry in spec.per_gpu(gpus).items():
            if entry.mps is not None:
                mps_pct[index] = entry.mps.active_thread_percentage
                mps_clients[index] = entry.mps.clients
    out: dict[str, Fraction] = {}
    for slice_id, gpu_index, backend, profile in slices:
        if backend == "mig":
            p = card.profile(profile)
            out[slice_id] = Fraction(p.compute_slices, card.compute_slices * gpus)
        elif backend == "mps":
            clients = mps_clients.get(gpu_index) or sum(
                1 for _s, g, b, _p in slices if g == gpu_index and b == "mps"
            )
            pct = mps_pct.get(gpu_index)
            each = Fraction(pct, 100) if pct is not None else Fraction(1, max(clients, 1))
            if each * clients > 1:
                each = Fraction(1, clients)
            out[slice_id] = each / gpus
        else:
            out[slice_id] = Fraction(1, gpus)
    return out

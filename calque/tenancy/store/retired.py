"""What the registry keeps of a deregistered host (calque.tenancy.lifecycle writes it, the usage
report reads it). Apart from the other records: only a deregistration and the usage report
build these, and every request's cold start imports calque.tenancy.store.models."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import Field

from calque.tenancy.store.models import SliceBackend, _Record


class RetiredSlice(_Record):
    slice_id: str
    gpu_index: int
    backend: SliceBackend
    profile: str


class RetiredHost(_Record):
    """A host that was deregistered: the instance's paid lifetime (registration to end) and
    its slices, which the usage report still needs after the host's records are gone."""

    instance_id: str
    instance_type: str
    layout: dict[str, Any] | None = None
    registered_at: datetime
    ended_at: datetime
    ended_by: str | None = None
    slices: list[RetiredSlice] = Field(default=[])

"""The host layout spec: what the control plane asks a host's GPUs to look like.

Versioned and strict. The same document is what `python -m host_agent export`
prints and what `apply` and `assert` read, in JSON or YAML:

    {"version": "v1", "gpus": [
      {"devices": [0, 1], "mig": {"1g.18gb": 7}},
      {"devices": [2, 3], "mps": {"clients": 4, "active_thread_percentage": 25,
                                   "pinned_memory_limit_mib": 11000}},
      {"devices": [4], "exclusive": true}]}

A GPU no entry names is left as it is. Whether a layout fits a given card is the
planner's question (calque.catalog.planner), not this model's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from calque.contracts.common import Strict
from calque.errors import InvalidInput

Backend = Literal["mig", "mps", "exclusive"]


class MpsSpec(Strict):
    clients: int = Field(ge=1, le=128, description="client slots, one tenant each")
    active_thread_percentage: int | None = Field(
        default=None,
        ge=1,
        le=100,
        description="per-client share of the SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)",
    )
    pinned_memory_limit_mib: int | None = Field(
        default=None, ge=1, description="per-client device memory cap (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)"
    )


class GpuEntry(Strict):
    devices: list[int] | Literal["all"] = Field(
        description='GPU indices, or "all"', json_schema_extra=lambda schema: _index_list(schema)
    )
    mig: dict[str, int] | None = Field(
        default=None, description="MIG on, with these instances: profile -> count"
    )
    mps: MpsSpec | None = None
    exclusive: bool | None = Field(
        default=None, description="true: MIG off, no MPS, the whole card to one tenant"
    )

    @field_validator("devices")
    @classmethod
    def _devices(cls, v: list[int] | str) -> list[int] | str:
        if isinstance(v, list):
            if not v:
                raise ValueError('must name at least one GPU index, or be "all"')
            if any(i < 0 for i in v):
                raise ValueError("GPU indices are 0 or more")
            dup = sorted({i for i in v if v.count(i) > 1})
            if dup:
                raise ValueError(f"GPU {dup[0]} is named twice")
        return v

    @field_validator("mig")
    @classmethod
    def _mig(cls, v: dict[str, int] | None) -> dict[str, int] | None:
        if v is None:
            return v
        for profile, count in v.items():
            if count < 0:
                raise ValueError(f"count for {profile!r} must be 0 or more")
        return {p: c for p, c in v.items() if c > 0}

    @model_validator(mode="after")
    def _one_backend(self) -> GpuEntry:
        if self.exclusive is False:
            raise ValueError('"exclusive" may only be true; omit it and use "mig" or "mps" instead')
        chosen = [k for k in ("mig", "mps", "exclusive") if getattr(self, k) is not None]
        if len(chosen) != 1:
            raise ValueError(
                f'each entry needs exactly one of "mig", "mps", "exclusive" (got {chosen or "none"})'
            )
        return self

    @property
    def backend(self) -> Backend:
        if self.mig is not None:
            return "mig"
        if self.mps is not None:
            return "mps"
        return "exclusive"

    def config_only(self) -> dict[str, Any]:
        """The entry without its devices: what a GPU should look like."""
        return self.model_dump(exclude={"devices"}, exclude_none=True)


class LayoutSpec(Strict):
    version: Literal["v1"] = "v1"
    gpus: list[GpuEntry] = Field(default=[])

    @model_validator(mode="after")
    def _each_gpu_once(self) -> LayoutSpec:
        seen: dict[int, int] = {}
        alls = [n for n, e in enumerate(self.gpus) if e.devices == "all"]
        if alls and len(self.gpus) > 1:
            raise ValueError(f'gpus[{alls[0]}] covers "all" GPUs, so no other entry may name one')
        for n, entry in enumerate(self.gpus):
            if entry.devices == "all":
                continue
            for i in entry.devices:
                if i in seen:
                    raise ValueError(f"GPU {i} is named twice (gpus[{seen[i]}] and gpus[{n}])")
                seen[i] = n
        return self

    def per_gpu(self, gpu_count: int) -> dict[int, GpuEntry]:
        """Which entry governs each GPU of a host with gpu_count GPUs; unnamed GPUs are absent."""
        out: dict[int, GpuEntry] = {}
        for n, entry in enumerate(self.gpus):
            indices = range(gpu_count) if entry.devices == "all" else entry.devices
            for i in indices:
                if i >= gpu_count:
                    raise InvalidInput(
                        f"gpus[{n}].devices names GPU {i}, "
                        f"but this host has {gpu_count} GPU(s) (0..{gpu_count - 1})",
                        details={"field": f"gpus[{n}].devices", "value": i, "gpu_count": gpu_count},
                    )
                out[i] = entry
        return dict(sorted(out.items()))

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json", exclude_none=True), indent=2)


def _field_path(loc: tuple[Any, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in ("list[int]", "literal['all']", "function-after[_devices(), list[int]]"):
            continue
        else:
            path += f".{part}" if path else str(part)
    return path or "(document)"


def parse_layout(data: str | bytes | dict[str, Any]) -> LayoutSpec:
    """A LayoutSpec from JSON or YAML text (or an already parsed document).

    Raises InvalidInput naming the offending field.
    """
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise InvalidInput(
                f"layout spec is not UTF-8 text ({exc.reason} at byte {exc.start})", details={"field": "spec"}
            ) from None
    if isinstance(data, str):
        try:
            doc = json.loads(data)
        except json.JSONDecodeError:
            import yaml

            try:
                doc = yaml.safe_load(data)
            except yaml.YAMLError as exc:
                # where and what: PyYAML's first line alone ("while parsing a flow mapping")
                # names neither the line nor what is wrong there
                mark = getattr(exc, "problem_mark", None)
                problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
                where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
                raise InvalidInput(
                    f"layout spec is neither JSON nor YAML: {where}{problem}", details={"field": "spec"}
                ) from None
    else:
        doc = data
    if not isinstance(doc, dict):
        raise InvalidInput(
            "layout spec must be a mapping with 'version' and 'gpus'", details={"field": "(document)"}
        )
    try:
        return LayoutSpec.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = _field_path(tuple(err["loc"]))
        msg = err["msg"].removeprefix("Value error, ")
        raise InvalidInput(f"layout spec: {field}: {msg}", details={"field": field}) from None


def load_layout(path: str | Path) -> LayoutSpec:
    """A LayoutSpec from a JSON or YAML file."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise InvalidInput(
            f"cannot read layout spec {str(p)!r}: {exc.strerror}", details={"field": "spec"}
        ) from None
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark, as some editors write, allowed
    except UnicodeDecodeError as exc:
        raise InvalidInput(
            f"layout spec {str(p)!r} is not UTF-8 text ({exc.reason} at byte {exc.start})",
            details={"field": "spec"},
        ) from None
    return parse_layout(text)


def _index_list(schema: dict) -> None:
    """The document says what _devices holds: at least one index, each 0 or more, none twice."""
    for branch in schema.get("anyOf", []):
        if branch.get("type") == "array":
            branch.update(minItems=1, uniqueItems=True)
            branch.setdefault("items", {})["minimum"] = 0

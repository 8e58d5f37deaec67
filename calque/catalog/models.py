"""The catalog's shapes: cards, their MIG profiles, and the instance types that carry them."""

from __future__ import annotations

from datetime import date

from pydantic import BaseModel, ConfigDict, Field


class _Fact(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class MigProfile(_Fact):
    """One GPU-instance profile of a MIG-capable card, as NVML and nvidia-smi name it."""

    name: str = Field(description='e.g. "1g.24gb"; "+me" marks the media-extension variant')
    memory_gib: float = Field(description="nominal memory of one instance, as in the profile's name")
    compute_slices: int
    memory_slices: int
    max_count: int = Field(description="most instances of this profile one GPU can hold")
    placements: list[int] = Field(description="memory-slice indices an instance of this profile may start at")
    nvml_profile_index: int = Field(
        description="NVML_GPU_INSTANCE_PROFILE_* (nvml.h): what nvmlDeviceGetGpuInstanceProfileInfo takes"
    )
    nvml_profile_id: int = Field(
        description="the profile's ID on this card (nvmlGpuInstanceProfileInfo_t.id, the ID column of "
        "`nvidia-smi mig -lgip`): what placements, creation and nvmlGpuInstanceInfo_t.profileId use"
    )
    media_extensions: bool = False
    source: str


class Card(_Fact):
    name: str
    family: str = Field(description="architecture: turing, ampere, ada, hopper, blackwell")
    memory_gib: float
    nvml_names: list[str] = Field(description="names NVML reports for this card, used to recognise it")
    mig_capable: bool
    mps_capable: bool
    compute_slices: int = 0
    memory_slices: int = 0
    mig_mode_change_needs_reset: bool = False
    max_mps_clients: int = 48
    mig_profiles: list[MigProfile] = Field(default=[])
    source: str
    verified_on_hardware: bool = False

    def profile(self, name: str) -> MigProfile:
        """The named MIG profile of this card; InvalidInput listing the valid ones otherwise."""
        from calque.errors import InvalidInput

        if not self.mig_capable:
            raise InvalidInput(
                f"{self.name} does not support MIG (asked for profile {name!r}); use MPS or exclusive",
                details={"card": self.name, "profile": name},
            )
        for p in self.mig_profiles:
            if p.name == name:
                return p
        valid = [p.name for p in self.mig_profiles]
        raise InvalidInput(
            f"unknown MIG profile {name!r} for {self.name}; valid: {', '.join(valid)}",
            details={"card": self.name, "profile": name, "valid": valid},
        )


class InstanceType(_Fact):
    name: str
    card: Card
    gpu_count: int
    hourly_usd: float = Field(
        description="on-demand Linux hourly rate, us-east-1 unless price_source says otherwise"
    )
    price_as_of: date
    price_verified: bool = Field(description="false: an estimate or a figure not re-checked against AWS")
    source: str

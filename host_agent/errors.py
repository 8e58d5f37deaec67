"""The agent's failures, as domain errors. NVML's return codes map onto these in one
place (from_nvml), for the real backend and the fake alike."""

from __future__ import annotations

from typing import Any

from calque.errors import CalqueError, Conflict, DependencyUnavailable, InvalidInput

# NVML return codes (nvml.h), so the fake speaks them without importing the library.
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_IN_USE = 19
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_INVALID_STATE = 29
NVML_ERROR_UNKNOWN = 999

NVML_ERROR_NAMES = {
    NVML_ERROR_INVALID_ARGUMENT: "NVML_ERROR_INVALID_ARGUMENT",
    NVML_ERROR_NOT_SUPPORTED: "NVML_ERROR_NOT_SUPPORTED",
    NVML_ERROR_NO_PERMISSION: "NVML_ERROR_NO_PERMISSION",
    NVML_ERROR_NOT_FOUND: "NVML_ERROR_NOT_FOUND",
    NVML_ERROR_DRIVER_NOT_LOADED: "NVML_ERROR_DRIVER_NOT_LOADED",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML_ERROR_LIBRARY_NOT_FOUND",
    NVML_ERROR_FUNCTION_NOT_FOUND: "NVML_ERROR_FUNCTION_NOT_FOUND",
    NVML_ERROR_GPU_IS_LOST: "NVML_ERROR_GPU_IS_LOST",
    NVML_ERROR_RESET_REQUIRED: "NVML_ERROR_RESET_REQUIRED",
    NVML_ERROR_IN_USE: "NVML_ERROR_IN_USE",
    NVML_ERROR_INSUFFICIENT_RESOURCES: "NVML_ERROR_INSUFFICIENT_RESOURCES",
    NVML_ERROR_INVALID_STATE: "NVML_ERROR_INVALID_STATE",
    NVML_ERROR_UNKNOWN: "NVML_ERROR_UNKNOWN",
}


class GpuError(CalqueError):
    """A GPU operation failed in a way the agent cannot work around."""

    code = "gpu_error"


class GpuBusy(Conflict):
    """Processes run where the agent would have to change something."""

    code = "gpu_busy"


class InsufficientResources(Conflict):
    """The GPU has no room for what was asked (NVML_ERROR_INSUFFICIENT_RESOURCES)."""

    code = "insufficient_resources"


class MigNotSupported(InvalidInput):
    code = "mig_not_supported"


class NvmlUnavailable(DependencyUnavailable):
    """No NVML library or driver on this host."""

    code = "nvml_unavailable"


def from_nvml(code: int, what: str, **details: Any) -> CalqueError:
    """Our error for an NVML return code, naming what was being done."""
    name = NVML_ERROR_NAMES.get(code, f"NVML error {code}")
    d = {"nvml_code": code, "nvml_error": name, **details}
    msg = f"{what}: {name}"
    if code == NVML_ERROR_INSUFFICIENT_RESOURCES:
        return InsufficientResources(msg, details=d)
    if code == NVML_ERROR_IN_USE:
        return GpuBusy(msg, details=d)
    if code == NVML_ERROR_NOT_SUPPORTED:
        return (
            MigNotSupported(msg, details=d)
            if "MIG" in what
            else GpuError(msg, code="not_supported", details=d)
        )
    if code in (NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_DRIVER_NOT_LOADED):
        return NvmlUnavailable(msg, details=d)
    if code == NVML_ERROR_NO_PERMISSION:
        return GpuError(msg + " (the agent needs root)", code="no_permission", details=d)
    return GpuError(msg, details=d)

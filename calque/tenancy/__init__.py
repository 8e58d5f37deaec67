"""Layer 2, tenancy: hosts' slices, sessions (check-out / check-in), quotas, the reaper."""

from calque.tenancy.service import ReapSummary, Tenancy, TenancyConfig

__all__ = ["ReapSummary", "Tenancy", "TenancyConfig"]

"""Layer 2, tenancy: hosts' slices, sessions (check-out / check-in), quotas, the reaper.

The domain lives in calque.tenancy.service; it is not imported here so that entry
points importing calque.tenancy.wiring stay cheap to import.
"""

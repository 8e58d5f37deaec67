"""calque control plane: share AWS GPU instances among an institution's people.

``from calque import Pool`` is the Python SDK (calque.sdk), imported on first use: importing
``calque`` itself stays light for everything below it."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# what calque.sdk exports: CliError too, since a refusal decided by the SDK itself (no items,
# no endpoint) raises it, and ApiError and ClaimError are kinds of it
_SDK = frozenset({"Pool", "Claim", "ClaimError", "RemoteError", "ApiError", "CliError", "LogChunk", "MapRun"})


def __getattr__(name: str) -> Any:
    if name in _SDK:
        import calque.sdk

        return getattr(calque.sdk, name)
    raise AttributeError(f"module 'calque' has no attribute {name!r}")

"""The Python SDK: warm pools from a program, as the ``calque`` command uses them.

from calque import Pool
claim = Pool("embed").submit(["a", "b"])
print(claim.result(timeout=600))
for output in Pool("embed").map(texts, batch_size=50):
    ...
"""

from __future__ import annotations

from calque.cli.errors import ApiError, CliError
from calque.sdk.pools import Claim, ClaimError, LogChunk, MapRun, Pool, RemoteError

__all__ = ["ApiError", "Claim", "ClaimError", "CliError", "LogChunk", "MapRun", "Pool", "RemoteError"]

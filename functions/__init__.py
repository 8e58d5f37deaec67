"""Lambda entry points only: thin adapters from an event to one domain call.

A cold start makes a great many objects that live as long as the process (modules,
pydantic's validators, the SDK's service models and clients), and the cyclic garbage
collector would scan them again and again while they are being made: tens of
milliseconds of a check-out's cold start (bench/cold_import.py). So its automatic passes
are held off from the first import of an entry point until the first invocation has
been answered; then everything the cold start made is frozen (``gc.freeze``: never
scanned again, as it lives as long as the process anyway) and the usual thresholds come
back (functions/observability.py). Reference counting frees memory as always meanwhile.

The youngest generation's threshold is a million objects, not merely raised: its first
pass scans every object made since the interpreter started, and a check-out's cold start
makes some 100,000 (a threshold of 100,000 cost it one 20 ms pass, in the middle of its
first request). A first request that keeps more than a million still gets a pass.
"""

import gc

# The interpreter's thresholds, restored after the first invocation.
GC_THRESHOLDS = gc.get_threshold()
COLD_START_GC_THRESHOLDS = (1_000_000, 50, 100)
gc.set_threshold(*COLD_START_GC_THRESHOLDS)

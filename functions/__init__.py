"""Lambda entry points only: thin adapters from an event to one domain call.

A cold start makes a great many objects that live as long as the process (modules,
pydantic's validators, the SDK's service models and clients), and the cyclic garbage
collector would scan them again and again while they are being made: tens of
milliseconds of a check-out's cold start (bench/cold_import.py). So its automatic passes
are made rare from the first import of an entry point until the first invocation has
been answered; then everything the cold start made is frozen (``gc.freeze``: never
scanned again, as it lives as long as the process anyway) and the usual thresholds come
back (functions/observability.py). Reference counting frees memory as always meanwhile.
"""

import gc

# The interpreter's thresholds, restored after the first invocation.
GC_THRESHOLDS = gc.get_threshold()
gc.set_threshold(100_000, 50, 100)

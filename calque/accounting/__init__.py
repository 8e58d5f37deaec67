"""Usage and chargeback from the recorded lease history and the instances' lifetimes.

``chargeback`` is the arithmetic (pure, exact); ``shares`` says what fraction of an
instance a slice is; ``history`` reads leases and lifetimes from the registry;
``service`` answers ``GET /v1/usage`` for a caller.
"""

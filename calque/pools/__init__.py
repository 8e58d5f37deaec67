"""Warm pools (layer 1): model-scoped queues with resident workers, sized from their backlog.

Pools decide how many workers a pool holds; they get instances only through the
``Capacity`` port (calque/pools/ports.py), never from EC2 directly.
"""

"""Tenancy's store: its records (hosts, slices, sessions, lease events) behind small ports.

``ports`` names what the domain may ask; ``dynamo`` answers it from the single
DynamoDB table (key shapes in ``keys``), composed of one part per kind of work; ``memory``
answers it in process for unit tests and the simulators, with the same all-or-nothing
conditions. Members' quotas and groups, which a grant and an end count in the same
transaction, are calque.members' store, mixed into both.
"""

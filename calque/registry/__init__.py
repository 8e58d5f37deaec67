"""The registry: tenancy's records behind small ports.

``ports`` names what the domain may ask; ``dynamo`` answers it from the single
DynamoDB table (key shapes in ``keys``); ``memory`` answers it in process for unit
tests, with the same all-or-nothing conditions.
"""

"""Members and groups: who belongs to which group, the monthly limits of members and groups
and the counters that hold them, client request ids, and what fraction of an instance a
slice is (what a member is charged by).

``ports`` names what a store of these records answers (and the refusals of a conditional
write); ``store`` answers it from the single DynamoDB table (key shapes in ``keys``),
``memory`` in process, both applying the one arithmetic of ``counters``. Tenancy's grants
and ends, and pool claims' ends, write these counters inside their own transactions, with
the terms ``store`` builds (or, in memory, the helpers ``memory`` gives).
"""

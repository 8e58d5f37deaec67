"""Pool, claim, worker and scaling-decision records: on the single DynamoDB table
(``dynamo.DynamoPoolStore``, its claims in ``claims``), and in memory (``memory.MemoryPoolStore``).
Both keep the contract of calque.pools.ports.PoolStore; the item keys and the rules both
follow are in ``items``.

    item        pk                  sk
    pool        POOLS               POOL#<name>
    claim       POOL#<pool>         CLAIM#<claim_id>      (state transitions: one conditional update)
    claim ptr   CLAIM#<claim_id>    CLAIM                 (the claim's pool, to find it by id)
    worker      POOL#<pool>         WORKER#<worker_id>
    decision    POOL#<pool>         DECISION#<epoch ms, 15 digits>#<action>   (scale-outs and scale-ins)
    discard     POOL#<pool>         DISCARD#<claim_id>    (a claim cancelled while queued whose
                                                         message is still on the queue: written in
                                                         the cancel's transaction, deleted when a
                                                         worker discards the message; gc_at (TTL)
                                                         once the queue's retention is past)

    name hold   POOLS               CREATING#<name>       (a create holding the name while it makes
                                                         the pool's queues: token, at; dropped in
                                                         the write that records the pool)
    claim req.  CLAIMREQ#<request id>  CLAIMREQ           (a claim submitted with an Idempotency-Key:
                                                         the claim it made, what it asked; gc_at)

    claim run   CLAIMRUNS#<YYYY-MM-DD>  RUN#<pool>#<claim_id>   (a copy of a claim that ran, under
                                                         every UTC day it ran: chargeback's index)
    pool inst.  POOLINSTANCES       INSTANCE#<instance_id>       (an instance a pool paid for, and when)

Index by_user: user_pk = CLAIMS#<user>, user_sk = <submitted iso>#<claim_id> (every claim;
a partition of its own, apart from the sessions' USER#<user>).
Index by_expiry (overloaded, as by_user is): expiry_pk = POOLCLAIMS#<pool>, expiry_sk =
L#<submitted iso>#<claim_id> while the claim is live (queued, running), E#<finished
iso>#<claim_id> once it ended: a pool's live claims oldest first, and its latest ended
claims, are each one query, however many claims the pool ever took.

A claim's run copies are written after each transition that starts or ends it (its start
day while it runs; every day from its start to its end once it ends), so a period's claims
are one query per day of the period, whatever the number of claims ever submitted.
"""

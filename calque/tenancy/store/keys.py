"""Key shapes of the single registry table (calque.resources.REGISTRY_TABLE).

    item            pk                        sk
    host            HOSTS                     HOST#<instance_id>
    slice           HOST#<instance_id>        SLICE#<slice_id>
    session         SESSION#<session_id>      SESSION
    quota / counter USER#<user>               QUOTA   (a member's: calque.members.keys)
    profile sizes   PROFILE#<backend>#<name>  PROFILE          (memories registered for a profile)
    client request  REQUEST#<hash>            REQUEST          (a check-out's replay record; gc_at ends it)
    lease event     EVENTS#<YYYY-MM-DD>       <iso time>#<session_id>#<fence>#<kind>
    retired host    RETIRED_HOSTS             HOST#<instance_id>#<registered iso>  (a deregistered host)

What a month's ended sessions used is its settled counters (calque.members.keys.use_attr). USER#<user> /
USAGE#<YYYY-MM> items, kept by tables from before the counters, are neither written nor
read (why: calque.tenancy.quotas.QuotasMixin.get_quota).

Sparse indexes (an item is in an index only while it carries that index's keys):

    free_slices  free_pk = FREE#<backend>
                 free_sk = <memory, milli-GiB, 9 digits>#<profile>#<spread>#<instance>#<slice>
                 only free slices of hosts that accept sessions: the first hit >= a floor is the best fit.
                 <spread> (4 hex digits, a hash of instance and slice) scatters one size's slices
                 over the key space, so racing check-outs that start reading at different
                 random spreads read different slices (calque.tenancy.store.spread).
    by_user      user_pk = USER#<user>      user_sk = L|E#<created iso>#<session_id>   every session:
                 L while live, E once ended, so a user's live (or ended) sessions are one prefix
                 user_pk = FLEET            user_sk = HOST#<instance> (host), HOST#<instance>#SLICE#<slice>
                 (the index is overloaded: the whole fleet, hosts followed by their slices, in one query)
    by_expiry    expiry_pk = LIVE           expiry_sk = <expiry epoch s, 12 digits>#<session_id>  (live)
                 expiry_pk = RECLAIMING     expiry_sk = <since epoch s, 12 digits>#<instance>#<slice>
                 expiry_pk = POOLCLAIMS#<pool>  expiry_sk = L#<submitted>#<claim> | E#<finished>#<claim>
                 (overloaded: a pool's live claims and its ended ones; calque.pools.store)
"""

from __future__ import annotations

import hashlib
from datetime import datetime

HOSTS_PK = "HOSTS"
LIVE = "LIVE"
RECLAIMING = "RECLAIMING"
FLEET = "FLEET"
SPREAD_DIGITS = 4


def host(instance_id: str) -> dict[str, str]:
    return {"pk": HOSTS_PK, "sk": f"HOST#{instance_id}"}


def host_partition(instance_id: str) -> str:
    return f"HOST#{instance_id}"


def slice_(instance_id: str, slice_id: str) -> dict[str, str]:
    return {"pk": host_partition(instance_id), "sk": f"SLICE#{slice_id}"}


def session(session_id: str) -> dict[str, str]:
    return {"pk": f"SESSION#{session_id}", "sk": "SESSION"}


RETIRED_HOSTS = "RETIRED_HOSTS"


def retired_host(instance_id: str, registered_at: datetime) -> dict[str, str]:
    return {"pk": RETIRED_HOSTS, "sk": f"HOST#{instance_id}#{iso(registered_at)}"}


def request(request_id: str) -> dict[str, str]:
    return {"pk": f"REQUEST#{request_id}", "sk": "REQUEST"}


def profile(backend: str, name: str) -> dict[str, str]:
    return {"pk": f"PROFILE#{backend}#{name}", "sk": "PROFILE"}


def event(at: datetime, session_id: str | None, fence: int, kind: str) -> dict[str, str]:
    return {"pk": f"EVENTS#{at:%Y-%m-%d}", "sk": f"{iso(at)}#{session_id or '-'}#{fence}#{kind}"}


def memory_key(memory_gib: float) -> str:
    return f"{round(memory_gib * 1000):09d}"


def free_pk(backend: str) -> str:
    return f"FREE#{backend}"


def free_tier(memory_gib: float, profile_name: str) -> str:
    """The free_sk prefix of one (memory, profile) size."""
    return f"{memory_key(memory_gib)}#{profile_name}#"


def spread(instance_id: str, slice_id: str) -> str:
    """Where a slice sits inside its size's key range: stable, and uniform over the fleet."""
    return hashlib.sha256(f"{instance_id}/{slice_id}".encode()).hexdigest()[:SPREAD_DIGITS]


def spread_at(fraction: float) -> str:
    """The spread at ``fraction`` (0 <= fraction < 1) of the range."""
    top = 16**SPREAD_DIGITS
    return f"{min(top - 1, max(0, int(fraction * top))):0{SPREAD_DIGITS}x}"


def free_sk(memory_gib: float, profile_name: str, instance_id: str, slice_id: str) -> str:
    return f"{free_tier(memory_gib, profile_name)}{spread(instance_id, slice_id)}#{instance_id}#{slice_id}"


def fleet_keys(instance_id: str, slice_id: str | None = None) -> dict[str, str]:
    sk = f"HOST#{instance_id}" + (f"#SLICE#{slice_id}" if slice_id is not None else "")
    return {"user_pk": FLEET, "user_sk": sk}


def user_pk(user: str) -> str:
    return f"USER#{user}"


def user_sk(created_at: datetime, session_id: str, *, live: bool) -> str:
    return f"{user_state(live)}{iso(created_at)}#{session_id}"


def user_state(live: bool) -> str:
    """The by_user sort-key prefix of live (or ended) sessions."""
    return "L#" if live else "E#"


def epoch_key(at: datetime) -> str:
    return f"{int(at.timestamp()):012d}"


def expiry_sk(expires_at: datetime, session_id: str) -> str:
    return f"{epoch_key(expires_at)}#{session_id}"


def reclaiming_sk(since: datetime, instance_id: str, slice_id: str) -> str:
    return f"{epoch_key(since)}#{instance_id}#{slice_id}"


def iso(at: datetime) -> str:
    """Second-precision UTC, the one textual time form the table holds."""
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")

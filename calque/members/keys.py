"""Key shapes of the members' items in the single table (calque.resources.REGISTRY_TABLE).

item              pk                 sk
quota / counter   USER#<user>        QUOTA      a member's limits, live-session count and
                                                monthly counters (use_attr)
group             GROUPS             GROUP#<name>   members {user: added iso}, limits, live,
                                                monthly counters (use_attr)
membership        USER#<user>        GROUPS     g_<name> = when added (one attribute per group)
kept answer       ANSWER#<hash>      ANSWER     an Idempotency-Key's request: its fingerprint and
                                                sealed answer (calque.members.answers)
"""

from __future__ import annotations

GROUPS_PK = "GROUPS"


def quota(user: str) -> dict[str, str]:
    return {"pk": f"USER#{user}", "sk": "QUOTA"}


def group_key(name: str) -> dict[str, str]:
    return {"pk": GROUPS_PK, "sk": f"GROUP#{name}"}


def membership_key(user: str) -> dict[str, str]:
    return {"pk": f"USER#{user}", "sk": "GROUPS"}


def use_attr(state: str, unit: str, month: str) -> str:
    """A monthly counter on a member's quota item or a group's item: ``committed`` (reserved by
    live sessions plus settled by ended ones) or ``settled``, in ``ugh`` (micro-GPU-hours)
    or ``musd`` (micro-dollars), of one month (YYYY-MM), e.g. committed_musd_2026-12."""
    return f"{state}_{unit}_{month}"


def answer_key(request_id: str) -> dict[str, str]:
    return {"pk": f"ANSWER#{request_id}", "sk": "ANSWER"}

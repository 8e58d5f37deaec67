"""What an admin chooses at deploy time, read from CDK context once, validated.

`npx aws-cdk deploy --all -c calque:admins=alice,arn:aws:iam::123456789012:role/Admin`
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from constructs import Node

from infra import constants

_DURATION = re.compile(r"^\s*(\d+)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


class ConfigError(ValueError):
    """A context value an admin passed cannot be used; the message names it."""


def parse_duration_s(value: str | int, *, key: str, minimum_s: int = 1) -> int:
    """``90s``, ``15m``, ``2h``, ``7d`` or a number of seconds."""
    if isinstance(value, int):
        seconds = value
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ConfigError(f"context {key}={value!r}: expected a duration such as 90s, 15m, 2h or 7d")
        seconds = int(match.group(1)) * _UNIT_S[match.group(2)]
    if seconds < minimum_s:
        raise ConfigError(f"context {key}={value!r}: must be at least {minimum_s} seconds")
    return seconds


def _split_admins(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    items = value if isinstance(value, list) else str(value).split(",")
    return tuple(dict.fromkeys(item.strip() for item in items if str(item).strip()))


@dataclass(frozen=True, kw_only=True)
class DeploymentConfig:
    admins: tuple[str, ...]
    session_ttl_max_s: int | None
    bundle_cache_dir: Path

    @classmethod
    def from_context(cls, node: Node, *, project_root: Path) -> DeploymentConfig:
        ttl_max = node.try_get_context(constants.CONTEXT_SESSION_TTL_MAX)
        cache = node.try_get_context(constants.CONTEXT_BUNDLE_CACHE_DIR)
        return cls(
            admins=_split_admins(node.try_get_context(constants.CONTEXT_ADMINS)),
            session_ttl_max_s=(
                None
                if ttl_max in (None, "")
                else parse_duration_s(ttl_max, key=constants.CONTEXT_SESSION_TTL_MAX, minimum_s=10)
            ),
            bundle_cache_dir=Path(cache) if cache else project_root / ".bundle-cache",
        )

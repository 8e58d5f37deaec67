"""What an admin passes as CDK context, read and checked before anything is built."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.config import ConfigError, DeploymentConfig, parse_duration_s

pytestmark = pytest.mark.infra


class _Node:
    def __init__(self, context: dict) -> None:
        self._context = context

    def try_get_context(self, key: str):
        return self._context.get(key)


@pytest.mark.parametrize(
    ("text", "seconds"), [("90s", 90), ("15m", 900), ("2h", 7200), ("7d", 604800), ("3600", 3600), (600, 600)]
)
def test_durations_read_as_seconds(text, seconds) -> None:
    assert parse_duration_s(text, key="k") == seconds


@pytest.mark.parametrize("text", ["soon", "2 weeks", "-5m", "1.5h"])
def test_a_duration_that_is_not_one_is_refused_naming_the_key(text) -> None:
    with pytest.raises(ConfigError, match="calque:session-ttl-max"):
        parse_duration_s(text, key="calque:session-ttl-max")


def test_admins_come_from_a_comma_list_without_blanks_or_repeats() -> None:
    # Given admins passed with -c calque:admins=...
    node = _Node({"calque:admins": " alice, arn:aws:iam::123456789012:role/Admin ,,alice"})
    # When the deployment config is read
    config = DeploymentConfig.from_context(node, project_root=Path("/p"))  # type: ignore[arg-type]
    # Then each principal appears once, trimmed
    assert config.admins == ("alice", "arn:aws:iam::123456789012:role/Admin")
    assert config.session_ttl_max_s is None
    assert config.bundle_cache_dir == Path("/p/.bundle-cache")


def test_a_session_ttl_max_below_the_floor_is_refused() -> None:
    node = _Node({"calque:session-ttl-max": "5s"})
    with pytest.raises(ConfigError, match="at least 10 seconds"):
        DeploymentConfig.from_context(node, project_root=Path("/p"))  # type: ignore[arg-type]

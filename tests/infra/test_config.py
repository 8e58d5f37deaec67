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


# ---- keys the app does not read, and how a refusal reads ------------------------------------------


def test_the_fleets_ami_and_other_accounts_are_read_and_checked() -> None:
    node = _Node({"calque:fleet-ami-id": "ami-0123456789abcdef0", "calque:other-accounts": "refuse"})
    config = DeploymentConfig.from_context(node, project_root=Path("/p"))  # type: ignore[arg-type]
    assert (config.fleet_ami_id, config.other_accounts) == ("ami-0123456789abcdef0", "refuse")
    unset = DeploymentConfig.from_context(_Node({}), project_root=Path("/p"))  # type: ignore[arg-type]
    assert (unset.fleet_ami_id, unset.other_accounts) == (None, None)
    for key, bad in (("calque:fleet-ami-id", "ami-xyz"), ("calque:other-accounts", "allow")):
        with pytest.raises(ConfigError, match=key):
            DeploymentConfig.from_context(_Node({key: bad}), project_root=Path("/p"))  # type: ignore[arg-type]


def test_a_misspelt_context_key_fails_naming_the_one_meant() -> None:
    from aws_cdk import App

    from infra.config import check_context_keys

    # Given -c calque:fleet-subnet=... (the key is calque:fleet-subnets): ignored, the stack
    # would create a VPC of its own instead of using the admin's subnets
    app = App(context={"calque:fleet-subnet": "subnet-0abc@us-east-1a", "@aws-cdk/core:flag": True})
    # Then the synth stops, naming the key given and the one it resembles
    with pytest.raises(
        ConfigError, match=r"calque:fleet-subnet: no such setting; did you mean calque:fleet-subnets\?"
    ):
        check_context_keys(app.node)
    # And every key the app reads, and keys that are not calque's, pass
    from infra.config import known_context_keys

    check_context_keys(App(context={key: "" for key in known_context_keys()} | {"other:key": 1}).node)


def test_every_context_key_the_app_reads_is_in_the_deploy_docs_table() -> None:
    from infra.config import known_context_keys

    table = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    assert "calque:admins" in known_context_keys()
    assert [key for key in known_context_keys() if f"`{key}`" not in table] == []


def test_a_bad_context_value_fails_the_app_with_one_line_naming_the_key(tmp_path: Path) -> None:
    from .conftest import run_app

    # Given app.py run as the CDK CLI runs it, with a value it cannot use
    result = run_app(tmp_path, {"calque:session-ttl-max": "12 hours"})
    # Then it fails with the reason on one line, naming the key, and no traceback
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[-1] == (
        "error: context calque:session-ttl-max='12 hours': expected a duration such as 90s, 15m, 2h or 7d"
    )
    assert "Traceback" not in result.stderr

"""What an admin chooses at deploy time, read from CDK context once, validated.

`npx aws-cdk deploy --all -c calque:admins=alice,arn:aws:iam::123456789012:role/Admin`

Admin entries are checked here with the same rules the API applies (calque.identity):
an entry that could never match a caller, or that a member could pose as, fails the
synth with its reason.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from constructs import Node

from calque.identity import InvalidAdminEntry, parse_admins
from infra import constants

_DURATION = re.compile(r"^\s*(\d+)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_CONTEXT_PREFIX = "calque:"


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


_ORG_ID = re.compile(r"^o-[a-z0-9]{10,32}$")
_TOPIC_ARN = re.compile(r"^arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[\w-]{1,256}$")
_EPOCH = re.compile(r"^[A-Za-z0-9._-]{1,32}$")
_KMS_KEY_ARN = re.compile(r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/[A-Za-z0-9-]{1,128}$")
_AMI_ID = re.compile(r"^ami-(?:[0-9a-f]{8}|[0-9a-f]{17})$")
_OTHER_ACCOUNTS = re.compile(r"^(?:distinct|refuse)$")
_ROLE_PATTERN = re.compile(r"^[\w+=,.@*-]{1,128}$")


def _checked_admins(value: object) -> tuple[str, ...]:
    admins = _split_admins(value)
    try:
        parse_admins(admins)
    except InvalidAdminEntry as exc:
        raise ConfigError(f"context {constants.CONTEXT_ADMINS}: {exc}") from None
    return admins


def _optional(node: Node, key: str, pattern: re.Pattern[str], what: str) -> str | None:
    value = node.try_get_context(key)
    if value in (None, ""):
        return None
    if not pattern.match(str(value)):
        raise ConfigError(f"context {key}={value!r}: expected {what}")
    return str(value)


def _session_named_roles(value: object) -> tuple[str, ...]:
    roles = _split_admins(value)
    for role in roles:
        if not _ROLE_PATTERN.match(role):
            raise ConfigError(f"context {constants.CONTEXT_SESSION_NAMED_ROLES}: {role!r} is not a role name")
    return roles


@dataclass(frozen=True, kw_only=True)
class DeploymentConfig:
    admins: tuple[str, ...]
    session_ttl_max_s: int | None
    bundle_cache_dir: Path
    # Callers may come from any account of this organization (else: the deploying account only).
    organization_id: str | None = None
    # Roles whose session names identify a person (their trust policy pins them); added to
    # Identity Center's, which are always trusted.
    session_named_roles: tuple[str, ...] = ()
    # Alarms notify this SNS topic when set.
    alarm_topic_arn: str | None = None
    # Pin user and role admin entries of the deploying account to their unique ids at deploy.
    pin_admins: bool = True
    admin_pin_epoch: str = "1"
    # API Gateway's account-wide CloudWatch role, which stage logging needs: "auto" sets the
    # stack's own only where the account has none; "create" sets it whatever the account had;
    # "leave" never touches it (the account must have one, or the stage fails to deploy).
    apigateway_cloudwatch_role: str = "auto"
    # A customer-managed KMS key that encrypts the fleet's EBS volumes (the account's default).
    fleet_ebs_kms_key_arn: str | None = None
    # One AMI the fleet launches for every type (else the Deep Learning AMIs' SSM parameters).
    fleet_ami_id: str | None = None
    # Principals of other accounts of the organization: their own members ("distinct") or
    # refused ("refuse"); None leaves the API's default (distinct).
    other_accounts: str | None = None

    @classmethod
    def from_context(cls, node: Node, *, project_root: Path) -> DeploymentConfig:
        ttl_max = node.try_get_context(constants.CONTEXT_SESSION_TTL_MAX)
        cache = node.try_get_context(constants.CONTEXT_BUNDLE_CACHE_DIR)
        return cls(
            admins=_checked_admins(node.try_get_context(constants.CONTEXT_ADMINS)),
            session_ttl_max_s=(
                None
                if ttl_max in (None, "")
                else parse_duration_s(ttl_max, key=constants.CONTEXT_SESSION_TTL_MAX, minimum_s=10)
            ),
            bundle_cache_dir=Path(cache) if cache else project_root / ".bundle-cache",
            organization_id=_optional(
                node, constants.CONTEXT_ORGANIZATION_ID, _ORG_ID, "an AWS Organizations id, o-..."
            ),
            session_named_roles=_session_named_roles(
                node.try_get_context(constants.CONTEXT_SESSION_NAMED_ROLES)
            ),
            alarm_topic_arn=_optional(
                node, constants.CONTEXT_ALARM_TOPIC_ARN, _TOPIC_ARN, "an SNS topic ARN"
            ),
            pin_admins=_flag(node, constants.CONTEXT_PIN_ADMINS, default=True),
            admin_pin_epoch=_optional(
                node, constants.CONTEXT_ADMIN_PIN_EPOCH, _EPOCH, "a short word or number"
            )
            or "1",
            apigateway_cloudwatch_role=_cloudwatch_role(node),
            fleet_ebs_kms_key_arn=_optional(
                node,
                constants.CONTEXT_FLEET_EBS_KMS_KEY,
                _KMS_KEY_ARN,
                "a KMS key ARN, arn:aws:kms:...:key/...",
            ),
            fleet_ami_id=_optional(
                node, constants.CONTEXT_FLEET_AMI_ID, _AMI_ID, "an AMI id, ami- and 8 or 17 hex digits"
            ),
            other_accounts=_optional(
                node, constants.CONTEXT_OTHER_ACCOUNTS, _OTHER_ACCOUNTS, "distinct or refuse"
            ),
        )


def known_context_keys() -> tuple[str, ...]:
    """Every ``calque:`` context key the app reads (infra.constants.CONTEXT_*)."""
    return tuple(
        sorted(str(v) for k, v in vars(constants).items() if k.startswith("CONTEXT_") and isinstance(v, str))
    )


def check_context_keys(node: Node) -> None:
    """Refuse a ``calque:`` key the app does not read: a misspelt one (``calque:fleet-subnet``)
    would otherwise be ignored, and the deployment made without it (here: a VPC of its own)."""
    known = known_context_keys()
    for key in sorted(node.get_all_context()):
        if key.startswith(_CONTEXT_PREFIX) and key not in known:
            names = {k.removeprefix(_CONTEXT_PREFIX): k for k in known}
            close = difflib.get_close_matches(key.removeprefix(_CONTEXT_PREFIX), names, n=1)
            hint = f"did you mean {names[close[0]]}?" if close else f"known: {', '.join(known)}"
            raise ConfigError(f"context {key}: no such setting; {hint} (docs/deploy.md)")


def _cloudwatch_role(node: Node) -> str:
    """auto (default), or true/false as before: true creates it, false leaves the account's."""
    key = constants.CONTEXT_APIGATEWAY_CLOUDWATCH_ROLE
    value = node.try_get_context(key)
    if value in (None, "") or str(value).strip().lower() == "auto":
        return "auto"
    try:
        return "create" if _flag(node, key, default=False) else "leave"
    except ConfigError:
        raise ConfigError(f"context {key}={value!r}: expected auto, true or false") from None


def _flag(node: Node, key: str, *, default: bool) -> bool:
    value = node.try_get_context(key)
    if value in (None, ""):
        return default
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "1"):
        return True
    if text in ("false", "no", "0"):
        return False
    raise ConfigError(f"context {key}={value!r}: expected true or false")

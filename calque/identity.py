"""Who is calling: the principal API Gateway's IAM authorizer verified.

The caller's principal is the user; no request body ever names who the caller is.
An assumed-role principal is normalized to ``role/session``; an IAM user to its name.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel

from calque.errors import Unauthenticated


class Caller(BaseModel):
    principal: str
    arn: str
    account: str | None = None
    admin: bool = False

    @property
    def role(self) -> str | None:
        """The role name when the caller is an assumed role, else None."""
        if ":assumed-role/" in self.arn:
            return self.principal.split("/", 1)[0]
        return None

    @property
    def role_session(self) -> str | None:
        if ":assumed-role/" in self.arn:
            return self.principal.split("/", 1)[1]
        return None


def normalize_arn(arn: str) -> str:
    """arn:aws:iam::1:user/path/alice -> alice; arn:aws:sts::1:assumed-role/R/s -> R/s."""
    parts = arn.split(":", 5)
    if len(parts) != 6 or parts[0] != "arn" or parts[2] not in ("iam", "sts"):
        raise Unauthenticated(f"unrecognized principal ARN {arn!r}")
    resource = parts[5]
    kind, _, rest = resource.partition("/")
    if kind == "user" and rest:
        return rest.rsplit("/", 1)[-1]
    if kind == "assumed-role" and rest.count("/") >= 1:
        role, session = rest.split("/", 1)
        return f"{role}/{session}"
    if kind == "federated-user" and rest:
        return f"federated/{rest}"
    if resource == "root":
        return "root"
    raise Unauthenticated(f"unrecognized principal ARN {arn!r}")


def is_admin(principal: str, arn: str, admins: Iterable[str]) -> bool:
    """An admin entry matches the normalized principal or the ARN; ``*`` globs allowed
    (``CalqueAdmins/*`` admits every session of that role)."""
    return any(fnmatch.fnmatchcase(principal, pat) or fnmatch.fnmatchcase(arn, pat) for pat in admins)


def caller_from_event(event: Mapping[str, Any], admins: Iterable[str]) -> Caller:
    """Read the caller from an API Gateway REST proxy event authorized with AWS_IAM."""
    identity = (event.get("requestContext") or {}).get("identity") or {}
    arn = identity.get("userArn")
    if not arn:
        raise Unauthenticated("request carries no IAM identity")
    principal = normalize_arn(arn)
    return Caller(
        principal=principal,
        arn=arn,
        account=identity.get("accountId"),
        admin=is_admin(principal, arn, admins),
    )

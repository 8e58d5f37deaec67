"""Who is calling: the principal API Gateway's IAM authorizer verified.

The caller's principal is the user; no request body ever names who the caller is.
An assumed-role principal is normalized to ``role/session``; an IAM user to its name.

What a caller cannot choose, and what this module trusts:

- ``requestContext.identity.userArn`` and ``accountId``: the signing principal, verified
  by SigV4. A role *session name* inside an assumed-role ARN, however, is chosen by
  whoever calls ``sts:AssumeRole``, unless the role's trust policy pins it.
- ``requestContext.identity.user``: the principal's unique id (``AIDA...`` for an IAM
  user, ``AROA...:session`` for a role session). The ``AIDA``/``AROA`` part is assigned by
  IAM and changes when a user or role is deleted and created again under the same name.

So an admin entry names an IAM user, or a whole role (every session of it), optionally
pinned to its unique id; never one session of a role, which a member could pose as by
picking that session name. And a role's sessions are told apart as different members
only when its session names are pinned (``session_named_roles``): otherwise one member
could pose as another by choosing their session name, and the call is refused.

A member is an account plus a name. A principal of the API's own account is its bare name
(``alice``, ``Role/session``); one of any other account (a deployment that admits its
organization's accounts) is ``ACCOUNT:name`` (``999999999999:alice``), a different member
from the home account's ``alice``. IAM names, role session names and federated user names
never hold a ``:``, so no principal of the home account can be written like one of another.
A deployment may refuse other accounts' principals instead (``other_accounts="refuse"``).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel

from calque.errors import Forbidden, Unauthenticated

OtherAccounts = Literal["distinct", "refuse"]

# Identity Center permission-set roles: the session name is the person's Identity Center
# user name, set by IAM Identity Center, never by the caller.
DEFAULT_SESSION_NAMED_ROLES: tuple[str, ...] = ("AWSReservedSSO_*",)

_ACCOUNT = r"\d{12}"
_IAM_NAME = r"[\w+=,.@-]{1,128}"
_UNIQUE_ID = re.compile(r"^(AIDA|AROA)[A-Z0-9]{8,128}$")
_IAM_ARN = re.compile(
    rf"^arn:aws(?:-[a-z]+)*:iam::(?P<account>{_ACCOUNT}):(?P<kind>user|role)/(?:[\w+=,.@/-]*/)?(?P<name>{_IAM_NAME})$"
)
_STS_ARN = re.compile(
    rf"^arn:aws(?:-[a-z]+)*:sts::(?P<account>{_ACCOUNT}):assumed-role/(?P<role>{_IAM_NAME})/(?P<session>.+)$"
)


class Caller(BaseModel):
    # The member: the bare name in the API's own account, ACCOUNT:name in any other
    principal: str
    arn: str
    account: str | None = None
    # requestContext.identity.user: AIDA... (a user) or AROA...:session (a role session)
    unique_id: str | None = None
    admin: bool = False

    @property
    def name(self) -> str:
        """The principal's name within its own account (``alice``, ``Role/session``)."""
        return normalize_arn(self.arn)

    @property
    def role(self) -> str | None:
        """The role name when the caller is an assumed role, else None."""
        if ":assumed-role/" in self.arn:
            return self.name.split("/", 1)[0]
        return None

    @property
    def role_session(self) -> str | None:
        if ":assumed-role/" in self.arn:
            return self.name.split("/", 1)[1]
        return None

    @property
    def principal_id(self) -> str | None:
        """The IAM-assigned part of the unique id (AIDA... / AROA...), which no caller chooses."""
        return self.unique_id.split(":", 1)[0] if self.unique_id else None


def arn_account(arn: str) -> str:
    """The account an IAM or STS principal ARN belongs to ('' for none)."""
    parts = arn.split(":", 5)
    return parts[4] if len(parts) == 6 else ""


def member_of(name: str, account: str | None, home_account: str | None) -> str:
    """The member a principal is: its bare name in the home account, ACCOUNT:name elsewhere."""
    if home_account is None or account is None or account == home_account:
        return name
    return f"{account}:{name}"


def normalize_arn(arn: str) -> str:
    """arn:aws:iam::1:user/path/alice -> alice; arn:aws:sts::1:assumed-role/R/s -> R/s.

    The name within the principal's own account: which member it is also depends on the
    account (``member_of``)."""
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


# ---- admin entries ---------------------------------------------------------------------------


class InvalidAdminEntry(ValueError):
    """An admin entry that could never match a caller, or that a member could pose as."""


class AdminEntry(NamedTuple):
    """One parsed admin entry. ``account`` None: the API's own account."""

    kind: Literal["user", "role", "unique_id"]
    name: str
    account: str | None = None
    # The unique id the deployment resolved for this user or role: a user or role deleted
    # and created again under the same name gets a new one, and is no longer admin.
    pinned_id: str | None = None
    text: str = ""

    def matches(self, caller: Caller, home_account: str | None) -> bool:
        if self.kind == "unique_id":
            return caller.principal_id == self.name
        account = self.account or home_account
        if account is not None and caller.account != account:
            return False
        if self.kind == "user":
            matched = caller.role is None and ":user/" in caller.arn and caller.name == self.name
        else:
            matched = caller.role == self.name
        if matched and self.pinned_id is not None:
            return caller.principal_id == self.pinned_id
        return matched


_SESSION_REASON = (
    "a role's session name is chosen by whoever assumes the role, so any member allowed to assume "
    "{role} could pose as this entry; name the role ({role}/* or arn:aws:iam::ACCOUNT:role/{role}) "
    "to make every session of it admin, or an IAM user"
)


def parse_admin(text: str) -> AdminEntry:
    """Parse one admin entry; InvalidAdminEntry with the reason when it can never be right.

    Accepted: ``NAME`` (an IAM user of the API's account), ``ROLE/*`` (every session of a
    role of the API's account), ``arn:aws:iam::ACCOUNT:user/[PATH/]NAME``,
    ``arn:aws:iam::ACCOUNT:role/[PATH/]NAME`` (every session of that role), ``AIDA...`` /
    ``AROA...`` (a unique id), and any of these followed by ``|AIDA...``/``|AROA...`` (pinned
    to the unique id the deployment resolved).
    """
    raw = text.strip()
    body, _, pin = raw.partition("|")
    if pin and not _UNIQUE_ID.match(pin):
        raise InvalidAdminEntry(f"admin entry {raw!r}: {pin!r} is not an IAM unique id (AIDA... or AROA...)")
    entry = _parse_body(body, raw)
    if pin:
        if entry.kind == "unique_id":
            raise InvalidAdminEntry(f"admin entry {raw!r}: a unique id needs no pin")
        want = "AIDA" if entry.kind == "user" else "AROA"
        if not pin.startswith(want):
            raise InvalidAdminEntry(f"admin entry {raw!r}: a {entry.kind}'s unique id starts with {want}")
        entry = AdminEntry(kind=entry.kind, name=entry.name, account=entry.account, pinned_id=pin, text=raw)
    return entry


def _parse_body(body: str, raw: str) -> AdminEntry:
    if not body:
        raise InvalidAdminEntry("an admin entry is empty")
    if _UNIQUE_ID.match(body):
        return AdminEntry(kind="unique_id", name=body, text=raw)
    if body.startswith("arn:"):
        if m := _IAM_ARN.match(body):
            return AdminEntry(kind=m["kind"], name=m["name"], account=m["account"], text=raw)  # type: ignore[arg-type]
        if m := _STS_ARN.match(body):
            if m["session"] == "*":
                return AdminEntry(kind="role", name=m["role"], account=m["account"], text=raw)
            raise InvalidAdminEntry(f"admin entry {raw!r}: " + _SESSION_REASON.format(role=m["role"]))
        if ":group/" in body:
            raise InvalidAdminEntry(
                f"admin entry {raw!r}: an IAM group never signs a request; name its users, or a role"
            )
        if body.endswith(":root"):
            raise InvalidAdminEntry(f"admin entry {raw!r}: the account's root user is not a calque admin")
        raise InvalidAdminEntry(
            f"admin entry {raw!r}: not an IAM user or role ARN (arn:aws:iam::ACCOUNT:user/NAME or :role/NAME)"
        )
    if "/" in body:
        role, _, session = body.partition("/")
        if not re.fullmatch(_IAM_NAME, role):
            raise InvalidAdminEntry(f"admin entry {raw!r}: {role!r} is not an IAM role name")
        if session == "*":
            return AdminEntry(kind="role", name=role, text=raw)
        raise InvalidAdminEntry(f"admin entry {raw!r}: " + _SESSION_REASON.format(role=role))
    if any(c in body for c in "*?["):
        raise InvalidAdminEntry(
            f"admin entry {raw!r}: wildcards are accepted only as ROLE/* (every session of one role)"
        )
    if body == "root":
        raise InvalidAdminEntry(f"admin entry {raw!r}: the account's root user is not a calque admin")
    if not re.fullmatch(_IAM_NAME, body):
        raise InvalidAdminEntry(f"admin entry {raw!r}: not an IAM user name")
    return AdminEntry(kind="user", name=body, text=raw)


def parse_admins(entries: Iterable[str]) -> tuple[AdminEntry, ...]:
    """Every entry parsed; the first bad one refuses them all (InvalidAdminEntry)."""
    return tuple(parse_admin(e) for e in entries if e.strip())


def is_admin(caller: Caller, admins: Sequence[AdminEntry], home_account: str | None = None) -> bool:
    return any(a.matches(caller, home_account) for a in admins)


# ---- the caller ------------------------------------------------------------------------------


def session_names_pinned(role: str, session_named_roles: Iterable[str]) -> bool:
    """True when the role's session names identify a person (the caller cannot choose them)."""
    return any(fnmatch.fnmatchcase(role, pat) for pat in session_named_roles)


def caller_from_event(
    event: Mapping[str, Any],
    admins: Iterable[str] | Sequence[AdminEntry],
    *,
    session_named_roles: Iterable[str] | None = None,
    trusted_roles: Iterable[str] = (),
    home_account: str | None = None,
    other_accounts: OtherAccounts = "distinct",
) -> Caller:
    """Read the caller from an API Gateway REST proxy event authorized with AWS_IAM.

    Given ``session_named_roles`` (the API always gives them), a session of a role whose
    session names are not pinned (those roles, and ``trusted_roles`` such as the host role,
    whose sessions EC2 names) is refused unless the role is an admin role: its session
    name cannot tell one member from another. Without them, nothing is refused here.

    A principal of another account than the API's is the member ``ACCOUNT:name``, or, with
    ``other_accounts="refuse"``, refused (403 ``other_account_refused``).
    """
    context = event.get("requestContext") or {}
    identity = context.get("identity") or {}
    arn = identity.get("userArn")
    if not arn:
        raise Unauthenticated("request carries no IAM identity")
    name = normalize_arn(arn)
    account = identity.get("accountId") or arn_account(arn) or None
    home = home_account or context.get("accountId")
    entries = [a if isinstance(a, AdminEntry) else parse_admin(a) for a in admins]
    who = Caller(
        principal=member_of(name, account, home),
        arn=arn,
        account=account,
        unique_id=identity.get("user") or identity.get("caller"),
    )
    admin = is_admin(who, entries, home)
    if other_accounts == "refuse" and who.principal != name and not admin:
        raise Forbidden(
            f"this deployment serves only its own account's principals, not account {account}'s",
            code="other_account_refused",
            details={"account": account, "principal": name},
        )
    who = who.model_copy(update={"admin": admin})
    role = who.role
    if (
        session_named_roles is not None
        and role is not None
        and not admin
        and role not in set(trusted_roles)
        and not session_names_pinned(role, session_named_roles)
    ):
        raise Forbidden(
            f"role {role} lets whoever assumes it choose the session name, so calque cannot tell its "
            "members apart; an admin must pin its session names (see docs/deploy.md) and list it "
            "in session_named_roles",
            code="role_session_not_pinned",
            details={"principal": who.principal, "role": role},
        )
    return who

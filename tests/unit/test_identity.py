import pytest

from calque.errors import Forbidden, Unauthenticated
from calque.identity import (
    DEFAULT_SESSION_NAMED_ROLES,
    Caller,
    InvalidAdminEntry,
    caller_from_event,
    is_admin,
    normalize_arn,
    parse_admin,
    parse_admins,
)

pytestmark = pytest.mark.unit

ACCT = "123456789012"
OTHER = "210987654321"
ADMIN_ROLE_ID = "AROAADMINROLE0000001"


@pytest.mark.parametrize(
    ("arn", "principal"),
    [
        ("arn:aws:iam::123456789012:user/alice", "alice"),
        ("arn:aws:iam::123456789012:user/lab/gpu/alice", "alice"),
        ("arn:aws:sts::123456789012:assumed-role/Researchers/alice@uni.edu", "Researchers/alice@uni.edu"),
        ("arn:aws:sts::123456789012:federated-user/bob", "federated/bob"),
        ("arn:aws:iam::123456789012:root", "root"),
    ],
)
def test_principal_is_normalized(arn, principal):
    assert normalize_arn(arn) == principal


@pytest.mark.parametrize("arn", ["", "alice", "arn:aws:s3:::bucket", "arn:aws:iam::1:group/x"])
def test_unrecognized_arn_is_refused(arn):
    with pytest.raises(Unauthenticated):
        normalize_arn(arn)


def event(arn: str, *, unique: str | None = None, account: str = ACCT, home: str = ACCT) -> dict:
    identity = {"userArn": arn, "accountId": account}
    if unique:
        identity.update(user=unique, caller=unique)
    return {"requestContext": {"accountId": home, "identity": identity}}


def user(name: str, account: str = ACCT, unique: str = "AIDAUSER000000000001") -> dict:
    return event(f"arn:aws:iam::{account}:user/{name}", unique=unique, account=account)


def session(role: str, name: str, account: str = ACCT, role_id: str = ADMIN_ROLE_ID) -> dict:
    return event(
        f"arn:aws:sts::{account}:assumed-role/{role}/{name}", unique=f"{role_id}:{name}", account=account
    )


def api_caller(evt: dict, admins, **kw) -> Caller:
    """As the API reads callers: with the roles whose session names are pinned."""
    kw.setdefault("session_named_roles", DEFAULT_SESSION_NAMED_ROLES)
    return caller_from_event(evt, admins, **kw)


def admin_of(evt: dict, admins) -> bool:
    """Whether the caller is admin; a session of a role that is neither admin nor pinned is
    refused outright, which is not admin either."""
    try:
        return api_caller(evt, admins).admin
    except Forbidden:
        return False


# ---- admin entries -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "kind", "name", "account"),
    [
        ("admin", "user", "admin", None),
        (f"arn:aws:iam::{ACCT}:user/ops/admin", "user", "admin", ACCT),
        # the docs' form: callers never present role/..., they sign as assumed-role/Name/session
        (f"arn:aws:iam::{ACCT}:role/CalqueAdmins", "role", "CalqueAdmins", ACCT),
        (f"arn:aws:iam::{ACCT}:role/teams/CalqueAdmins", "role", "CalqueAdmins", ACCT),
        (f"arn:aws:sts::{ACCT}:assumed-role/CalqueAdmins/*", "role", "CalqueAdmins", ACCT),
        ("CalqueAdmins/*", "role", "CalqueAdmins", None),
        (ADMIN_ROLE_ID, "unique_id", ADMIN_ROLE_ID, None),
    ],
)
def test_admin_entries_parse(entry, kind, name, account):
    parsed = parse_admin(entry)
    assert (parsed.kind, parsed.name, parsed.account) == (kind, name, account)


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ("Researchers/carol", "session name is chosen by whoever assumes the role"),
        (f"arn:aws:sts::{ACCT}:assumed-role/Researchers/carol", "session name is chosen"),
        ("Calque*", "wildcards are accepted only as ROLE/*"),
        ("CalqueAdmins/car*", "session name is chosen"),
        (f"arn:aws:iam::{ACCT}:group/Admins", "group never signs a request"),
        (f"arn:aws:iam::{ACCT}:root", "root user"),
        ("root", "root user"),
        ("arn:aws:s3:::bucket", "not an IAM user or role ARN"),
        ("admin|AROANOTAUSER00000001", "a user's unique id starts with AIDA"),
        ("admin|nonsense", "not an IAM unique id"),
    ],
)
def test_admin_entries_that_can_never_be_right_are_refused_with_the_reason(entry, reason):
    with pytest.raises(InvalidAdminEntry, match=reason.replace("*", r"\*")):
        parse_admin(entry)


def test_a_role_arn_entry_admits_every_session_of_that_role_in_its_account():
    admins = parse_admins([f"arn:aws:iam::{ACCT}:role/CalqueAdmins"])
    assert caller_from_event(session("CalqueAdmins", "carol"), admins).admin
    assert caller_from_event(session("CalqueAdmins", "dave"), admins).admin
    # the same role name in another account is not this role
    assert not admin_of(session("CalqueAdmins", "carol", account=OTHER), admins)


def test_bare_names_are_users_of_the_apis_own_account():
    admins = parse_admins(["admin", "CalqueAdmins/*"])
    assert caller_from_event(user("admin"), admins).admin
    assert not caller_from_event(user("admin", account=OTHER), admins).admin
    assert caller_from_event(session("CalqueAdmins", "x"), admins).admin
    assert not caller_from_event(user("alice"), admins).admin


def test_a_member_cannot_become_admin_by_naming_their_session_after_one():
    # Given admin "carol" (an IAM user) and a member role whose sessions are pinned
    admins = parse_admins(["carol"])
    # When a member of Researchers assumes it with the session name "carol"
    who = caller_from_event(
        session("Researchers", "carol", role_id="AROARESEARCH00000001"),
        admins,
        session_named_roles=["Researchers"],
    )
    # Then they are Researchers/carol, a member, not the admin carol
    assert who.principal == "Researchers/carol"
    assert not who.admin


def test_a_role_whose_session_names_callers_choose_cannot_tell_members_apart():
    with pytest.raises(Forbidden) as refused:
        api_caller(session("Researchers", "bob", role_id="AROARESEARCH00000001"), ["admin"])
    assert refused.value.code == "role_session_not_pinned"
    assert refused.value.details["role"] == "Researchers"


def test_identity_center_and_listed_roles_keep_one_member_per_session():
    sso = api_caller(session("AWSReservedSSO_Researcher_0123abcd", "alice@uni.edu"), ["admin"])
    assert sso.principal == "AWSReservedSSO_Researcher_0123abcd/alice@uni.edu"
    listed = caller_from_event(
        session("Researchers", "alice"), ["admin"], session_named_roles=["Researchers"]
    )
    assert listed.principal == "Researchers/alice"


def test_admin_roles_and_trusted_roles_need_no_pinned_session_names():
    admins = parse_admins(["CalqueAdmins/*"])
    assert caller_from_event(session("CalqueAdmins", "anything"), admins).admin
    host = api_caller(session("calque-host", "i-0abc"), admins, trusted_roles=["calque-host"])
    assert host.role_session == "i-0abc"


def test_a_recreated_role_with_the_same_name_is_not_admin_when_pinned():
    # Given an admin role pinned to the unique id IAM gave it when the stack was deployed
    admins = parse_admins([f"arn:aws:iam::{ACCT}:role/CalqueAdmins|{ADMIN_ROLE_ID}"])
    assert caller_from_event(session("CalqueAdmins", "carol"), admins).admin
    # When the role is deleted and created again under the same name (a new unique id)
    recreated = session("CalqueAdmins", "carol", role_id="AROARECREATED0000001")
    # Then its sessions are no longer admin
    assert not admin_of(recreated, admins)


def test_unique_id_entries_match_the_iam_assigned_part_only():
    admins = parse_admins([ADMIN_ROLE_ID])
    assert caller_from_event(session("CalqueAdmins", "x"), admins).admin
    other = session("CalqueAdmins", "x", role_id="AROAOTHER00000000001")
    assert not admin_of(other, admins)


def test_is_admin_needs_the_account_for_bare_entries():
    who = Caller(principal="admin", arn=f"arn:aws:iam::{OTHER}:user/admin", account=OTHER)
    assert not is_admin(who, parse_admins(["admin"]), ACCT)


def test_event_without_identity_is_unauthenticated():
    with pytest.raises(Unauthenticated):
        caller_from_event({"requestContext": {"identity": {}}}, ["admin"])


def test_settings_refuse_an_admin_entry_that_can_never_match_at_cold_start():
    from pydantic import ValidationError

    from calque.settings import CommonSettings

    with pytest.raises(ValidationError, match="session name is chosen"):
        CommonSettings.from_env({"CALQUE_TABLE_NAME": "t", "CALQUE_ADMINS": "admin,Researchers/carol"})


def test_a_principal_of_another_account_is_its_own_member():
    # Given alice of the home account and alice of another account of the organization
    home = caller_from_event(user("alice"), [])
    other = caller_from_event(user("alice", account=OTHER), [])
    # Then they are two members, the other one named with its account
    assert home.principal == "alice"
    assert other.principal == f"{OTHER}:alice"
    assert other.name == "alice"


def test_a_pinned_role_session_of_another_account_keeps_its_role():
    who = api_caller(session("AWSReservedSSO_Lab_0123", "bob", account=OTHER), [])
    assert who.principal == f"{OTHER}:AWSReservedSSO_Lab_0123/bob"
    assert (who.role, who.role_session) == ("AWSReservedSSO_Lab_0123", "bob")


def test_other_accounts_may_be_refused_by_setting():
    with pytest.raises(Forbidden) as refused:
        caller_from_event(user("alice", account=OTHER), [], other_accounts="refuse")
    assert refused.value.code == "other_account_refused"
    assert caller_from_event(user("alice"), [], other_accounts="refuse").principal == "alice"

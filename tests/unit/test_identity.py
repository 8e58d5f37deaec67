import pytest

from calque.errors import Unauthenticated
from calque.identity import caller_from_event, is_admin, normalize_arn

pytestmark = pytest.mark.unit


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


def test_admin_patterns_match_principal_or_arn():
    assert is_admin(
        "CalqueAdmins/carol", "arn:aws:sts::1:assumed-role/CalqueAdmins/carol", ["CalqueAdmins/*"]
    )
    assert is_admin("admin", "arn:aws:iam::1:user/admin", ["arn:aws:iam::1:user/admin"])
    assert not is_admin("alice", "arn:aws:iam::1:user/alice", ["admin", "CalqueAdmins/*"])


def test_event_without_identity_is_unauthenticated():
    with pytest.raises(Unauthenticated):
        caller_from_event({"requestContext": {"identity": {}}}, ["admin"])

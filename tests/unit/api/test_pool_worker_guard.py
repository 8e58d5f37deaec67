"""Who may send a pool worker's reports: the deployed host role itself (pinned to its unique id
and account), in a role session named after an instance; no member, no look-alike role."""

from __future__ import annotations

import pytest

from calque.errors import Forbidden
from calque.identity import Caller
from calque.settings import clear_caches
from functions.api.context import require_host_role

pytestmark = pytest.mark.unit

HOST_ROLE_ID = "AROAHOSTROLE00000001"
EVENT = {"requestContext": {"accountId": "123456789012"}}


@pytest.fixture(autouse=True)
def settings(monkeypatch):
    for name, value in {
        "CALQUE_TABLE_NAME": "t",
        "CALQUE_HOST_TASKS_QUEUE_URL": "https://sqs/q",
        "CALQUE_HOST_ROLE_NAME": "calque-host",
        "CALQUE_HOST_ROLE_ID": HOST_ROLE_ID,
        "CALQUE_ACCOUNT_ID": "123456789012",
        "CALQUE_SESSION_DOCUMENT_NAME": "calque-session",
    }.items():
        monkeypatch.setenv(name, value)
    clear_caches()
    yield
    clear_caches()


def _host(instance: str = "i-0abc", role_id: str = HOST_ROLE_ID, account: str = "123456789012") -> Caller:
    return Caller(
        principal=f"calque-host/{instance}",
        arn=f"arn:aws:sts::{account}:assumed-role/calque-host/{instance}",
        account=account,
        unique_id=f"{role_id}:{instance}",
    )


def test_the_host_roles_instance_session_may_report():
    require_host_role(_host(), {}, EVENT)


@pytest.mark.parametrize(
    "who",
    [
        _host(role_id="AROARECREATED0000001"),  # a role of the same name, created again
        _host(account="210987654321"),  # another account's role of that name
        Caller(
            principal="alice",
            arn="arn:aws:iam::123456789012:user/alice",
            account="123456789012",
            unique_id="AIDAALICE",
        ),
    ],
    ids=["recreated-role", "foreign-account", "member"],
)
def test_anyone_else_is_refused(who):
    with pytest.raises(Forbidden):
        require_host_role(who, {}, EVENT)

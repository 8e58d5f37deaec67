"""PUT /v1/fairshare/{account}: what its body and its path take (calque.contracts.queue)."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from calque.contracts.queue import ACCOUNT_PATTERN, SharesRequest

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("body", ['{"shares": true}', '{"shares": "2"}', '{"shares": null}'])
def test_shares_are_a_number_never_a_flag_or_text(body):
    # `true` was read as 1 share: the API takes no coercion between JSON types (docs/api.md)
    with pytest.raises(ValidationError):
        SharesRequest.model_validate_json(body)


@pytest.mark.parametrize("body", ['{"shares": 2}', '{"shares": 0.5}'])
def test_shares_may_be_whole_or_not(body):
    assert SharesRequest.model_validate_json(body).shares > 0


@pytest.mark.parametrize("account", ["physics", "lab-2", "user:alice", "user:123456789012:bob"])
def test_an_account_is_a_group_or_a_user(account):
    assert re.fullmatch(ACCOUNT_PATTERN, account)


@pytest.mark.parametrize("account", ["user:", "user: a", "Physics", "lab:x", "user:a b", "x" * 64])
def test_what_is_neither_is_not_an_account(account):
    assert not re.fullmatch(ACCOUNT_PATTERN, account)

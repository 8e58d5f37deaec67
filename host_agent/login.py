"""`python -m host_agent login --user ACCOUNT`: what the stack's Session Manager document
runs (as root, through sudo) when a member connects. It lands the member in the
session's account only after they give that session's token, so knowing another
session's account name (every account is listed in /etc/passwd) is not enough.
"""

from __future__ import annotations

import getpass
import hashlib
import hmac
import os
import sys

from host_agent.tenants import DEFAULT_STATE_DIR, GrantStore


def check_token(account: str, token: str, grants: dict) -> bool:
    digest = hashlib.sha256(token.strip().encode()).hexdigest()
    return any(
        g.account == account and g.token_sha256 and hmac.compare_digest(digest, g.token_sha256)
        for g in grants.values()
    )


def login(account: str, *, state_dir: str = DEFAULT_STATE_DIR) -> int:
    grants = GrantStore(f"{state_dir}/grants.json").load()
    if not any(g.account == account for g in grants.values()):
        # Check-out answers before the host agent has run its grant (a queued command, a
        # few seconds): a member who connects at once is told to retry, not that it failed.
        print(
            f"error: {account} is not granted on this host (yet): a session's access arrives a few "
            "seconds after check-out; retry shortly, and if it persists see host_access in "
            "`calque session show`",
            file=sys.stderr,
        )
        return 1
    token = getpass.getpass("calque session token: ")
    if not check_token(account, token, grants):
        print("error: that is not this session's token", file=sys.stderr)
        return 1
    os.execvp("runuser", ["runuser", "--login", account])  # noqa: S606
    return 0  # not reached

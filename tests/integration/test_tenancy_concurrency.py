"""A slice is held by at most one live session, ever, whatever the concurrency:
racing check-outs, racing check-ins, and expiry racing an extend, through the local
plane's real front and handlers (raw signed HTTP).

The local plane runs one API invocation at a time (as one Lambda execution environment
does), so the DynamoDB conditions are also raced directly: many threads, each its own
"environment" (own Tenancy, own boto3 clients), against the plane's DynamoDB.
"""

from __future__ import annotations

import time

import pytest

from tests.integration.test_tenancy_support import (
    checkout,
    error_code,
    host,
    new_members,
    race,
    ready_host,
    wait_all_free,
    wait_until,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def iid(local_plane):
    """One ready host with 4 x 1g.24gb for this module; each test leaves every slice free."""
    return ready_host(local_plane)


ROUNDS = 3
RACERS = 8  # members racing for a host's 4 slices


def test_racing_checkouts_get_exactly_as_many_slices_as_the_host_has(local_plane, iid):
    # Given a ready host with 4 slices and 8 members who each want one
    members = new_members(local_plane, "racer", RACERS)
    for rnd in range(ROUNDS):
        # When they all check out at the same moment
        results = race([lambda who=who: checkout(local_plane, who, iid) for who in members])
        assert not [r for r in results if isinstance(r, Exception)], results
        winners = {who: r.json() for who, r in zip(members, results, strict=True) if r.status == 201}
        losers = [r for r in results if r.status != 201]
        # Then exactly 4 win, each a different slice, each session its own caller's
        assert len(winners) == 4, (rnd, [(r.status, r.body) for r in results])
        assert len({g["slice_id"] for g in winners.values()}) == 4
        assert all(g["user"] == who and g["instance_id"] == iid for who, g in winners.items())
        # And every loser is told there is no free slice
        assert {(r.status, error_code(r)) for r in losers} == {(409, "no_free_slice")}
        # And the host shows exactly the winners' sessions holding its slices
        held = {
            s["slice_id"]: s["session_id"] for s in host(local_plane, iid)["slices"] if s["state"] == "held"
        }
        assert held == {g["slice_id"]: g["session_id"] for g in winners.values()}
        # When the winners check in, the slices come back for the next round
        for who, g in winners.items():
            resp = local_plane.request(
                "DELETE", f"/v1/sessions/{g['session_id']}", profile=who, body={"token": g["token"]}
            )
            assert resp.status == 200, resp.body
        wait_all_free(local_plane, iid)


def test_racing_checkins_of_one_session_release_it_exactly_once(local_plane, iid):
    # Given a member holding a session
    [who] = new_members(local_plane, "checkin", 1)
    for _ in range(ROUNDS):
        grant = checkout(local_plane, who, iid).json()
        path = f"/v1/sessions/{grant['session_id']}"
        # When eight check-ins of it race
        results = race(
            [
                lambda path=path, token=grant["token"]: local_plane.request(
                    "DELETE", path, profile=who, body={"token": token}
                )
                for _ in range(8)
            ]
        )
        # Then exactly one succeeds and the others are told it was already checked in
        statuses = sorted((r.status, error_code(r)) for r in results)
        assert statuses[0] == (200, None), statuses
        assert statuses[1:] == [(409, "already_checked_in")] * 7, statuses
        ended = local_plane.request("GET", path, profile=who).json()
        assert (ended["state"], ended["end_reason"]) == ("ended", "checked_in")
        # And the slice is reclaimed once and free again: not held twice, not lost
        wait_all_free(local_plane, iid)


def test_expiry_racing_an_extend_ends_nothing_twice(local_plane, iid):
    # Given sessions at their expiry, and their owners extending them just as the reaper runs
    members = new_members(local_plane, "extend", 4)
    grants = {who: checkout(local_plane, who, iid, ttl_seconds=10).json() for who in members}
    wait_until(
        "the sessions' expiry",
        lambda: time.time() > max(_epoch(g["expires_at"]) for g in grants.values()) + 0.5,
        timeout_s=30,
    )

    def extend(who: str):
        g = grants[who]
        return local_plane.request(
            "POST",
            f"/v1/sessions/{g['session_id']}/extend",
            profile=who,
            body={"token": g["token"], "ttl_seconds": 600},
        )

    results = race(
        [lambda: local_plane.fire_schedule("reaper")] + [lambda who=who: extend(who) for who in members]
    )
    # Then an expired session is not extended: each extend is refused, never a 5xx
    for r in results[1:]:
        assert r.status == 409, (r.status, r.body)
        assert error_code(r) in ("session_expired", "session_ended", "session_changed")
    # And after the reaper's next run every session ended exactly once, as expired
    local_plane.fire_schedule("reaper")
    for who, g in grants.items():
        s = local_plane.request("GET", f"/v1/sessions/{g['session_id']}", profile=who).json()
        assert (s["state"], s["end_reason"]) == ("ended", "expired"), s
    # And every slice is reclaimed and free again
    wait_all_free(local_plane, iid)


def test_extend_racing_the_reaper_before_expiry_keeps_the_session(local_plane, iid):
    # Given live sessions not yet expired
    members = new_members(local_plane, "keep", 2)
    grants = {who: checkout(local_plane, who, iid, ttl_seconds=60).json() for who in members}
    # When their owners extend while the reaper runs
    results = race(
        [lambda: local_plane.fire_schedule("reaper")]
        + [
            lambda who=who: local_plane.request(
                "POST",
                f"/v1/sessions/{grants[who]['session_id']}/extend",
                profile=who,
                body={"token": grants[who]["token"], "ttl_seconds": 600},
            )
            for who in members
        ]
    )
    # Then every extend succeeds, and the reaper ended none of them
    assert [r.status for r in results[1:]] == [200] * len(members), [r.body for r in results[1:]]
    held = {s["session_id"] for s in host(local_plane, iid)["slices"] if s["state"] == "held"}
    assert held == {g["session_id"] for g in grants.values()}
    for who, g in grants.items():
        resp = local_plane.request(
            "DELETE", f"/v1/sessions/{g['session_id']}", profile=who, body={"token": g["token"]}
        )
        assert resp.status == 200
    wait_all_free(local_plane, iid)


def _environment(plane):
    """What one deployed API function instance holds: the domain over its own clients."""
    import boto3

    from calque.tenancy.service import Tenancy
    from calque.tenancy.store.dynamo import DynamoRegistry, SqsHostTaskQueue

    key, secret = plane.moto_credentials()  # the plane's moto lets only its own key pair in
    session = boto3.session.Session(
        aws_access_key_id=key, aws_secret_access_key=secret, region_name=plane.region
    )
    ddb = session.client("dynamodb", endpoint_url=plane.moto_endpoint)
    sqs = session.client("sqs", endpoint_url=plane.moto_endpoint)
    return Tenancy(
        DynamoRegistry(ddb, plane.info["table"]), SqsHostTaskQueue(sqs, plane.info["queues"]["host_tasks"])
    )


def test_racing_checkouts_in_separate_environments_never_double_book(local_plane, iid):
    from calque.contracts.tenancy import CheckinRequest, CheckoutRequest
    from calque.errors import Conflict
    from calque.identity import Caller

    # Given a ready host with 4 slices, and 8 API environments each serving another member
    members = new_members(local_plane, "env", RACERS)
    envs = [_environment(local_plane) for _ in members]
    callers = [Caller(principal=m, arn=f"arn:aws:iam::{local_plane.account}:user/{m}") for m in members]
    req = CheckoutRequest(instance_id=iid, backend="mig", profile="1g.24gb", ttl_seconds=600)
    for rnd in range(2):
        # When all of them check out at once against the same DynamoDB
        def attempt(i):
            try:
                return envs[i].checkout(callers[i], req)
            except Conflict as exc:
                return exc

        results = race([lambda i=i: attempt(i) for i in range(RACERS)])
        grants = [r for r in results if not isinstance(r, Exception)]
        refusals = [r for r in results if isinstance(r, Exception)]
        # Then exactly 4 grants on 4 different slices; every other one is no_free_slice
        assert len(grants) == 4, (rnd, results)
        assert len({g.slice_id for g in grants}) == 4
        assert {getattr(r, "code", type(r).__name__) for r in refusals} == {"no_free_slice"}
        held = {
            s["slice_id"]: s["session_id"] for s in host(local_plane, iid)["slices"] if s["state"] == "held"
        }
        assert held == {g.slice_id: g.session_id for g in grants}
        for g in grants:
            who = callers[members.index(g.user)]
            envs[0].checkin(who, g.session_id, CheckinRequest(token=g.token))
        wait_all_free(local_plane, iid)


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()

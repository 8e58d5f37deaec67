"""`calque host acquisitions [REQUEST_ID | --instance-id I]`: one acquisition, named one way."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.unit

ACQ = {
    "request_id": "r-1111111111111111",
    "state": "registered",
    "instance_type": "g7e.2xlarge",
    "instance_id": "i-0aaaaaaaaaaaaaaaa",
    "attempts": [],
}


@pytest.fixture
def fleet_cli(api, cli, monkeypatch):
    from calque.cli import commands

    monkeypatch.setattr(commands, "COMMAND_MODULES", ["host", "fleet"])
    return cli


def test_a_request_id_and_an_instance_id_together_are_a_usage_error_and_send_nothing(api, fleet_cli):
    # Given an admin who names an acquisition both ways, for two different acquisitions
    api.responses[("GET", "/v1/acquisitions/r-1111111111111111")] = ACQ

    # When they ask for it
    code, out, err = fleet_cli(
        "host", "acquisitions", "r-1111111111111111", "--instance-id", "i-0bbbbbbbbbbbbbbbb"
    )

    # Then it is a usage error naming both, and neither is shown (one would be silently ignored)
    assert (code, out) == (2, "")
    assert "REQUEST_ID or --instance-id, not both" in err
    assert api.requests == []


def test_an_instance_id_alone_shows_the_acquisition_that_launched_it(api, fleet_cli):
    api.responses[("GET", "/v1/acquisitions")] = [ACQ]

    code, out, _ = fleet_cli("host", "acquisitions", "--instance-id", "i-0aaaaaaaaaaaaaaaa")

    assert code == 0
    assert "r-1111111111111111" in out
    assert api.requests == [("GET", "/v1/acquisitions", None, {"instance_id": "i-0aaaaaaaaaaaaaaaa"})]


def test_an_empty_instance_id_is_refused_and_never_shows_another_acquisition(api, fleet_cli):
    # Given acquisitions exist
    api.responses[("GET", "/v1/acquisitions")] = lambda body: [ACQ]

    # When an admin asks for the acquisition that launched ""
    code, out, err = fleet_cli("host", "acquisitions", "--instance-id", "")

    # Then it is no instance id: a usage error before anything is asked, and nothing is shown
    assert api.requests == []
    assert (code, out) == (2, "")
    assert "'' is not an instance id" in err


def test_acquire_wait_gives_all_its_acquisitions_one_timeout_together(api, fleet_cli, monkeypatch):
    # Given two acquisitions whose hosts are ready but keep one slice pending (a report that
    # left it out), and a clock that moves 10s at each look
    monkeypatch.setattr("time.sleep", lambda _s: None)
    ticks = iter(range(0, 100_000, 10))
    monkeypatch.setattr("time.monotonic", lambda: float(next(ticks)))
    api.responses[("POST", "/v1/hosts/acquire")] = {
        "acquisitions": [{"request_id": "r-1"}, {"request_id": "r-2"}],
        "budget": {},
    }
    for n in (1, 2):
        api.responses[("GET", f"/v1/acquisitions/r-{n}")] = {
            **ACQ,
            "request_id": f"r-{n}",
            "instance_id": f"i-{n}",
        }
        api.responses[("GET", f"/v1/hosts/i-{n}")] = {
            "instance_id": f"i-{n}",
            "state": "ready",
            "slices": [{"slice_id": "s-0", "state": "free"}, {"slice_id": "s-1", "state": "pending"}],
        }
    # When the admin acquires both with --wait and a 60s timeout
    code, _out, err = fleet_cli(
        "host",
        "acquire",
        "--instance-type",
        "g7e.2xlarge",
        "--count",
        "2",
        "--i-understand-this-spends-money",
        "--wait",
        "--timeout",
        "60s",
    )
    # Then the wait ends once the 60s are up for both together, not after 60s for each
    assert code == 0, err
    looks = [p for _m, p, _b, _q in api.requests if p.startswith("/v1/hosts/i-")]
    assert looks.count("/v1/hosts/i-1") >= 3
    assert looks.count("/v1/hosts/i-2") <= 2
    assert "i-1 is ready, but 1 of its 2 slices is still pending" in err
    assert "i-2 is ready, but 1 of its 2 slices is still pending" in err


def test_acquire_wait_with_one_failure_still_names_the_instances_that_launched(api, fleet_cli):
    # Given two acquisitions of one request: the first finds no capacity anywhere, the second
    # launches and its host is ready
    failed = {
        **ACQ,
        "request_id": "r-1",
        "state": "failed",
        "instance_id": None,
        "state_reason": "no capacity after 3 attempt(s)",
    }
    launched = {**ACQ, "request_id": "r-2", "instance_id": "i-2"}
    api.responses[("POST", "/v1/hosts/acquire")] = {
        "acquisitions": [{"request_id": "r-1"}, {"request_id": "r-2"}],
        "budget": {},
    }
    api.responses[("GET", "/v1/acquisitions/r-1")] = failed
    api.responses[("GET", "/v1/acquisitions/r-2")] = launched
    api.responses[("GET", "/v1/hosts/i-2")] = {
        "instance_id": "i-2",
        "state": "ready",
        "slices": [{"slice_id": "s-0", "state": "free"}],
    }
    argv = ["host", "acquire", "--instance-type", "g7e.2xlarge", "--count", "2"]
    argv += ["--i-understand-this-spends-money", "--wait", "--output", "json"]

    # When the admin acquires both and waits
    code, out, err = fleet_cli(*argv)

    # Then it is a refusal naming the failure, and the instance that runs (and costs) all the
    # same is named too, and followed to its host, never left unsaid
    assert code == 1
    assert "1 of 2 acquisitions did not become a ready host" in err
    assert "no capacity after 3 attempt(s)" in err
    assert "r-2 (i-2)" in err
    assert "host release" in err
    assert [line for line in err.splitlines() if line.startswith("calque: error:")] == [
        err.strip().splitlines()[-1]
    ]
    assert ("GET", "/v1/hosts/i-2", None, None) in api.requests
    doc = json.loads(out)
    assert doc["error"]["code"] == "acquisition_failed"
    assert doc["error"]["details"]["request_id"] == "r-1"
    assert [a["state"] for a in doc["error"]["details"]["acquisitions"]] == ["failed", "registered"]


def test_acquire_has_no_pool_option_and_sends_nothing_with_one(api, fleet_cli):
    # A warm pool acquires its own instances (calque pool create); an instance acquired "for a
    # pool" by hand would be neither a host nor the pool's worker, running and charged
    code, out, err = fleet_cli(
        "host", "acquire", "--instance-type", "g7e.2xlarge", "--pool", "llama",
        "--i-understand-this-spends-money",
    )  # fmt: skip
    assert (code, out) == (2, "")
    assert "--pool" in err
    assert api.requests == []


@pytest.mark.parametrize(
    ("state", "instance_id", "said"),
    [
        ("launching", None, "still being launched, which the wait ending does not stop: r-1"),
        ("booting", "i-1", "launched, running and charged all the same: r-1 (i-1)"),
    ],
)
def test_acquire_wait_that_times_out_says_the_acquisition_goes_on(
    api, fleet_cli, monkeypatch, state, instance_id, said
):
    # Given an acquisition still under way when the wait's time is up
    monkeypatch.setattr("time.sleep", lambda _s: None)
    ticks = iter(range(0, 100_000, 10))
    monkeypatch.setattr("time.monotonic", lambda: float(next(ticks)))
    api.responses[("POST", "/v1/hosts/acquire")] = {"acquisitions": [{"request_id": "r-1"}], "budget": {}}
    api.responses[("GET", "/v1/acquisitions/r-1")] = {
        **ACQ,
        "request_id": "r-1",
        "state": state,
        "instance_id": instance_id,
    }
    # When the admin's --wait gives up
    code, _out, err = fleet_cli(
        "host", "acquire", "--instance-type", "g7e.2xlarge", "--i-understand-this-spends-money",
        "--wait", "--timeout", "5s",
    )  # fmt: skip
    # Then it exits 1 saying it timed out, and that the acquisition goes on (and is charged once
    # it runs): not a failure that launched nothing
    assert code == 1
    assert f"acquisition r-1 is still {state} after 5s" in err
    assert said in err


@pytest.mark.parametrize(
    ("argv", "admins_only", "consent"),
    [
        (
            ["host", "acquire", "--instance-type", "g7e.2xlarge"],
            "acquiring instances is for admins only",
            "--i-understand-this-spends-money",
        ),
        (
            ["host", "release", "i-0aaaaaaaaaaaaaaaa"],
            "releasing instances is for admins only",
            "--i-understand-this-terminates-instances",
        ),
    ],
)
def test_a_member_without_the_consent_flag_is_told_it_is_for_admins_not_to_consent(
    api, fleet_cli, argv, admins_only, consent
):
    # Given a member (the API says so), who leaves out the consent flag
    api.responses[("GET", "/v1/whoami")] = {"principal": "alice", "admin": False}
    # When they run an admin's spending or terminating command
    code, out, err = fleet_cli(*argv, "--output", "json")
    # Then they are told it is not theirs to run (as the API says first), not to consent and
    # try again; and nothing but who they are was asked
    assert code == 1
    assert admins_only in err
    assert consent not in err
    assert json.loads(out)["error"]["code"] == "forbidden"
    assert [(m, p) for m, p, _b, _q in api.requests] == [("GET", "/v1/whoami")]
    # While an admin who leaves it out is still told to consent, and nothing is sent
    api.requests.clear()
    api.responses[("GET", "/v1/whoami")] = {"principal": "admin", "admin": True}
    code, out, err = fleet_cli(*argv, "--output", "json")
    assert code == 1
    assert consent in err
    assert json.loads(out)["error"]["code"] == "consent_required"
    assert [(m, p) for m, p, _b, _q in api.requests] == [("GET", "/v1/whoami")]

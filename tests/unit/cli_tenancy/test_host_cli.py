"""`calque host ...`: LAYOUT flags become the layout spec the control plane receives."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.unit

HOST = {
    "instance_id": "i-0abc",
    "instance_type": "g7e.2xlarge",
    "sharing": "mig",
    "state": "pending",
    "spot": False,
    "registered_at": "2026-12-02T10:00:00Z",
    "slices": [
        {
            "slice_id": f"g0-1g.24gb-{k}",
            "gpu_index": 0,
            "backend": "mig",
            "profile": "1g.24gb",
            "memory_gib": 24.0,
            "state": "pending",
        }
        for k in range(4)
    ],
}


def _register_body(api):
    [(method, path, body, _q)] = api.requests
    assert (method, path) == ("POST", "/v1/hosts")
    return body


def test_mig_flag_becomes_a_mig_layout_on_every_gpu(api, cli):
    # Given an admin registering a running instance with four 1g.24gb slices
    api.responses[("POST", "/v1/hosts")] = HOST
    # When they pass --mig
    code, out, _ = cli(
        "host", "register", "--instance-id", "i-0abc", "--instance-type", "g7e.2xlarge", "--mig", "1g.24gb=4"
    )
    # Then the control plane receives that layout for all GPUs, and the person sees the pending slices
    assert code == 0
    assert _register_body(api) == {
        "instance_id": "i-0abc",
        "instance_type": "g7e.2xlarge",
        "spot": False,
        "layout": {"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]},
    }
    assert "pending" in out
    assert "g0-1g.24gb-3" in out


def test_several_mig_profiles_are_kept_in_order(api, cli):
    api.responses[("POST", "/v1/hosts")] = HOST
    code, _, _ = cli(
        "host",
        "register",
        "--instance-id",
        "i-0abc",
        "--instance-type",
        "p5.48xlarge",
        "--mig",
        "1g.18gb=2, 3g.71gb=1",
    )
    assert code == 0
    assert _register_body(api)["layout"]["gpus"][0]["mig"] == {"1g.18gb": 2, "3g.71gb": 1}


def test_mps_flags_become_an_mps_layout(api, cli):
    api.responses[("POST", "/v1/hosts")] = {**HOST, "sharing": "mps", "slices": []}
    code, _, _ = cli(
        "host",
        "register",
        "--instance-id",
        "i-0abc",
        "--instance-type",
        "g6e.xlarge",
        "--mps-slots",
        "4",
        "--mps-thread-percentage",
        "25",
        "--mps-memory-limit-mib",
        "11000",
    )
    assert code == 0
    assert _register_body(api)["layout"] == {
        "version": "v1",
        "gpus": [
            {
                "devices": "all",
                "mps": {"clients": 4, "active_thread_percentage": 25, "pinned_memory_limit_mib": 11000},
            }
        ],
    }


def test_no_layout_flag_leaves_the_cards_default(api, cli):
    api.responses[("POST", "/v1/hosts")] = HOST
    code, _, _ = cli(
        "host", "register", "--instance-id", "i-0abc", "--instance-type", "g7e.2xlarge", "--spot"
    )
    assert code == 0
    body = _register_body(api)
    assert "layout" not in body
    assert body["spot"] is True


@pytest.mark.parametrize("suffix", ["json", "yaml"])
def test_spec_file_is_read_as_json_or_yaml(api, cli, tmp_path, suffix):
    spec = {"version": "v1", "gpus": [{"devices": [0], "mig": {"2g.48gb": 2}}]}
    path = tmp_path / f"layout.{suffix}"
    if suffix == "json":
        path.write_text(json.dumps(spec))
    else:
        path.write_text("version: v1\ngpus:\n  - devices: [0]\n    mig: {2g.48gb: 2}\n")
    api.responses[("POST", "/v1/hosts")] = HOST
    code, _, _ = cli(
        "host", "register", "--instance-id", "i-0abc", "--instance-type", "g7e.2xlarge", "--spec", str(path)
    )
    assert code == 0
    assert _register_body(api)["layout"] == spec


def test_invalid_spec_file_is_refused_naming_the_field_and_sends_nothing(api, cli, tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(
        json.dumps(
            {"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}, "mps": {"clients": 2}}]}
        )
    )
    code, out, err = cli(
        "host",
        "register",
        "--instance-id",
        "i-0abc",
        "--instance-type",
        "g7e.2xlarge",
        "--spec",
        str(path),
        "--output",
        "json",
    )
    assert code == 1
    assert api.requests == []
    assert "gpus[0]" in err
    assert json.loads(out)["error"]["code"] == "invalid_layout"


def test_missing_spec_file_is_a_one_line_refusal(api, cli, tmp_path):
    code, _, err = cli(
        "host",
        "register",
        "--instance-id",
        "i-0abc",
        "--instance-type",
        "g7e.2xlarge",
        "--spec",
        str(tmp_path / "nope.yaml"),
    )
    assert code == 1
    assert api.requests == []
    assert len(err.strip().splitlines()) == 1
    assert "nope.yaml" in err


def test_every_mig_profile_the_catalog_has_is_a_mig_flag(api, cli):
    # Given every MIG profile the catalog lists, of every card (1g.24gb-me and 1g.24gb+me.all
    # among them)
    from calque import catalog

    for card in catalog.cards():
        for profile in (p.name for p in card.mig_profiles):
            api.requests.clear()
            api.responses[("POST", "/v1/hosts")] = HOST
            # When an admin registers a host with it through --mig
            code, _, err = cli(
                "host", "register", "--instance-id", "i-0abc", "--instance-type", "g7e.2xlarge",
                "--mig", f"{profile}=1",
            )  # fmt: skip
            # Then the layout names it, as the catalog writes it (whether it fits the card is the
            # control plane's answer)
            assert code == 0, (profile, err)
            assert _register_body(api)["layout"]["gpus"][0]["mig"] == {profile: 1}


@pytest.mark.parametrize(
    "layout",
    [
        ["--mig", "1g.24gb"],
        ["--mig", "1g.24gb=0"],
        ["--mig", "1g.24gb=4,1g.24gb=1"],
        ["--mig", "large=2"],
        ["--mig", "1g.24gb=4", "--mps-slots", "2"],
        ["--mig", "1g.24gb=4", "--spec", "x.json"],
        ["--mps-thread-percentage", "25"],
        ["--mps-slots", "0"],
        ["--mps-slots", "four"],
    ],
)
def test_malformed_layout_flags_are_usage_errors_and_send_nothing(api, cli, layout):
    code, _, err = cli(
        "host", "register", "--instance-id", "i-0abc", "--instance-type", "g7e.2xlarge", *layout
    )
    assert code == 2
    assert api.requests == []
    assert err


def test_host_list_shows_each_hosts_slices(api, cli):
    # Given an admin's view of one host with a held slice
    held = dict(HOST["slices"][0], state="held", holder="alice", session_id="s-0123456789")
    host = {**HOST, "state": "ready", "slices": [held] + [dict(s, state="free") for s in HOST["slices"][1:]]}
    api.responses[("GET", "/v1/hosts")] = [host]
    # When they list hosts
    code, out, _ = cli("host", "list")
    # Then the host's summary and every slice with its holder are shown
    assert code == 0
    assert "4: 3 free, 1 held" in out
    assert "alice" in out
    assert "s-0123456789" in out
    assert out.count("g0-1g.24gb-") == 4


def test_host_list_json_is_the_api_array(api, cli):
    api.responses[("GET", "/v1/hosts")] = [HOST]
    code, out, _ = cli("host", "list", "--output", "json")
    assert code == 0
    assert json.loads(out) == [HOST]


def test_drain_help_says_it_is_refused_while_sessions_live_there(cli):
    # The API refuses a drain without --force while sessions live on the host (409
    # host_has_live_sessions); the help must not promise that it only stops placement
    for argv in (("host", "--help"), ("host", "drain", "--help")):
        _code, out, _ = cli(*argv)
        assert "refused while sessions live there" in " ".join(out.split())


def test_drain_sends_force_and_reason(api, cli):
    api.responses[("POST", "/v1/hosts/i-0abc/drain")] = {**HOST, "state": "draining"}
    code, out, _ = cli("host", "drain", "i-0abc", "--force", "--reason", "maintenance")
    assert code == 0
    assert api.requests[0][2] == {"force": True, "reason": "maintenance"}
    assert "draining" in out


def _ready(host):
    return {**host, "state": "ready", "slices": [{**s, "state": "free"} for s in host["slices"]]}


def test_register_wait_shows_progress_until_the_agent_applied_the_layout(api, cli, monkeypatch):
    # Given a host that the agent reports ready on the third look
    monkeypatch.setattr("time.sleep", lambda _s: None)
    api.responses[("POST", "/v1/hosts")] = HOST
    looks = iter([HOST, HOST, _ready(HOST)])
    api.responses[("GET", "/v1/hosts/i-0abc")] = lambda _body: next(looks)
    # When the admin registers with --wait, for a script
    code, out, err = cli(
        "--output",
        "json",
        "host",
        "register",
        "--instance-id",
        "i-0abc",
        "--instance-type",
        "g7e.2xlarge",
        "--mig",
        "1g.24gb=4",
        "--wait",
    )
    # Then stdout is the ready host alone, and the progress went to stderr
    assert code == 0
    assert json.loads(out)["state"] == "ready"
    assert "pending, slices 4: 4 pending" in err
    assert "ready, slices 4: 4 free" in err


def test_register_wait_is_done_only_once_the_ready_hosts_slices_are_free_too(api, cli, monkeypatch):
    # Given a host the report has made ready while its last slice is still being written
    monkeypatch.setattr("time.sleep", lambda _s: None)
    api.responses[("POST", "/v1/hosts")] = HOST
    half = _ready(HOST)
    half["slices"] = [*half["slices"][:-1], {**HOST["slices"][-1], "state": "pending"}]
    looks = iter([HOST, half, _ready(HOST)])
    api.responses[("GET", "/v1/hosts/i-0abc")] = lambda _body: next(looks)
    # When the admin registers with --wait
    code, out, err = cli(
        "host", "register", "--instance-id", "i-0abc", "--instance-type", "g7e.2xlarge", "--wait"
    )
    # Then "is ready" comes with every slice free, not with one still pending
    assert code == 0, err
    assert "ready, slices 4: 3 free, 1 pending" in err
    assert "4: 4 free" in out
    assert "pending" not in out


def test_register_wait_with_a_slice_that_never_becomes_free_stops_at_the_timeout_and_says_so(
    api, cli, monkeypatch
):
    # Given a ready host whose report left one slice pending, and a clock that moves 10s a look
    monkeypatch.setattr("time.sleep", lambda _s: None)
    ticks = iter(range(0, 100_000, 10))
    monkeypatch.setattr("time.monotonic", lambda: float(next(ticks)))
    api.responses[("POST", "/v1/hosts")] = HOST
    stuck = _ready(HOST)
    stuck["slices"] = [*stuck["slices"][:-1], {**HOST["slices"][-1], "state": "pending"}]
    api.responses[("GET", "/v1/hosts/i-0abc")] = lambda _body: stuck
    # When the admin registers with --wait and a 60s timeout
    code, out, err = cli(
        "host",
        "register",
        "--instance-id",
        "i-0abc",
        "--instance-type",
        "g7e.2xlarge",
        "--wait",
        "--timeout",
        "60s",
    )
    # Then the wait ends at the timeout (the host is ready and its free slices are placed on),
    # and it says the slice is still pending rather than that the layout was applied
    assert code == 0, err
    assert "applied the layout" not in out
    assert "i-0abc is ready, but 1 of its 4 slices is still pending after 60s" in out
    assert "g0-1g.24gb-3" in out


def test_register_wait_says_why_the_layout_failed(api, cli, monkeypatch):
    monkeypatch.setattr("time.sleep", lambda _s: None)
    api.responses[("POST", "/v1/hosts")] = HOST
    failed = {**HOST, "state": "failed", "state_reason": "GPU 0: 3 process(es) run on it"}
    api.responses[("GET", "/v1/hosts/i-0abc")] = failed
    code, _out, err = cli(
        "host",
        "register",
        "--instance-id",
        "i-0abc",
        "--instance-type",
        "g7e.2xlarge",
        "--wait",
    )
    assert code == 1
    assert "could not apply the layout on i-0abc: GPU 0: 3 process(es) run on it" in err


def test_register_wait_gives_up_after_its_timeout_with_what_to_check(api, cli, monkeypatch):
    clock = iter(range(0, 10_000, 30))
    monkeypatch.setattr("time.monotonic", lambda: next(clock))
    monkeypatch.setattr("time.sleep", lambda _s: None)
    api.responses[("POST", "/v1/hosts")] = HOST
    api.responses[("GET", "/v1/hosts/i-0abc")] = HOST
    code, _out, err = cli(
        "host",
        "register",
        "--instance-id",
        "i-0abc",
        "--instance-type",
        "g7e.2xlarge",
        "--wait",
        "--timeout",
        "2m",
    )
    assert code == 1
    assert "still pending after 120s" in err
    assert "calque:host=managed" in err

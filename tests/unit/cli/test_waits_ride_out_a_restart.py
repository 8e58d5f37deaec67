"""Every long wait of the CLI through a control plane restart (``kill -9`` of the local plane,
then ``calque local up``): the wait asks again and goes on, finding the plane anew; given up
on, it says in one line that what it waited for goes on and the command that follows it.
Any other refusal ends the wait at once. Against a recording fake of the API: no network."""

from __future__ import annotations

import json
from typing import Any

import pytest

from calque.cli import polling
from calque.cli.errors import ApiError, CliError, EndpointUnreachable
from tests.unit.cli_support import FakeApi, cli_runner, install_fake_api

pytestmark = pytest.mark.unit

CID = "c-0000000000000001"
IID = "i-0abc"
RID = "r-1111111111111111"


def _unreachable() -> EndpointUnreachable:
    return EndpointUnreachable("http://127.0.0.1:8787", "Could not connect to the endpoint URL")


def _down_then(*answers: Any, polls_down: int = 3) -> Any:
    """An answer for the fake: the plane down for ``polls_down`` polls, then ``answers`` in turn
    (the last one kept)."""
    left: list[Any] = [_unreachable()] * polls_down + list(answers)

    def answer(_body: Any) -> Any:
        got = left.pop(0) if len(left) > 1 else left[0]
        if isinstance(got, Exception):
            raise got
        return got

    return answer


@pytest.fixture
def api(monkeypatch):
    from calque.cli.context import Context

    monkeypatch.setattr("time.sleep", lambda _s: None)
    fake = install_fake_api(monkeypatch, FakeApi(), ["host", "fleet", "pool", "claim"])
    fake.found_anew = 0  # type: ignore[attr-defined]

    def reconnect(ctx: Any) -> FakeApi:
        fake.found_anew += 1  # type: ignore[attr-defined]
        return fake

    # the endpoint found from the running local plane: a restarted one is found anew
    monkeypatch.setattr(Context, "finds_local_plane", lambda ctx: True)
    monkeypatch.setattr(Context, "reconnect", reconnect, raising=False)
    return fake


@pytest.fixture
def cli(api, capsys):
    return cli_runner(capsys)


@pytest.fixture
def give_up_at_once(monkeypatch):
    monkeypatch.setattr(polling, "RECONNECT_S", 0.0)


def _last_line(err: str) -> str:
    return err.strip().splitlines()[-1]


# ---- pool submit --wait --------------------------------------------------------------------------

CLAIM = {"claim_id": CID, "pool": "textstats", "state": "running", "attempts": 1, "worker": "w-1"}


def _submit(api: FakeApi, cli: Any, tmp_path: Any, *flags: str) -> tuple[int, str, str]:
    items = tmp_path / "items.jsonl"
    items.write_text("1\n")
    api.responses[("POST", "/v1/pools/textstats/claims")] = {**CLAIM, "state": "queued"}
    return cli(*flags, "pool", "submit", "textstats", "--items", str(items), "--wait")


def test_pool_submit_wait_rides_out_a_plane_restart_and_prints_the_claim(api, cli, tmp_path):
    # Given a claim whose plane is down for three polls, then answers it succeeded
    api.responses[("GET", f"/v1/claims/{CID}")] = _down_then({**CLAIM, "state": "succeeded"})
    # When the member waits for it, Then the claim comes back, not "cannot reach"
    code, out, err = _submit(api, cli, tmp_path, "--output", "json")
    assert code == 0, err
    assert json.loads(out)["state"] == "succeeded"
    assert api.found_anew >= 1  # the plane was looked for on its new port


def test_pool_submit_wait_that_cannot_reach_the_plane_says_the_claim_goes_on(
    api, cli, tmp_path, give_up_at_once
):
    api.responses[("GET", f"/v1/claims/{CID}")] = _unreachable()
    code, _out, err = _submit(api, cli, tmp_path)
    assert code == 1
    said = _last_line(err)
    assert said.startswith("calque: error: cannot reach the control plane")
    assert f"claim {CID} goes on without the wait" in said
    assert f"`calque claim show {CID}`" in said
    assert f"`calque claim cancel {CID}`" in said


def test_pool_submit_wait_ends_at_once_on_any_other_refusal(api, cli, tmp_path):
    api.responses[("GET", f"/v1/claims/{CID}")] = ApiError(
        403, {"error": {"code": "forbidden", "message": "not yours", "details": {}}}
    )
    code, _out, err = _submit(api, cli, tmp_path)
    assert code == 1
    assert "not yours" in err
    assert "goes on" not in err
    assert [p for m, p, *_ in api.requests if m == "GET"] == [f"/v1/claims/{CID}"]


# ---- claim logs --follow -------------------------------------------------------------------------


def test_claim_logs_follow_rides_out_a_plane_restart_and_prints_the_rest(api, cli):
    # Given a running claim's first chunk, then the plane down for three polls, then the rest
    first = {"chunks": [{"stream": "stdout", "text": "one\n"}], "next": "1", "state": "running"}
    quiet = {"chunks": [], "next": "1", "state": "running"}
    rest = {
        "chunks": [{"stream": "stdout", "text": "two\n"}],
        "next": "2",
        "state": "succeeded",
        "ended": True,
    }
    pages = iter([first, quiet])
    after_restart = _down_then(rest)

    def logs(_body: Any) -> Any:
        page = next(pages, None)
        return page if page is not None else after_restart(_body)

    api.responses[("GET", f"/v1/claims/{CID}/logs")] = logs
    # When the member follows it, Then every line comes, not "cannot reach"
    code, out, err = cli("claim", "logs", CID, "--follow")
    assert code == 0, err
    assert out == "one\ntwo\n"


def test_claim_logs_follow_that_cannot_reach_the_plane_says_the_claim_goes_on(api, cli, give_up_at_once):
    # Given a running claim read once, then a plane that cannot be reached
    quiet = {"chunks": [], "state": "running"}
    answers = iter([quiet])

    def logs(_body: Any) -> Any:
        if next(answers, None) is None:
            raise _unreachable()
        return quiet

    api.responses[("GET", f"/v1/claims/{CID}/logs")] = logs
    code, _out, err = cli("claim", "logs", CID, "--follow")
    assert code == 1
    said = _last_line(err)
    assert said.startswith("calque: error: cannot reach the control plane")
    assert f"claim {CID} goes on without the wait" in said
    assert f"`calque claim logs {CID} --follow`" in said
    assert f"`calque claim cancel {CID}`" in said


def test_claim_logs_without_follow_is_no_wait_and_says_cannot_reach_at_once(api, cli):
    api.responses[("GET", f"/v1/claims/{CID}/logs")] = _unreachable()
    code, _out, err = cli("claim", "logs", CID)
    assert code == 1
    assert "goes on" not in err
    assert api.found_anew == 0
    assert len(api.requests) == 1


# ---- host register --wait ------------------------------------------------------------------------

HOST = {
    "instance_id": IID,
    "instance_type": "g7e.2xlarge",
    "state": "pending",
    "slices": [{"slice_id": "g0-1g.24gb-0", "backend": "mig", "state": "pending"}],
}
READY = {**HOST, "state": "ready", "slices": [{**HOST["slices"][0], "state": "free"}]}


def _register(cli: Any, *flags: str) -> tuple[int, str, str]:
    return cli(*flags, "host", "register", "--instance-id", IID, "--instance-type", "g7e.2xlarge", "--wait")


def test_host_register_wait_rides_out_a_plane_restart_and_prints_the_ready_host(api, cli):
    api.responses[("POST", "/v1/hosts")] = HOST
    api.responses[("GET", f"/v1/hosts/{IID}")] = _down_then(READY)
    code, out, err = _register(cli, "--output", "json")
    assert code == 0, err
    assert json.loads(out)["state"] == "ready"
    assert api.found_anew >= 1


def test_host_register_wait_that_cannot_reach_the_plane_says_the_layout_goes_on(api, cli, give_up_at_once):
    api.responses[("POST", "/v1/hosts")] = HOST
    api.responses[("GET", f"/v1/hosts/{IID}")] = _unreachable()
    code, _out, err = _register(cli)
    assert code == 1
    said = _last_line(err)
    assert said.startswith("calque: error: cannot reach the control plane")
    assert f"applying the layout on {IID} goes on without the wait" in said
    assert f"`calque host show {IID}`" in said


# ---- host acquire --wait -------------------------------------------------------------------------

ACQ = {"request_id": RID, "state": "registered", "instance_type": "g7e.2xlarge", "instance_id": IID}


def _acquire(cli: Any, *flags: str) -> tuple[int, str, str]:
    return cli(
        *flags, "host", "acquire", "--instance-type", "g7e.2xlarge",
        "--i-understand-this-spends-money", "--wait",
    )  # fmt: skip


def test_host_acquire_wait_rides_out_a_plane_restart_and_prints_the_ready_host(api, cli):
    api.responses[("POST", "/v1/hosts/acquire")] = {
        "acquisitions": [{**ACQ, "state": "queued"}],
        "budget": {},
    }
    api.responses[("GET", f"/v1/acquisitions/{RID}")] = _down_then({**ACQ, "state": "booting"}, ACQ)
    api.responses[("GET", f"/v1/hosts/{IID}")] = _down_then(READY)  # down again, for the layout
    code, out, err = _acquire(cli, "--output", "json")
    assert code == 0, err
    assert json.loads(out)["acquisitions"][0]["instance_id"] == IID
    assert api.found_anew >= 2


@pytest.mark.parametrize("down", ["acquisition", "host"])
def test_host_acquire_wait_that_cannot_reach_the_plane_says_the_acquisition_goes_on(
    api, cli, give_up_at_once, down
):
    # Given a plane that cannot be reached while the acquisition launches, or while its host
    # applies the layout
    api.responses[("POST", "/v1/hosts/acquire")] = {
        "acquisitions": [{**ACQ, "state": "queued"}],
        "budget": {},
    }
    api.responses[("GET", f"/v1/acquisitions/{RID}")] = _unreachable() if down == "acquisition" else ACQ
    api.responses[("GET", f"/v1/hosts/{IID}")] = _unreachable()
    code, _out, err = _acquire(cli)
    assert code == 1
    said = _last_line(err)
    assert said.startswith("calque: error: cannot reach the control plane")
    assert f"acquisition {RID} goes on without the wait" in said
    assert f"`calque host acquisitions {RID}`" in said


def test_host_acquire_wait_of_several_names_them_all_when_it_cannot_reach_the_plane(
    api, cli, give_up_at_once
):
    two = [{**ACQ, "request_id": "r-1", "state": "queued"}, {**ACQ, "request_id": "r-2", "state": "queued"}]
    api.responses[("POST", "/v1/hosts/acquire")] = {"acquisitions": two, "budget": {}}
    api.responses[("GET", "/v1/acquisitions/r-1")] = _unreachable()
    api.responses[("GET", "/v1/acquisitions/r-2")] = _unreachable()
    code, _out, err = cli(
        "host", "acquire", "--instance-type", "g7e.2xlarge", "--count", "2",
        "--i-understand-this-spends-money", "--wait",
    )  # fmt: skip
    assert code == 1
    said = _last_line(err)
    assert "acquisitions r-1, r-2 go on without the wait: follow them with" in said
    assert "`calque host acquisitions REQUEST_ID`" in said
    # one give-up for them all: the second is not waited on for another RECONNECT_S
    assert [p for m, p, *_ in api.requests if m == "GET"] == ["/v1/acquisitions/r-1"]


# ---- local demo ----------------------------------------------------------------------------------


class _DemoCtx:
    """What a tour needs of the context: a local plane found by itself, found anew."""

    json = False
    endpoint = "http://127.0.0.1:8787"
    state_dir_arg = None

    def __init__(self) -> None:
        self.found_anew = 0

    def finds_local_plane(self) -> bool:
        return True

    def reconnect(self) -> None:
        self.found_anew += 1
        self.endpoint = "http://127.0.0.1:9797"


def test_a_demo_wait_rides_out_a_plane_restart_with_clients_of_the_new_port(monkeypatch):
    from calque.cli.tour import Tour

    ctx = _DemoCtx()
    tour = Tour(ctx, 30, steps=1)
    made: list[str] = []
    monkeypatch.setattr(Tour, "client_of", lambda self, profile: made.append(self.ctx.endpoint) or FakeApi())
    # Given a check (kept client, as demo pools keeps its people's) the restart fails three times
    admin = tour.as_("admin")
    checks = _down_then({"state": "ready"})

    def ready() -> tuple[bool, str]:
        admin.request("GET", f"/v1/hosts/{IID}")
        host = checks(None)
        return host["state"] == "ready", f"host {host['state']}"

    # When the tour waits on it, Then it ends done, its later requests made on the new port
    assert tour.wait("the host agent's report", ready, interval_s=0) == "host ready"
    assert ctx.found_anew == 3
    assert made[-1] == "http://127.0.0.1:9797"


def test_a_demo_wait_that_cannot_reach_the_plane_says_what_goes_on_and_how_to_follow_it(
    monkeypatch, give_up_at_once
):
    from calque.cli.tour import Tour

    tour = Tour(_DemoCtx(), 30, steps=1)

    def down() -> tuple[bool, str]:
        raise _unreachable()

    with pytest.raises(CliError) as err:
        tour.wait("the host agent's report", down, follow=f"calque --profile admin host show {IID}")
    said = err.value.message
    assert said.startswith("cannot reach the control plane")
    assert "what the tour waited for (the host agent's report) goes on without the wait" in said
    assert f"`calque --profile admin host show {IID}`" in said

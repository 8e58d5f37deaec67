"""`calque host acquisitions [REQUEST_ID | --instance-id I]`: one acquisition, named one way."""

from __future__ import annotations

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


def test_an_empty_instance_id_is_asked_about_and_never_shows_another_acquisition(api, fleet_cli):
    # Given acquisitions exist, none of them for the (empty) instance asked about
    def answer(body):
        query = api.requests[-1][3]
        return [ACQ] if query is None else []

    api.responses[("GET", "/v1/acquisitions")] = answer

    # When an admin asks for the acquisition that launched ""
    code, out, err = fleet_cli("host", "acquisitions", "--instance-id", "")

    # Then the filter is sent as given and nothing is shown as that instance's acquisition
    assert api.requests == [("GET", "/v1/acquisitions", None, {"instance_id": ""})]
    assert (code, out) == (1, "")
    assert "no acquisition launched" in err

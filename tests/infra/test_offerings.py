"""`python -m infra.offerings`: where EC2 offers the fleet's types, read before a deploy."""

from __future__ import annotations

import boto3
import pytest
from botocore.stub import Stubber

from infra import offerings

pytestmark = pytest.mark.infra


def _stubbed_ec2(monkeypatch: pytest.MonkeyPatch) -> Stubber:
    client = boto3.client(
        "ec2", region_name="us-east-1", aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="x"
    )
    stubber = Stubber(client)
    monkeypatch.setattr(boto3, "client", lambda *a, **k: client)
    return stubber


def test_it_prints_the_context_value_synth_reads(monkeypatch, capsys) -> None:
    stubber = _stubbed_ec2(monkeypatch)
    stubber.add_response(
        "describe_instance_type_offerings",
        {
            "InstanceTypeOfferings": [
                {
                    "InstanceType": "g7e.2xlarge",
                    "LocationType": "availability-zone",
                    "Location": "us-east-1b",
                },
                {
                    "InstanceType": "g7e.2xlarge",
                    "LocationType": "availability-zone",
                    "Location": "us-east-1a",
                },
            ]
        },
    )
    with stubber:
        code = offerings.main(["--region", "us-east-1", "g7e.2xlarge"])
    out = capsys.readouterr().out
    assert code == 0
    assert out == """-c calque:fleet-az-offerings='{"g7e.2xlarge":["us-east-1a","us-east-1b"]}'\n"""


def test_an_ec2_refusal_is_one_line_on_stderr_not_a_traceback(monkeypatch, capsys) -> None:
    # Given credentials EC2 refuses (or none at all, or a region that does not exist)
    stubber = _stubbed_ec2(monkeypatch)
    stubber.add_client_error(
        "describe_instance_type_offerings", service_error_code="UnauthorizedOperation", service_message="nope"
    )
    with stubber:
        code = offerings.main(["--region", "us-east-1", "g7e.2xlarge"])
    captured = capsys.readouterr()
    # Then it says so in one line and exits 1, printing no context value
    assert code == 1
    assert captured.out == ""
    assert captured.err.startswith("error: cannot read EC2's instance type offerings in us-east-1: ")
    assert "UnauthorizedOperation" in captured.err
    assert len(captured.err.strip().splitlines()) == 1


def test_no_credentials_is_one_line_too(monkeypatch, tmp_path, capsys) -> None:
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_ENDPOINT_URL",
    ):
        monkeypatch.delenv(name, raising=False)
    for name in (
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    code = offerings.main(["--region", "us-east-1", "g7e.2xlarge"])
    captured = capsys.readouterr()
    assert code == 1
    assert "Unable to locate credentials" in captured.err

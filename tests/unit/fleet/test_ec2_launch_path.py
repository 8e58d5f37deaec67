"""The fleet's EC2 adapter as EC2 answers it (botocore's Stubber, EC2's own error codes):
one ClientToken per attempt, and the root volume on the device the AMI names."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber

from calque.fleet.aws import ROOT_VOLUME_GIB, Ec2Fleet, launch_token
from calque.fleet.ports import CapacityError, LaunchRefused, LaunchSpec

pytestmark = pytest.mark.unit

AMI = "ami-0123456789abcdef0"
RID = "r-0123456789abcdef"
TAGS = {"calque:host": "managed", "calque:request-id": RID}
# EC2's messages for these codes, as its API returns them.
NO_CAPACITY = (
    "We currently do not have sufficient g7e.2xlarge capacity in the Availability Zone you requested "
    "(us-east-1a). Our system will be working on provisioning additional capacity."
)
MISMATCH = "Arguments on this idempotent request are inconsistent with arguments used in previous request(s)."


def _spec(
    instance_type: str = "g7e.2xlarge", subnet: str = "subnet-0a", market: str = "on-demand"
) -> LaunchSpec:
    return LaunchSpec(RID, instance_type, market, subnet, 2.5 if market == "spot" else None, dict(TAGS))


def _ec2() -> Any:
    return boto3.client(
        "ec2", region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing"
    )


def _run_params(spec: LaunchSpec, *, root: str = "/dev/sda1") -> dict[str, Any]:
    """What a launch of ``spec`` must send, the token included."""
    params: dict[str, Any] = {
        "MinCount": 1,
        "MaxCount": 1,
        "ClientToken": launch_token(spec),
        "InstanceType": spec.instance_type,
        "ImageId": AMI,
        "BlockDeviceMappings": [
            {
                "DeviceName": root,
                "Ebs": {
                    "VolumeSize": ROOT_VOLUME_GIB,
                    "VolumeType": "gp3",
                    "Encrypted": True,
                    "DeleteOnTermination": True,
                },
            }
        ],
        "TagSpecifications": ANY,
        "LaunchTemplate": {"LaunchTemplateName": "calque-hosts", "Version": "$Default"},
        "SubnetId": spec.subnet_id,
    }
    if spec.market == "spot":
        params["InstanceMarketOptions"] = ANY
    return params


def _launched(instance_type: str, instance_id: str = "i-0aaaaaaaaaaaaaaa1") -> dict[str, Any]:
    return {
        "Instances": [
            {
                "InstanceId": instance_id,
                "InstanceType": instance_type,
                "State": {"Code": 0, "Name": "pending"},
                "LaunchTime": datetime(2026, 12, 2, 10, 0, tzinfo=UTC),
                "Placement": {"AvailabilityZone": "us-east-1a"},
            }
        ]
    }


def _image(root: str) -> dict[str, Any]:
    return {"Images": [{"ImageId": AMI, "RootDeviceName": root, "RootDeviceType": "ebs"}]}


def test_each_fallback_attempt_sends_its_own_token_and_a_retry_of_one_sends_the_same():
    # Given a request whose first type has no capacity in the first AZ
    ec2 = _ec2()
    fleet = Ec2Fleet(ec2, None, launch_template="calque-hosts", ami_id=AMI)
    first, fallback, spot = _spec(), _spec("g7e.4xlarge"), _spec(market="spot")
    other_az = _spec(subnet="subnet-0b")
    tokens = {launch_token(s) for s in (first, fallback, spot, other_az)}
    with Stubber(ec2) as stub:
        stub.add_response("describe_images", _image("/dev/sda1"), {"ImageIds": [AMI]})
        stub.add_client_error(
            "run_instances",
            "InsufficientInstanceCapacity",
            NO_CAPACITY,
            500,
            expected_params=_run_params(first),
        )
        # EC2 would answer IdempotentParameterMismatch to the fallback if it reused the token
        stub.add_response("run_instances", _launched("g7e.4xlarge"), _run_params(fallback))
        stub.add_response("run_instances", _launched("g7e.4xlarge"), _run_params(fallback))
        # When the sweep tries the first, then the fallback type, and the fallback is retried
        with pytest.raises(CapacityError):
            fleet.run_instance(first)
        launched = fleet.run_instance(fallback)
        again = fleet.run_instance(fallback)
        stub.assert_no_pending_responses()
    # Then every attempt has its own token, each names the request, and a retry reuses its own
    assert len(tokens) == 4
    assert all(t.startswith(RID) and len(t) <= 64 and t.isascii() for t in tokens)
    assert launched.instance_id == again.instance_id == "i-0aaaaaaaaaaaaaaa1"


def test_a_mismatch_on_one_attempts_token_finds_the_instance_it_started():
    # Given an attempt that launched, retried after the public AMI parameter moved on
    ec2 = _ec2()
    fleet = Ec2Fleet(ec2, None, launch_template="calque-hosts", ami_id=AMI)
    spec = _spec()
    with Stubber(ec2) as stub:
        stub.add_response("describe_images", _image("/dev/sda1"), {"ImageIds": [AMI]})
        stub.add_client_error(
            "run_instances", "IdempotentParameterMismatch", MISMATCH, 400, expected_params=_run_params(spec)
        )
        stub.add_response(
            "describe_instances",
            {"Reservations": [{"Instances": _launched("g7e.2xlarge", "i-0bbbbbbbbbbbbbbb2")["Instances"]}]},
            {
                "Filters": [
                    {"Name": "tag:calque:request-id", "Values": [RID]},
                    {"Name": "instance-state-name", "Values": ANY},
                ],
                "MaxResults": ANY,
            },
        )
        # When EC2 refuses the token's arguments
        found = fleet.run_instance(spec)
    # Then the instance the request already started is the answer, not a second launch
    assert found.instance_id == "i-0bbbbbbbbbbbbbbb2"


@pytest.mark.parametrize("root", ["/dev/xvda", "/dev/sda1"])
def test_the_encrypted_root_volume_goes_on_the_device_the_ami_names(root: str):
    # Given an AMI whose root device is `root` (Amazon Linux 2023: /dev/xvda; Ubuntu: /dev/sda1)
    ec2 = _ec2()
    fleet = Ec2Fleet(ec2, None, launch_template="calque-hosts", ami_id=AMI)
    with Stubber(ec2) as stub:
        stub.add_response("describe_images", _image(root), {"ImageIds": [AMI]})
        # Then the launch maps the encrypted gp3 root volume on that device, asked once per AMI
        stub.add_response("run_instances", _launched("g7e.2xlarge"), _run_params(_spec(), root=root))
        stub.add_response(
            "run_instances", _launched("g7e.4xlarge"), _run_params(_spec("g7e.4xlarge"), root=root)
        )
        fleet.run_instance(_spec())
        fleet.run_instance(_spec("g7e.4xlarge"))
        stub.assert_no_pending_responses()


def test_an_ami_ec2_does_not_know_is_a_refusal_that_names_it():
    ec2 = _ec2()
    fleet = Ec2Fleet(ec2, None, launch_template="calque-hosts", ami_id=AMI)
    with Stubber(ec2) as stub:
        stub.add_client_error(
            "describe_images",
            "InvalidAMIID.NotFound",
            f"The image id '[{AMI}]' does not exist",
            400,
            expected_params={"ImageIds": [AMI]},
        )
        with pytest.raises(LaunchRefused) as refused:
            fleet.run_instance(_spec())
    assert refused.value.code == "InvalidAMIID.NotFound"
    assert AMI in refused.value.message

"""Simulated hosts: a moto EC2 instance of a catalog instance type, plus the
instance's own credentials (signing as the host role, session = instance id) and
the path of its fake GPUs' state, which the host agent keeps between commands."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from calque import resources
from calque.local.state import StateDir


@dataclass(frozen=True)
class LaunchedHost:
    instance_id: str
    instance_type: str
    state_file: str
    principal_arn: str
    profile: str

    def as_json(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "instance_type": self.instance_type,
            "state": "running",
            "simulated": True,
            "profile": self.profile,
            "principal_arn": self.principal_arn,
            "state_file": self.state_file,
        }


_IMAGES: dict[str, str] = {}  # EC2 endpoint -> an image it knows (moto's images never change)


# An Amazon Linux 2 x86_64 image in moto's own list of Amazon's images.
_KNOWN_IMAGE = "amzn2-ami-hvm-2.0.20180810-x86_64-gp2"


def _image_id(ec2: Any) -> str:
    """An AMI moto knows (any: the simulated host never boots it). Asked once per endpoint,
    by the exact name of an image moto ships (a hundredth of a second), then for Amazon Linux 2
    on x86_64 (some 600 images: seconds), and the whole list (some 1,300) only if moto knows
    none of those."""
    endpoint = str(ec2.meta.endpoint_url)
    if endpoint not in _IMAGES:
        exact = [{"Name": "name", "Values": [_KNOWN_IMAGE]}]
        linux = [{"Name": "architecture", "Values": ["x86_64"]}, {"Name": "name", "Values": ["amzn2-ami-*"]}]
        images = (
            ec2.describe_images(Owners=["amazon"], Filters=exact).get("Images")
            or ec2.describe_images(Owners=["amazon"], Filters=linux).get("Images")
            or ec2.describe_images(Owners=["amazon"]).get("Images")
            or ec2.describe_images().get("Images")
            or []
        )
        fitting = [
            i for i in images if "Windows" not in (i.get("Name") or "") and i.get("Architecture") == "x86_64"
        ]
        _IMAGES[endpoint] = str((fitting or images)[0]["ImageId"])
    return _IMAGES[endpoint]


def launch(
    state: StateDir, ec2: Any, *, instance_type: str, host_role: str, pool: str | None = None
) -> LaunchedHost:
    """Start a running moto instance of ``instance_type`` and register its simulated host;
    ``pool``: the warm pool it is launched for, whose queue and objects alone its role reaches
    (calque/local/host_scope.py).

    The instance type must be in the GPU catalog (InvalidInput/NotFound otherwise)."""
    from calque import catalog

    catalog.instance_type(instance_type)
    resp = ec2.run_instances(
        ImageId=_image_id(ec2),
        InstanceType=instance_type,
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[
            {
                "ResourceType": "instance",
                "Tags": [
                    {"Key": resources.HOST_TAG_KEY, "Value": resources.HOST_TAG_VALUE},
                    {"Key": "calque:simulated", "Value": "true"},
                    {"Key": "Name", "Value": f"calque-local-{instance_type}"},
                    *([{"Key": resources.FLEET_TAG_POOL, "Value": pool}] if pool else []),
                ],
            }
        ],
    )
    instance_id = resp["Instances"][0]["InstanceId"]
    principal = state.add_instance(instance_id, instance_type, host_role, pool=pool)
    return LaunchedHost(
        instance_id=instance_id,
        instance_type=instance_type,
        state_file=str(state.host_state_file(instance_id)),
        principal_arn=principal.arn,
        profile=principal.profile,
    )

"""The simulated hosts' AMI: moto's list of Amazon's images answers an exact name at once and a
wildcard in seconds, so the local plane asks for one image it knows moto ships."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def test_the_image_the_plane_asks_for_by_name_is_one_moto_ships() -> None:
    import boto3
    from moto import mock_aws

    from calque.local import hosts

    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        found = ec2.describe_images(
            Owners=["amazon"], Filters=[{"Name": "name", "Values": [hosts._KNOWN_IMAGE]}]
        )
        images = found["Images"]
        # Then the fast path finds it: one x86_64 Linux image (else launches fall back to a
        # wildcard query of some 600 images, seconds each time a plane starts)
        assert [i["Architecture"] for i in images] == ["x86_64"]
        assert "Windows" not in images[0]["Name"]

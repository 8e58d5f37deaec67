"""Record where EC2 offers the fleet's instance types, for synth to choose the fleet's AZs.

    python -m infra.offerings --region us-east-1 g7e.2xlarge p5.48xlarge

prints the value of ``-c calque:fleet-az-offerings=...`` (DescribeInstanceTypeOfferings by
Availability Zone, read with the caller's own credentials). Synthesis itself never calls
AWS: it reads what this wrote, and refuses a type offered in none of the fleet's AZs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from infra import constants


def offerings(ec2: Any, instance_types: Sequence[str]) -> dict[str, list[str]]:
    """Instance type -> the AZs of the client's region that offer it (empty: none)."""
    found: dict[str, set[str]] = {t: set() for t in instance_types}
    pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
        LocationType="availability-zone",
        Filters=[{"Name": "instance-type", "Values": list(instance_types)}],
    )
    for page in pages:
        for offer in page.get("InstanceTypeOfferings", []):
            found.setdefault(offer["InstanceType"], set()).add(offer["Location"])
    return {t: sorted(azs) for t, azs in sorted(found.items())}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.offerings", description=__doc__.split("\n\n")[0])
    parser.add_argument("--region", required=True)
    parser.add_argument("instance_types", nargs="+", metavar="TYPE")
    args = parser.parse_args(argv)
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        found = offerings(boto3.client("ec2", region_name=args.region), args.instance_types)
    except (BotoCoreError, ClientError) as exc:
        # no credentials, a region that does not exist, access denied: one line, no traceback
        print(f"error: cannot read EC2's instance type offerings in {args.region}: {exc}", file=sys.stderr)
        return 1
    missing = [t for t, azs in found.items() if not azs]
    print(f"-c {constants.CONTEXT_FLEET_AZ_OFFERINGS}='{json.dumps(found, separators=(',', ':'))}'")
    if missing:
        print(f"not offered in {args.region}: {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

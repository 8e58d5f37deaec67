"""The fleet's boto3 adapters: EC2 (with SSM for agent status) and the acquire queue (the
EventBridge adapter is calque.events, shared with tenancy). The only module of the fleet
that knows botocore's error shapes."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError

# The bus adapter is shared with tenancy (calque.events); named here too for existing callers.
from calque.events import EVENT_SOURCE as EVENT_SOURCE
from calque.events import EventBridgePublisher as EventBridgePublisher
from calque.fleet.ports import CapacityError, Instance, LaunchRefused, LaunchSpec, SpotPrice

log = logging.getLogger("calque.fleet")

# EC2 errors that mean "not here, not now": another AZ, type or market may still work.
CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientFreeAddressesInSubnet",
        "SpotMaxPriceTooLow",
        "MaxSpotInstanceCountExceeded",
        "Unsupported",  # the type is not offered in this AZ
    }
)
# Throttling and service trouble: let the message come back and try again later.
TRANSIENT_CODES = frozenset(
    {
        "RequestLimitExceeded",
        "InternalError",
        "ServiceUnavailable",
        "Unavailable",
        "InsufficientAddressCapacity",
    }
)
LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]
# DescribeInstances' answers for an id EC2 does not know (in this account and region).
UNKNOWN_INSTANCE_CODES = frozenset({"InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"})

# AWS's public SSM parameters for the Deep Learning Base OSS Nvidia Driver AMIs, per GPU
# family (Blackwell needs the newer driver of the Ubuntu 24.04 image). A deployment may
# override any of them, or name one AMI for all.
DEFAULT_AMI_PARAMETERS: dict[str, str] = {
    "turing": "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id",
    "ampere": "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id",
    "ada": "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id",
    "hopper": "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id",
    "blackwell": "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id",
}


# Every instance's root volume: encrypted gp3 of this size, on the device its AMI names.
ROOT_VOLUME_GIB = 200


def launch_token(spec: LaunchSpec) -> str:
    """EC2's ClientToken for one attempt of a request: the request id and a digest of what
    this attempt asks for (type, market, subnet, max price). A retry of the same attempt
    sends the same token, so EC2 answers with the instance it already started; another
    attempt of the request (another type, subnet or market) sends its own, where one token
    for all would be refused with IdempotentParameterMismatch. At most 64 ASCII characters."""
    price = "" if spec.spot_max_price is None else f"{spec.spot_max_price:.4f}"
    what = "|".join((spec.instance_type, spec.market, spec.subnet_id or "", price))
    return f"{spec.request_id[:40]}-{hashlib.sha256(what.encode()).hexdigest()[:16]}"


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _message(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Message", "")) or str(exc)


# The spot products a Linux launch is priced under (the VPC name is EC2-Classic's legacy).
SPOT_PRODUCTS = ("Linux/UNIX", "Linux/UNIX (Amazon VPC)")
# The product a launched Linux instance's price changes are read under, and how they are paged
# (EC2 allows 5 to 1000 a page; a refresh reads hours, where prices change a few times a day).
SPOT_HISTORY_PRODUCT = "Linux/UNIX"
HISTORY_PAGE = 1000
HISTORY_PAGES = 20


def _when(value: Any) -> datetime:
    """A price's Timestamp (boto3 parses it to a datetime); anything else sorts first."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return datetime.min.replace(tzinfo=UTC)


def _instance(raw: dict[str, Any]) -> Instance:
    launched = raw.get("LaunchTime") or datetime.now(UTC)
    if isinstance(launched, str):
        launched = datetime.fromisoformat(launched.replace("Z", "+00:00"))
    return Instance(
        instance_id=raw["InstanceId"],
        instance_type=raw.get("InstanceType", ""),
        state=raw.get("State", {}).get("Name", "pending"),
        launched_at=launched.astimezone(UTC),
        tags={t["Key"]: t["Value"] for t in raw.get("Tags") or []},
        availability_zone=(raw.get("Placement") or {}).get("AvailabilityZone"),
        market="spot" if raw.get("InstanceLifecycle") == "spot" else "on-demand",
    )


class Ec2Fleet:
    def __init__(
        self,
        ec2: Any,
        ssm: Any,
        *,
        launch_template: str | None,
        ami_id: str | None = None,
        ami_parameters: dict[str, str] | None = None,
        page_size: int = 500,
        launch_client: Any = None,
    ) -> None:
        self.ec2 = ec2
        # RunInstances goes through a client that does not retry: a capacity error moves on.
        self.launch_client = launch_client or ec2
        self.ssm = ssm
        self.launch_template = launch_template
        self.ami_id = ami_id
        self.ami_parameters = {**DEFAULT_AMI_PARAMETERS, **(ami_parameters or {})}
        self.page_size = page_size
        self._amis: dict[str, str] = {}
        self._root_devices: dict[str, str] = {}

    def _image(self, instance_type: str) -> str:
        if self.ami_id:
            return self.ami_id
        from calque import catalog

        family = catalog.instance_type(instance_type).card.family
        name = self.ami_parameters[family]
        if name not in self._amis:
            self._amis[name] = self.ssm.get_parameter(Name=name)["Parameter"]["Value"]
        return self._amis[name]

    def _root_device(self, image_id: str) -> str:
        """The AMI's own root device (``/dev/sda1`` on Ubuntu, ``/dev/xvda`` on Amazon Linux
        2023): a mapping under any other name would add a second volume and leave the root
        one as the AMI has it, unencrypted."""
        if image_id not in self._root_devices:
            try:
                images = self.ec2.describe_images(ImageIds=[image_id]).get("Images") or []
            except ClientError as exc:
                if _code(exc).startswith("InvalidAMIID"):
                    raise LaunchRefused(_code(exc), _message(exc)) from None
                raise
            root = next((i.get("RootDeviceName") for i in images if i.get("ImageId") == image_id), None)
            if not root:
                raise LaunchRefused(
                    "InvalidAMIID.NotFound", f"image {image_id} is not visible to this account"
                )
            self._root_devices[image_id] = str(root)
        return self._root_devices[image_id]

    def run_instance(self, spec: LaunchSpec) -> Instance:
        tags = [{"Key": k, "Value": v} for k, v in sorted(spec.tags.items())]
        image = self._image(spec.instance_type)
        kwargs: dict[str, Any] = {
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": launch_token(spec),
            "InstanceType": spec.instance_type,
            "ImageId": image,
            "BlockDeviceMappings": [
                {
                    "DeviceName": self._root_device(image),
                    "Ebs": {
                        "VolumeSize": ROOT_VOLUME_GIB,
                        "VolumeType": "gp3",
                        "Encrypted": True,
                        "DeleteOnTermination": True,
                    },
                }
            ],
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": tags},
                {"ResourceType": "volume", "Tags": tags},
            ],
        }
        if self.launch_template:
            kwargs["LaunchTemplate"] = {"LaunchTemplateName": self.launch_template, "Version": "$Default"}
        if spec.subnet_id:
            kwargs["SubnetId"] = spec.subnet_id
        if spec.market == "spot":
            options: dict[str, Any] = {
                "SpotInstanceType": "one-time",
                "InstanceInterruptionBehavior": "terminate",
            }
            if spec.spot_max_price is not None:
                options["MaxPrice"] = f"{spec.spot_max_price:.4f}"
            kwargs["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": options}
        try:
            out = self.launch_client.run_instances(**kwargs)
        except ClientError as exc:
            code = _code(exc)
            if code in CAPACITY_CODES:
                raise CapacityError(code, _message(exc)) from None
            if code == "IdempotentParameterMismatch":
                # This attempt's token came before with other arguments (the AMI the public
                # parameter names changed between retries): if it launched, that is the answer.
                found = self.find_by_request(spec.request_id)
                if found is not None:
                    return found
            if (
                code in TRANSIENT_CODES
                or int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)) >= 500
            ):
                raise
            raise LaunchRefused(code or "error", _message(exc)) from None
        return _instance(out["Instances"][0])

    def spot_price(self, instance_type: str, availability_zone: str) -> float | None:
        """EC2's latest Linux/UNIX spot price for the type in the AZ: DescribeSpotPriceHistory
        from now (EC2 answers the price in effect then, and any later change)."""
        try:
            out = self.ec2.describe_spot_price_history(
                InstanceTypes=[instance_type],
                ProductDescriptions=list(SPOT_PRODUCTS),
                AvailabilityZone=availability_zone,
                StartTime=datetime.now(UTC),
                MaxResults=20,
            )
        except ClientError as exc:
            log.warning("DescribeSpotPriceHistory %s %s: %s", instance_type, availability_zone, _code(exc))
            return None
        found = [
            p
            for p in out.get("SpotPriceHistory") or []
            if p.get("InstanceType") == instance_type
            and p.get("AvailabilityZone") == availability_zone
            and p.get("ProductDescription") in SPOT_PRODUCTS
            and p.get("SpotPrice")
        ]
        if not found:
            return None
        latest = max(found, key=lambda p: _when(p.get("Timestamp")))
        try:
            return float(latest["SpotPrice"])
        except ValueError:
            return None

    def spot_price_history(
        self, instance_type: str, availability_zone: str, start: datetime, end: datetime
    ) -> list[SpotPrice]:
        """Every Linux/UNIX price change over [start, end], oldest first: DescribeSpotPriceHistory
        with StartTime/EndTime answers the changes inside it and the one in effect at StartTime
        (newest first, NextToken until it is empty). An error (ClientError: throttled, not
        allowed) propagates: the fleet keeps the rates it has and reads again next time."""
        kwargs: dict[str, Any] = {
            "InstanceTypes": [instance_type],
            "ProductDescriptions": [SPOT_HISTORY_PRODUCT],
            "AvailabilityZone": availability_zone,
            "StartTime": start,
            "EndTime": end,
            "MaxResults": HISTORY_PAGE,
        }
        found: dict[datetime, float] = {}
        for _ in range(HISTORY_PAGES):
            out = self.ec2.describe_spot_price_history(**kwargs)
            for p in out.get("SpotPriceHistory") or []:
                if (
                    p.get("InstanceType") != instance_type
                    or p.get("AvailabilityZone") != availability_zone
                    or p.get("ProductDescription") != SPOT_HISTORY_PRODUCT
                    or not isinstance(p.get("Timestamp"), datetime)
                ):
                    continue
                try:
                    found[_when(p["Timestamp"])] = float(p["SpotPrice"])
                except (KeyError, TypeError, ValueError):
                    continue
            token = out.get("NextToken")
            if not token:
                break
            kwargs["NextToken"] = token
        else:
            raise RuntimeError(
                f"DescribeSpotPriceHistory {instance_type} {availability_zone}: more than "
                f"{HISTORY_PAGES} pages since {start:%Y-%m-%dT%H:%M:%SZ}"
            )
        return [SpotPrice(at=at, usd_per_hour=price) for at, price in sorted(found.items())]

    def terminate(self, instance_ids: Sequence[str]) -> None:
        ids = list(dict.fromkeys(instance_ids))
        for start in range(0, len(ids), 1000):
            chunk = ids[start : start + 1000]
            try:
                self.ec2.terminate_instances(InstanceIds=chunk)
            except ClientError as exc:
                if _code(exc) != "InvalidInstanceID.NotFound":
                    raise
                for iid in chunk:  # one unknown id fails the whole call: send the rest alone
                    try:
                        self.ec2.terminate_instances(InstanceIds=[iid])
                    except ClientError as one:
                        if _code(one) != "InvalidInstanceID.NotFound":
                            raise

    def _describe(self, filters: list[dict[str, Any]]) -> Iterator[Instance]:
        kwargs: dict[str, Any] = {"Filters": filters, "MaxResults": self.page_size}
        while True:
            page = self.ec2.describe_instances(**kwargs)
            for reservation in page.get("Reservations", []):
                for raw in reservation.get("Instances", []):
                    yield _instance(raw)
            token = page.get("NextToken")
            if not token:
                return
            kwargs["NextToken"] = token

    def managed_instances(self) -> Iterator[Instance]:
        return self._describe(
            [
                {"Name": "tag:calque:host", "Values": ["managed"]},
                {"Name": "instance-state-name", "Values": LIVE_STATES},
            ]
        )

    def find_by_request(self, request_id: str) -> Instance | None:
        found = self._describe(
            [
                {"Name": "tag:calque:request-id", "Values": [request_id]},
                {"Name": "instance-state-name", "Values": LIVE_STATES},
            ]
        )
        return next(iter(found), None)

    def existing(self, instance_ids: Sequence[str]) -> set[str]:
        ids = list(dict.fromkeys(instance_ids))
        out: set[str] = set()
        for start in range(0, len(ids), 200):
            chunk = ids[start : start + 200]
            out |= {
                i.instance_id
                for i in self._describe(
                    [
                        {"Name": "instance-id", "Values": chunk},
                        {"Name": "instance-state-name", "Values": LIVE_STATES},
                    ]
                )
            }
        return out

    def agent_online(self, instance_ids: Sequence[str]) -> set[str]:
        ids = list(dict.fromkeys(instance_ids))
        out: set[str] = set()
        for start in range(0, len(ids), 50):
            kwargs: dict[str, Any] = {"Filters": [{"Key": "InstanceIds", "Values": ids[start : start + 50]}]}
            while True:
                page = self.ssm.describe_instance_information(**kwargs)
                out |= {
                    i["InstanceId"]
                    for i in page.get("InstanceInformationList", [])
                    if i.get("PingStatus") == "Online"
                }
                if not page.get("NextToken"):
                    break
                kwargs["NextToken"] = page["NextToken"]
        return out


class Ec2Instances:
    """EC2's view of one instance, by id: what an admin's registration is checked against
    (calque.tenancy.lifecycle.Instances), and its reboot when the host agent says only a
    reboot lets a GPU's MIG mode change apply. The API function's only EC2 calls."""

    def __init__(self, ec2: Any) -> None:
        self.ec2 = ec2

    @property
    def region(self) -> str:
        return str(self.ec2.meta.region_name)

    def describe(self, instance_id: str) -> Instance | None:
        try:
            page = self.ec2.describe_instances(InstanceIds=[instance_id])
        except ClientError as exc:
            if _code(exc) in UNKNOWN_INSTANCE_CODES:
                return None
            # Throttled, EC2 unavailable: raised as it is, so the API answers 503 (its handler
            # maps transient AWS errors) instead of registering an instance nobody checked.
            raise
        found = (_instance(raw) for r in page.get("Reservations", []) for raw in r.get("Instances", []))
        return next((i for i in found if i.instance_id == instance_id), None)

    def reboot(self, instance_id: str) -> None:
        """RebootInstances: EC2 shuts the instance down cleanly (a hard reboot after a few
        minutes if it does not) and starts it again; its id, volumes and addresses stay."""
        self.ec2.reboot_instances(InstanceIds=[instance_id])


class SqsAcquireQueue:
    def __init__(self, client: Any, queue_url: str) -> None:
        self.client = client
        self.queue_url = queue_url

    def send(self, request_ids: Sequence[str]) -> None:
        self._send(request_ids, "launch")

    def send_terminate(self, request_ids: Sequence[str]) -> None:
        self._send(request_ids, "terminate")

    def _send(self, request_ids: Sequence[str], action: str) -> None:
        from calque.contracts.fleet import AcquireMessage

        ids = list(request_ids)
        for start in range(0, len(ids), 10):
            entries = [
                {"Id": str(n), "MessageBody": AcquireMessage(request_id=rid, action=action).model_dump_json()}
                for n, rid in enumerate(ids[start : start + 10])
            ]
            out = self.client.send_message_batch(QueueUrl=self.queue_url, Entries=entries)
            if out.get("Failed"):
                raise RuntimeError(
                    f"the acquire queue refused {len(out['Failed'])} message(s): {out['Failed']}"
                )

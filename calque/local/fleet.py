"""The fleet's stand-ins on the local plane: EC2 as the acquirer meets it, and EC2's events.

A WSGI interceptor in front of moto (see calque/local/moto_server.py) that:

- honours RunInstances' ClientToken as EC2 does (the same token and parameters answer
  with the same instance; other parameters after a success: IdempotentParameterMismatch);
- gives every instance the fleet launches (tagged ``calque:request-id``) its simulated
  host, as ``calque local launch`` does, before EC2's answer returns;
- answers SSM DescribeInstanceInformation for the plane's simulated hosts (moto has none);
- synthesizes the "EC2 Instance State-change Notification" events EventBridge would
  deliver to the fleet_events function (pending -> running; shutting-down -> terminated);
- answers DescribeSpotPriceHistory as EC2 documents it (moto answers one made-up price for
  every type): the local plane has no spot market, so its spot price is
  LOCAL_SPOT_PRICE_OF_ON_DEMAND of the catalog's on-demand rate, for every type, in every AZ,
  since the plane started, changed only by ``spot-price`` injections (each from its time);
  a StartTime/EndTime read answers the changes inside it and the one in effect at StartTime,
  newest first, MaxResults a page with NextToken;
- injects faults: capacity errors per instance type (and AZ), an acquirer that dies after
  RunInstances and before recording, a spot interruption warning (EC2 then terminates the
  instance two minutes later, times the plane's schedule scale), a spot price change for a
  type in an AZ (``clear`` takes the changes back: the table's price again from then, the
  history before it kept).
"""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import os
import queue
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from calque import resources
from calque.local.ec2_answers import ec2_error as _error
from calque.local.ec2_answers import spot_bid, spot_max_price_too_low, spot_price_history
from calque.local.state import StateDir

log = logging.getLogger("calque.local")

_INSTANCE_ID = re.compile(r"<instanceId>(i-[0-9a-z]+)</instanceId>")
SPOT_NOTICE_S = 120
SPOT_NOTICES_FILE = "spot_notices.json"  # under the state's aws/: notices whose termination is due
# The local plane's spot price, as a fraction of the catalog's on-demand rate (a fixed
# table entry, not AWS's market: real spot prices vary by type, AZ and hour).
LOCAL_SPOT_PRICE_OF_ON_DEMAND = 0.35
# How often the local plane's reconciler reads a spot instance's price changes (a deployment
# reads them hourly: CALQUE_FLEET_SPOT_REFRESH_S); every run here, so a change shows soon.
LOCAL_SPOT_REFRESH_S = 1
SPOT_REFRESH_ENV = "CALQUE_FLEET_SPOT_REFRESH_S"


@dataclass
class CapacityFault:
    instance_type: str
    az: str | None
    times: int | None  # None: until cleared

    def as_json(self) -> dict[str, Any]:
        return {"instance_type": self.instance_type, "az": self.az, "times": self.times}


def ec2_event(detail_type: str, detail: dict[str, Any], *, account: str, region: str) -> dict[str, Any]:
    """An aws.ec2 event as EventBridge delivers it to a rule's target."""
    iid = detail.get("instance-id")
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": detail_type,
        "source": "aws.ec2",
        "account": account,
        "time": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region,
        "resources": [f"arn:aws:ec2:{region}:{account}:instance/{iid}"] if iid else [],
        "detail": detail,
    }


class FleetSimulator:
    def __init__(
        self,
        state: StateDir,
        *,
        account: str,
        region: str,
        host_role: str,
        deliver: Callable[[dict[str, Any]], Any],
        schedule_scale: float = 1.0,
        event_delay_s: float = 0.5,
    ) -> None:
        self.state = state
        self.account = account
        self.region = region
        self.host_role = host_role
        self.deliver = deliver
        self.schedule_scale = schedule_scale
        self.event_delay_s = event_delay_s
        self.ec2: Any = None  # a client on the plane's moto server, set once it runs
        self._lock = threading.Lock()
        self.capacity: list[CapacityFault] = []
        self.crashes = 0
        self.began = dt.datetime.now(dt.UTC)
        # (instance_type, az) -> injected spot price changes, oldest first: (from, $/h)
        self.spot_changes: dict[tuple[str, str], list[tuple[dt.datetime, float]]] = {}
        # ... and those ``clear`` took back, each followed by the table's price again from the
        # clear: EC2's history never rewrites the past, so neither does the plane's
        self.spot_retired: dict[tuple[str, str], list[tuple[dt.datetime, float]]] = {}
        # a running spot instance's (type, AZ, max price): interrupted once an injected price
        # passes it (its max price when launched with one, else the on-demand rate, as EC2's)
        self.spot_bids: dict[str, tuple[str, str, float]] = {}
        self._tokens: dict[str, tuple[str, bytes]] = {}
        self._terminated: set[str] = set()
        self._events: queue.Queue[tuple[float, dict[str, Any]] | None] = queue.Queue()
        self._timers: list[threading.Timer] = []
        self.delivered = 0
        self._thread = threading.Thread(target=self._deliver_loop, name="ec2-events", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        for t in self._timers:
            t.cancel()
        self._events.put(None)
        self._thread.join(timeout=10)

    # ---- the WSGI interceptor ----------------------------------------------------------------------

    def intercept(self, environ: dict[str, Any], call: Callable[[dict[str, Any]], Any]) -> Any:
        """(status, headers, body) when this layer answers or wraps the call; None: pass through."""
        auth = environ.get("HTTP_AUTHORIZATION", "")
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        if target == "AmazonSSM.DescribeInstanceInformation":
            return self._instance_information(self._read(environ))
        if "/ec2/aws4_request" not in auth:
            return None
        raw = self._read(environ)
        params = dict(parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True))
        action = params.get("Action")
        if action == "RunInstances":
            return self._run_instances(environ, params, call)
        if action == "DescribeSpotPriceHistory":
            return spot_price_history(params, self._spot_prices)
        if action == "TerminateInstances":
            status, headers, body = call(environ)
            if status.startswith("200"):
                for iid in _INSTANCE_ID.findall(body.decode("utf-8", "replace")):
                    if iid not in self._terminated:
                        from calque.local.pool_hosts import stop_instance_workers

                        # its pool workers stop with it (SIGTERM: each finishes a claim in hand)
                        stop_instance_workers(self.state, iid)
                        self._terminated.add(iid)
                        with self._lock:
                            self.spot_bids.pop(iid, None)
                        self._state_change(iid, "shutting-down", 0.0)
                        self._state_change(iid, "terminated", self.event_delay_s)
            return status, headers, body
        return None

    @staticmethod
    def _read(environ: dict[str, Any]) -> bytes:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        raw = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(raw)
        return bytes(raw)

    def _az_of(self, params: dict[str, str]) -> str | None:
        if params.get("Placement.AvailabilityZone"):
            return params["Placement.AvailabilityZone"]
        subnet = params.get("SubnetId")
        if not subnet or self.ec2 is None:
            return None
        found = self.ec2.describe_subnets(SubnetIds=[subnet]).get("Subnets") or []
        return found[0]["AvailabilityZone"] if found else None

    def _run_instances(
        self, environ: dict[str, Any], params: dict[str, str], call: Callable[..., Any]
    ) -> Any:
        token = params.get("ClientToken")
        key = json.dumps({k: v for k, v in sorted(params.items()) if k != "ClientToken"})
        itype = params.get("InstanceType", "")
        with self._lock:
            if token and token in self._tokens:
                seen_key, body = self._tokens[token]
                if seen_key != key:
                    return _error(
                        "400 Bad Request",
                        "IdempotentParameterMismatch",
                        "The client token has been used with different parameters.",
                    )
                return "200 OK", [("Content-Type", "text/xml"), ("Content-Length", str(len(body)))], body
        az = self._az_of(params)
        with self._lock:
            for fault in self.capacity:
                if fault.instance_type == itype and fault.az in (None, az) and fault.times != 0:
                    if fault.times is not None:
                        fault.times -= 1
                    return _error(
                        "500 Internal Server Error",
                        "InsufficientInstanceCapacity",
                        f"We currently do not have sufficient {itype} capacity in the Availability Zone you "
                        f"requested ({az or 'any'}).",
                    )
        too_low = spot_max_price_too_low(params, self._spot_prices(itype, az) if az else [])
        if too_low is not None:
            return too_low
        status, headers, body = call(environ)
        if not status.startswith("200"):
            return status, headers, body
        ids = _INSTANCE_ID.findall(body.decode("utf-8", "replace"))
        fleet_launch = any(v == resources.FLEET_TAG_REQUEST for k, v in params.items() if k.endswith(".Key"))
        if fleet_launch:
            # a pool's instance (the fleet tags it with its pool): its role reaches that pool's
            # queue and objects alone (calque/local/host_scope.py), as `calque local launch --pool`
            pool = _tag(params, resources.FLEET_TAG_POOL)
            for iid in ids:
                self.state.add_instance(iid, itype, self.host_role, pool=pool)
        bid = spot_bid(params)
        for iid in ids:
            self._state_change(iid, "pending", 0.0)
            self._state_change(iid, "running", self.event_delay_s)
            if bid is not None and az is not None:
                with self._lock:
                    self.spot_bids[iid] = (itype, az, bid)
        with self._lock:
            if token:
                self._tokens[token] = (key, body)
            if fleet_launch and self.crashes > 0:
                self.crashes -= 1
                log.warning("injected: the acquirer dies after RunInstances launched %s", ids)
                return _error("500 Internal Server Error", "InternalError", "injected crash after launch")
        return status, headers, body

    def _spot_prices(self, itype: str, az: str) -> list[tuple[dt.datetime, float]]:
        """Every price of the type in the AZ, oldest first: the table's since the plane
        started, then the injected changes."""
        from calque import catalog
        from calque.errors import InvalidInput

        try:
            on_demand = catalog.instance_type(itype).hourly_usd
        except InvalidInput:
            return []
        with self._lock:
            changes = [*self.spot_retired.get((itype, az), []), *self.spot_changes.get((itype, az), [])]
        return [(self.began, self._table_price(on_demand)), *changes]

    @staticmethod
    def _table_price(on_demand: float) -> float:
        return round(on_demand * LOCAL_SPOT_PRICE_OF_ON_DEMAND, 6)

    def _instance_information(self, raw: bytes) -> Any:
        req = json.loads(raw or b"{}")
        wanted: set[str] | None = None
        for f in (req.get("Filters") or []) + (req.get("InstanceInformationFilterList") or []):
            if f.get("Key") in ("InstanceIds", "InstanceIds".lower()) or f.get("key") == "InstanceIds":
                wanted = set(f.get("Values") or f.get("valueSet") or [])
        now = dt.datetime.now(dt.UTC).timestamp()
        items = [
            {
                "InstanceId": p.profile,
                "PingStatus": "Online",
                "LastPingDateTime": now,
                "AgentVersion": "3.3.0.0",
                "IsLatestVersion": True,
                "PlatformType": "Linux",
                "ResourceType": "EC2Instance",
            }
            for p in self.state.instances()
            if p.profile not in self._terminated and (wanted is None or p.profile in wanted)
        ]
        body = json.dumps({"InstanceInformationList": items}).encode()
        return (
            "200 OK",
            [("Content-Type", "application/x-amz-json-1.1"), ("Content-Length", str(len(body)))],
            body,
        )

    # ---- events ------------------------------------------------------------------------------------

    def _state_change(self, instance_id: str, state: str, delay_s: float) -> None:
        event = ec2_event(
            resources.EC2_STATE_CHANGE,
            {"instance-id": instance_id, "state": state},
            account=self.account,
            region=self.region,
        )
        self._events.put((time.monotonic() + delay_s, event))

    def _deliver_loop(self) -> None:
        # In order, each no earlier than it is due: a delay never adds up behind another.
        while True:
            item = self._events.get()
            if item is None:
                return
            due, event = item
            wait_s = due - time.monotonic()
            if wait_s > 0:
                threading.Event().wait(wait_s)
            try:
                self.deliver(event)
                self.delivered += 1
            except Exception:
                log.exception("fleet_events failed on %s", event.get("detail-type"))

    # ---- fault injection (POST /local/inject/<kind>, admins) ----------------------------------------

    def inject(self, kind: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if kind == "capacity":
            itype = body.get("instance_type")
            times = body.get("times")
            if not isinstance(itype, str) or not itype:
                return _bad("instance_type", "capacity needs instance_type")
            refused = self._unknown_place(itype, body.get("az") or None)
            if refused is not None:
                return refused
            if times is not None and (not isinstance(times, int) or times < 1):
                return _bad("times", "times must be a whole number of at least 1")
            fault = CapacityFault(itype, body.get("az") or None, times)
            with self._lock:
                self.capacity.append(fault)
            return 200, {"injected": "capacity", **fault.as_json()}
        if kind == "crash-after-launch":
            times = body.get("times", 1)
            if not isinstance(times, int) or times < 1:
                return _bad("times", "times must be a whole number of at least 1")
            with self._lock:
                self.crashes += times
            return 200, {"injected": "crash-after-launch", "times": self.crashes}
        if kind == "spot-interruption":
            iid = body.get("instance_id")
            if not isinstance(iid, str) or not re.fullmatch(r"i-[0-9a-z]{1,32}", iid):
                return _bad("instance_id", "spot-interruption needs an instance id, i-...")
            known = self.ec2.describe_instances(
                Filters=[
                    {"Name": "instance-id", "Values": [iid]},
                    {"Name": "instance-state-name", "Values": ["running"]},
                ]
            )["Reservations"]
            if not known:
                return 404, {
                    "error": {
                        "code": "not_found",
                        "message": f"no running instance {iid}",
                        "details": {"instance_id": iid},
                    }
                }
            refused = _not_spot(iid, [i for r in known for i in r.get("Instances", [])])
            if refused is not None:
                return refused
            notice_s = self._interrupt(iid)
            return 200, {"injected": "spot-interruption", "instance_id": iid, "terminates_in_s": notice_s}
        if kind == "spot-price":
            return self._inject_spot_price(body)
        if kind == "clear":
            with self._lock:
                self.capacity.clear()
                self.crashes = 0
                self._retire_spot_changes()
            return 200, {"cleared": True}
        return 404, {"error": {"code": "not_found", "message": f"no fault {kind!r}", "details": {}}}

    def _interrupt(self, iid: str) -> float:
        """EC2's two-minute warning for spot instance ``iid``, then its termination; the notice's
        length in seconds (times the plane's schedule scale)."""
        notice_s = SPOT_NOTICE_S * self.schedule_scale
        action_at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=notice_s)
        event = ec2_event(
            resources.EC2_SPOT_INTERRUPTION,
            {
                "instance-id": iid,
                "instance-action": "terminate",
                "instance-action-time": action_at.isoformat(),
            },
            account=self.account,
            region=self.region,
        )
        self._events.put((time.monotonic(), event))
        self._keep_notice(iid, action_at)
        self._arm(iid, notice_s)
        return notice_s

    def _arm(self, iid: str, delay_s: float) -> None:
        timer = threading.Timer(delay_s, self._reclaim, args=(iid,))
        timer.daemon = True
        timer.start()
        self._timers.append(timer)

    # A notice given outlives a restart of the plane, as EC2 terminates the instance whatever
    # the plane does: kept in the state directory until its termination is sent.
    def _keep_notice(self, iid: str, action_at: dt.datetime | None) -> None:
        from calque.local.moto_state import read_json, write_durably

        path = self.state.aws_dir / SPOT_NOTICES_FILE
        with self._lock:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            notices = read_json(path) or {}
            if action_at is None:
                notices.pop(iid, None)
            else:
                notices[iid] = action_at.isoformat()
            write_durably(path, json.dumps(notices).encode())

    def resume_notices(self) -> list[str]:
        """Arm again the terminations the last run's spot notices had not sent yet (at once
        for those already due); the instance ids."""
        from calque.local.moto_state import read_json

        notices = read_json(self.state.aws_dir / SPOT_NOTICES_FILE) or {}
        now = dt.datetime.now(dt.UTC)
        for iid, at in notices.items():
            self._arm(iid, max(0.0, (dt.datetime.fromisoformat(at) - now).total_seconds()))
        return sorted(notices)

    def _unknown_place(self, itype: str, az: str | None) -> tuple[int, dict[str, Any]] | None:
        """A fault for a type the catalog does not know, or an AZ the region does not have,
        would never fire: refused, naming what exists."""
        from calque import catalog
        from calque.errors import InvalidInput

        try:
            catalog.instance_type(itype)
        except InvalidInput as exc:
            return _bad("instance_type", exc.message)
        if az is not None:
            if self.ec2 is not None:
                described = self.ec2.describe_availability_zones().get("AvailabilityZones", [])
                zones = sorted(z["ZoneName"] for z in described)
                known = az in zones
            else:  # no EC2 client attached yet: the region's zone names, as EC2 spells them
                zones = [f"{self.region}a", "..."]
                known = re.fullmatch(rf"{re.escape(self.region)}[a-z]", az) is not None
            if not known:
                valid = ", ".join(zones)
                return _bad("az", f"no availability zone {az!r} in {self.region}; its zones: {valid}")
            places = self._places()
            if places and az not in places:
                return _bad(
                    "az",
                    f"the fleet launches in {', '.join(places)} only (its subnets), never in {az}: "
                    "a fault there would never fire",
                )
        return None

    def _places(self) -> list[str]:
        """The AZs the fleet's acquirer tries (its subnets, ``subnet-id@az``), in order."""
        configured = os.environ.get(resources.ENV_FLEET_SUBNETS)
        if not configured and self.ec2 is not None:
            configured = ",".join(default_subnets(self.ec2))
        from calque.fleet.ports import Subnet

        found = (Subnet.parse(item).availability_zone for item in (configured or "").split(",") if item)
        return [az for az in found if az]

    def _retire_spot_changes(self) -> None:
        """(Under the lock.) The injected prices end now: each type and AZ changed is at the
        table's price again from now, its changes kept in the history before that."""
        from calque import catalog

        now = dt.datetime.now(dt.UTC)
        for (itype, az), changes in self.spot_changes.items():
            if not changes:
                continue
            back = self._table_price(catalog.instance_type(itype).hourly_usd)
            self.spot_retired.setdefault((itype, az), []).extend([*changes, (now, back)])
        self.spot_changes.clear()

    def _inject_spot_price(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """The spot price of ``instance_type`` in ``az`` changes to ``usd_per_hour``, now."""

        itype, az, price = body.get("instance_type"), body.get("az"), body.get("usd_per_hour")
        if not isinstance(itype, str) or not itype:
            return _bad("instance_type", "spot-price needs instance_type")
        if not isinstance(az, str) or not az:
            return _bad("az", "spot-price needs an availability zone, e.g. us-east-1a")
        refused = self._unknown_place(itype, az)
        if refused is not None:
            return refused
        if isinstance(price, bool) or not isinstance(price, int | float) or not 0 < price <= 1000:
            return _bad("usd_per_hour", "usd_per_hour must be a price above 0 and at most 1000 $/h")
        at = dt.datetime.now(dt.UTC)
        with self._lock:
            self.spot_changes.setdefault((itype, az), []).append((at, float(price)))
            # EC2 interrupts a spot instance whose max price the market's passes ("price")
            outbid = sorted(
                iid
                for iid, (t, where, most) in self.spot_bids.items()
                if (t, where) == (itype, az) and most < price and iid not in self._terminated
            )
            for iid in outbid:
                del self.spot_bids[iid]
        for iid in outbid:
            self._interrupt(iid)
        return 200, {
            "injected": "spot-price",
            "instance_type": itype,
            "az": az,
            "usd_per_hour": float(price),
            "at": at.isoformat(),
            "interrupted": outbid,
        }

    def _reclaim(self, instance_id: str) -> None:
        try:
            self.ec2.terminate_instances(InstanceIds=[instance_id])
        except Exception:
            log.exception("could not reclaim spot instance %s", instance_id)
        self._keep_notice(instance_id, None)

    def faults(self) -> dict[str, Any]:
        with self._lock:
            # a fault whose --times are used up no longer refuses anything: it is not in effect
            return {
                "capacity": [f.as_json() for f in self.capacity if f.times != 0],
                "crash_after_launch": self.crashes,
                "spot_prices": [
                    {"instance_type": t, "az": az, "usd_per_hour": p, "at": at.isoformat()}
                    for (t, az), changes in sorted(self.spot_changes.items())
                    for at, p in changes
                ],
            }


def _tag(params: dict[str, str], key: str) -> str | None:
    """The value of tag ``key`` in a RunInstances query's TagSpecification parameters."""
    for name, value in params.items():
        if name.endswith(".Key") and value == key:
            return params.get(name[: -len(".Key")] + ".Value") or None
    return None


def _bad(field: str, message: str) -> tuple[int, dict[str, Any]]:
    return 400, {"error": {"code": "invalid_input", "message": message, "details": {"field": field}}}


def default_subnets(ec2: Any, count: int = 3) -> list[str]:
    """``subnet-id@az`` of the default VPC's first ``count`` AZs: the places the fleet tries."""
    subnets = ec2.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"]
    subnets.sort(key=lambda s: s["AvailabilityZone"])
    return [f"{s['SubnetId']}@{s['AvailabilityZone']}" for s in subnets[:count]]


def fleet_environment(ec2: Any, *, launch_template: str) -> dict[str, str]:
    """The fleet's settings on the local plane: a launch template and an AMI moto knows, the
    default VPC's subnets in three AZs."""
    from calque.local.hosts import _image_id

    image = _image_id(ec2)
    ec2.create_launch_template(
        LaunchTemplateName=launch_template,
        LaunchTemplateData={
            "ImageId": image,
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
            "BlockDeviceMappings": [
                {"DeviceName": "/dev/sda1", "Ebs": {"Encrypted": True, "VolumeSize": 200}}
            ],
        },
    )
    return {
        resources.ENV_FLEET_LAUNCH_TEMPLATE: launch_template,
        resources.ENV_FLEET_AMI_ID: image,
        resources.ENV_FLEET_SUBNETS: ",".join(default_subnets(ec2)),
        "CALQUE_FLEET_SPOT_REFRESH_S": os.environ.get(
            "CALQUE_FLEET_SPOT_REFRESH_S", str(LOCAL_SPOT_REFRESH_S)
        ),
    }


def _not_spot(instance_id: str, instances: list[dict[str, Any]]) -> tuple[int, dict[str, Any]] | None:
    """EC2 interrupts spot instances only: an on-demand one (no ``InstanceLifecycle: spot``)
    gets a 409 naming its lifecycle, and no notice is sent."""
    lifecycle = next((i.get("InstanceLifecycle") for i in instances), None)
    if lifecycle == "spot":
        return None
    return 409, {
        "error": {
            "code": "not_spot",
            "message": f"{instance_id} is an on-demand instance: EC2 interrupts spot instances only",
            "details": {"instance_id": instance_id, "lifecycle": lifecycle or "on-demand"},
        }
    }

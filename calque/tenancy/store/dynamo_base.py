"""The tenancy registry's records as the table's items, and back (key shapes:
calque.tenancy.store.keys): what every part of DynamoRegistry shares."""

from __future__ import annotations

from typing import Any

from calque.dynamo import expr_values, ser
from calque.members.store import DynamoMembers
from calque.tenancy.store import keys
from calque.tenancy.store.models import LeaseEvent, SessionRecord, SliceRecord
from calque.tenancy.store.ports import UsageCharge
from calque.tenancy.store.queue_records import account


class DynamoBase(DynamoMembers):
    @staticmethod
    def _put_event(event: LeaseEvent) -> dict[str, Any]:
        item = {
            **keys.event(event.at, event.session_id, event.fence, event.kind),
            "type": "event",
            **event.model_dump(),
        }
        return {"Put": {"Item": ser(item)}}

    @staticmethod
    def _slice_item(sl: SliceRecord) -> dict[str, Any]:
        item = {
            **keys.slice_(sl.instance_id, sl.slice_id),
            "type": "slice",
            **sl.model_dump(exclude={"placeable"}),
            **keys.fleet_keys(sl.instance_id, sl.slice_id),
        }
        if sl.placeable and sl.state == "free":
            item["free_pk"] = keys.free_pk(sl.backend)
            item["free_sk"] = keys.free_sk(sl.memory_gib, sl.profile, sl.instance_id, sl.slice_id)
        return item

    @staticmethod
    def _slice(item: dict[str, Any]) -> SliceRecord:
        return SliceRecord.model_validate({**item, "placeable": "free_pk" in item})

    @staticmethod
    def _session_item(s: SessionRecord) -> dict[str, Any]:
        item = {
            **keys.session(s.session_id),
            "type": "session",
            **s.model_dump(),
            "expires_epoch": int(s.expires_at.timestamp()),
            "user_pk": keys.user_pk(s.user),
            "user_sk": keys.user_sk(s.created_at, s.session_id, live=s.state == "live"),
        }
        if s.state == "live":
            item["expiry_pk"] = keys.LIVE
            item["expiry_sk"] = keys.expiry_sk(s.expires_at, s.session_id)
        return item


def usage_charge_item(charge: UsageCharge) -> dict[str, Any]:
    """An account's fair-share charge, a transaction's last write: an ``ADD`` (racing grants
    of one account never refuse each other), on condition the usage is scaled to the
    reference and half-life the charge was weighed for (a sum kept before the half-life was
    kept with it is taken as weighed with the deployment's)."""
    return {
        "Update": {
            "Key": ser(account(charge.account)),
            "UpdateExpression": "ADD usage_v :add SET usage_ref = if_not_exists(usage_ref, :ref), "
            "usage_hl = if_not_exists(usage_hl, :hl)",
            "ConditionExpression": "attribute_not_exists(usage_ref) OR "
            "(usage_ref = :ref AND (attribute_not_exists(usage_hl) OR usage_hl = :hl))",
            "ExpressionAttributeValues": expr_values(add=charge.added, ref=charge.ref, hl=charge.half_life_s),
        }
    }


def usage_refused(charge: UsageCharge | None, reasons: list[str]) -> bool:
    """True when only the charge's condition cancelled the transaction (it is the last write)."""
    return (
        charge is not None
        and len(reasons) > 1
        and reasons[-1] == "ConditionalCheckFailed"
        and all(r == "None" for r in reasons[:-1])
    )

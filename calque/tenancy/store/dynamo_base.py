"""The tenancy registry's records as the table's items, and back (key shapes:
calque.tenancy.store.keys): what every part of DynamoRegistry shares."""

from __future__ import annotations

from typing import Any

from calque.dynamo import ser
from calque.members.store import DynamoMembers
from calque.tenancy.store import keys
from calque.tenancy.store.models import LeaseEvent, SessionRecord, SliceRecord


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

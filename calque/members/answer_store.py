"""Kept answers (calque.members.answers) on the single DynamoDB table (key shape:
calque.members.keys.answer_key): each change one conditional write on the one item."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from calque.dynamo import CONDITION_FAILED, Table, error_code, ser
from calque.members.answers import AnswerRecord, RequestInProgress, answer_item, claimable
from calque.members.keys import answer_key

# The condition ``claimable`` states: no live record, or one of the same request whose
# writer's time is up.
_CLAIMABLE = (
    "attribute_not_exists(pk) OR expires_epoch < :now OR "
    "(#state = :running AND running_until_epoch < :now AND fingerprint = :fp)"
)


class DynamoAnswers(Table):
    def claim_answer(self, record: AnswerRecord, *, now: datetime) -> AnswerRecord | None:
        for _ in range(3):
            try:
                self.client.put_item(
                    TableName=self.table,
                    Item=ser(answer_item(record)),
                    ConditionExpression=_CLAIMABLE,
                    ExpressionAttributeNames={"#state": "state"},
                    ExpressionAttributeValues=ser(
                        {":now": int(now.timestamp()), ":running": "running", ":fp": record.fingerprint}
                    ),
                )
                return None
            except ClientError as exc:
                if error_code(exc) != CONDITION_FAILED:
                    raise
            item = self._get(answer_key(record.request_id))
            found = None if item is None else AnswerRecord.model_validate(item)
            if not claimable(found, record, now):
                return found
            # released or timed out between the write and the read: claim again
        raise RequestInProgress()

    def keep_answer(self, record: AnswerRecord) -> None:
        self._mine(
            lambda: self.client.put_item(
                TableName=self.table,
                Item=ser(answer_item(record)),
                ConditionExpression="claim = :claim",
                ExpressionAttributeValues=ser({":claim": record.claim}),
            )
        )

    def release_answer(self, request_id: str, claim: str) -> None:
        self._mine(
            lambda: self.client.delete_item(
                TableName=self.table,
                Key=ser(answer_key(request_id)),
                ConditionExpression="claim = :claim",
                ExpressionAttributeValues=ser({":claim": claim}),
            )
        )

    @staticmethod
    def _mine(write: Callable[[], Any]) -> None:
        try:
            write()
        except ClientError as exc:
            if error_code(exc) != CONDITION_FAILED:  # taken over: the other writer's now
                raise

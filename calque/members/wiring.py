"""The members' stores wired to the deployed table, from the API function's settings."""

from __future__ import annotations

from calque import aws
from calque.members.answer_store import DynamoAnswers
from calque.settings import api_settings


def api_answers() -> DynamoAnswers:
    return DynamoAnswers(aws.client("dynamodb"), api_settings().table_name)

"""An Idempotency-Key binds one request and keeps its answer, on both stores."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import boto3
import pytest
from moto import mock_aws

from calque.errors import CalqueError, InvalidInput
from calque.members.answer_store import DynamoAnswers
from calque.members.answers import Answer, MemoryAnswers, RequestInProgress, answered_once
from tests.unit.registry.moto_table import create_registry_table

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
SECRET = "cqt_the-token-shown-once"


@pytest.fixture(params=["memory", "dynamo"])
def store(request, monkeypatch: pytest.MonkeyPatch):
    if request.param == "memory":
        yield MemoryAnswers()
        return
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        yield DynamoAnswers(ddb, create_registry_table(ddb))


class Counter:
    def __init__(self, status: int = 200) -> None:
        self.runs = 0
        self.status = status

    def __call__(self) -> Answer:
        self.runs += 1
        return Answer(self.status, f'{{"run": {self.runs}, "token": "{SECRET}"}}', {"Location": "/v1/x"})


def send(store, run, *, fp: str = "fp-1", key: str = "key-00000001", who: str = "alice", now=NOW) -> Answer:
    return answered_once(store, principal=who, key=key, fingerprint=fp, now=now, running_s=30, run=run)


def test_the_same_request_again_gets_the_first_answer_and_runs_once(store):
    run = Counter()
    first = send(store, run)
    again = send(store, run, now=NOW + timedelta(hours=23))
    assert again == first
    assert run.runs == 1


def test_another_request_under_the_key_is_refused(store):
    run = Counter()
    send(store, run)
    with pytest.raises(InvalidInput) as refused:
        send(store, run, fp="fp-2")
    assert refused.value.code == "idempotency_key_reused"
    assert run.runs == 1


def test_a_refused_request_leaves_the_key_free(store):
    def refuse() -> Answer:
        raise CalqueError("no")

    with pytest.raises(CalqueError):
        send(store, refuse)
    assert send(store, Counter(status=409), fp="fp-2").status == 409
    assert send(store, Counter(), fp="fp-3").status == 200


def test_a_request_still_running_is_told_to_retry_and_a_dead_one_is_taken_over(store):
    def never_answers() -> Answer:
        # the same request arrives while the first still runs
        with pytest.raises(RequestInProgress):
            send(store, Counter())
        # another one under the key is refused, even now
        with pytest.raises(InvalidInput):
            send(store, Counter(), fp="fp-2")
        raise KeyboardInterrupt  # the writer dies without answering

    with pytest.raises(KeyboardInterrupt):
        send(store, never_answers)
    # released on the way out: the same request runs
    assert send(store, Counter()).status == 200


def test_keys_expire_with_the_replay_window_and_belong_to_one_caller(store):
    run = Counter()
    send(store, run)
    send(store, run, who="bob")
    assert run.runs == 2
    send(store, run, fp="fp-2", now=NOW + timedelta(days=2))
    assert run.runs == 3


def test_the_table_never_holds_the_answer_in_clear(store):
    send(store, Counter())
    if isinstance(store, DynamoAnswers):
        items = store.client.scan(TableName=store.table)["Items"]
        held = repr(items)
    else:
        held = repr(store.answers)
    assert SECRET not in held
    assert "key-00000001" not in held


def test_a_claim_whose_writer_died_is_taken_over_by_the_same_request_only(store):
    from calque.members.answers import AnswerRecord, answer_id

    # Given a writer that claimed the key and died before answering (its process killed)
    dead = AnswerRecord(
        request_id=answer_id("alice", "key-00000001"),
        fingerprint="fp-1",
        state="running",
        claim="dead-writer",
        running_until=NOW + timedelta(seconds=30),
        expires_at=NOW + timedelta(days=1),
    )
    assert store.claim_answer(dead, now=NOW) is None
    later = NOW + timedelta(minutes=1)
    # Then another request under the key is still refused, and the same one runs again
    with pytest.raises(InvalidInput):
        send(store, Counter(), fp="fp-2", now=later)
    with pytest.raises(RequestInProgress):
        send(store, Counter(), now=NOW + timedelta(seconds=10))
    assert send(store, Counter(), now=later).status == 200

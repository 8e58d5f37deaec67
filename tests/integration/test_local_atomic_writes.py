"""DynamoDB through the local plane: a conditional write has exactly one winner."""

from __future__ import annotations

import threading

import pytest

pytestmark = pytest.mark.integration

THREADS = 32
ROUNDS = 50


def test_a_conditional_put_raced_by_many_threads_has_exactly_one_winner(local_plane):
    import boto3
    from botocore.config import Config

    # Given the plane's registry table, reached with real boto3 clients over HTTP
    key, secret = local_plane.moto_credentials()
    session = boto3.session.Session(
        aws_access_key_id=key, aws_secret_access_key=secret, region_name=local_plane.region
    )
    ddb = session.client(
        "dynamodb",
        endpoint_url=local_plane.moto_endpoint,
        config=Config(max_pool_connections=THREADS * 2, retries={"max_attempts": 1}),
    )
    table = local_plane.info["table"]
    winners_per_round: list[list[int]] = []
    errors: list[BaseException] = []

    for round_no in range(ROUNDS):
        winners: list[int] = []
        start = threading.Barrier(THREADS)

        def contend(
            thread_no: int,
            round_no: int = round_no,
            winners: list[int] = winners,
            start: threading.Barrier = start,
        ) -> None:
            start.wait()
            try:
                ddb.put_item(
                    TableName=table,
                    Item={
                        "pk": {"S": f"race#{round_no}"},
                        "sk": {"S": "lease"},
                        "holder": {"S": str(thread_no)},
                    },
                    ConditionExpression="attribute_not_exists(pk)",
                )
                winners.append(thread_no)
            except ddb.exceptions.ConditionalCheckFailedException:
                pass
            except BaseException as exc:  # anything else is a failure of the test's premise
                errors.append(exc)

        # When 32 threads put the same key at once, each only if it does not exist yet
        threads = [threading.Thread(target=contend, args=(n,)) for n in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners_per_round.append(winners)

    # Then every round had exactly one winner, and the item names that winner
    assert not errors, errors[:3]
    assert [len(w) for w in winners_per_round] == [1] * ROUNDS
    for round_no, winners in enumerate(winners_per_round):
        item = ddb.get_item(
            TableName=table, Key={"pk": {"S": f"race#{round_no}"}, "sk": {"S": "lease"}}, ConsistentRead=True
        )["Item"]
        assert item["holder"]["S"] == str(winners[0])


def test_a_transaction_is_all_or_nothing_under_contention(local_plane):

    # Given two slices free, and 16 threads each taking BOTH in one transaction
    ddb = local_plane.client("dynamodb")
    table = local_plane.info["table"]
    for s in ("a", "b"):
        ddb.put_item(
            TableName=table, Item={"pk": {"S": "txhost"}, "sk": {"S": f"slice#{s}"}, "state": {"S": "free"}}
        )
    won: list[int] = []
    start = threading.Barrier(16)

    def take(n: int) -> None:
        start.wait()
        try:
            ddb.transact_write_items(
                TransactItems=[
                    {
                        "Update": {
                            "TableName": table,
                            "Key": {"pk": {"S": "txhost"}, "sk": {"S": f"slice#{s}"}},
                            "UpdateExpression": "SET #s = :held, holder = :me",
                            "ConditionExpression": "#s = :free",
                            "ExpressionAttributeNames": {"#s": "state"},
                            "ExpressionAttributeValues": {
                                ":held": {"S": "held"},
                                ":free": {"S": "free"},
                                ":me": {"S": str(n)},
                            },
                        }
                    }
                    for s in ("a", "b")
                ]
            )
            won.append(n)
        except ddb.exceptions.TransactionCanceledException:
            pass

    threads = [threading.Thread(target=take, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    # Then one transaction won, and both slices name the same holder
    assert len(won) == 1
    holders = {
        ddb.get_item(TableName=table, Key={"pk": {"S": "txhost"}, "sk": {"S": f"slice#{s}"}})["Item"][
            "holder"
        ]["S"]
        for s in ("a", "b")
    }
    assert holders == {str(won[0])}

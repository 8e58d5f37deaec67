"""The stateful stack: the registry table and the artifact bucket, built from calque.resources."""

from __future__ import annotations

import pytest

from calque.resources import REGISTRY_TABLE
from infra import constants

from .conftest import Synthesized, resources_of

pytestmark = pytest.mark.infra


def _only(template: dict, resource_type: str) -> dict:
    found = resources_of(template, resource_type)
    assert len(found) == 1, f"expected one {resource_type}, found {len(found)}"
    return found[0]


def test_registry_table_matches_its_python_definition(synthesized: Synthesized) -> None:
    # Given the synthesized stateful stack
    table = _only(synthesized.stateful_json, "AWS::DynamoDB::Table")
    props = table["Properties"]
    # Then its keys, TTL and indexes are exactly those of calque.resources.REGISTRY_TABLE
    assert props["KeySchema"] == [
        {"AttributeName": REGISTRY_TABLE.partition_key, "KeyType": "HASH"},
        {"AttributeName": REGISTRY_TABLE.sort_key, "KeyType": "RANGE"},
    ]
    assert props["TimeToLiveSpecification"] == {
        "AttributeName": REGISTRY_TABLE.ttl_attribute,
        "Enabled": True,
    }
    indexes = {ix["IndexName"]: ix for ix in props["GlobalSecondaryIndexes"]}
    assert set(indexes) == {ix.name for ix in REGISTRY_TABLE.indexes}
    for ix in REGISTRY_TABLE.indexes:
        assert indexes[ix.name]["KeySchema"] == [
            {"AttributeName": ix.partition_key, "KeyType": "HASH"},
            {"AttributeName": ix.sort_key, "KeyType": "RANGE"},
        ]
    assert {a["AttributeName"] for a in props["AttributeDefinitions"]} == set(REGISTRY_TABLE.attributes)


def test_registry_table_is_on_demand_recoverable_and_retained(synthesized: Synthesized) -> None:
    # Given the registry table
    table = _only(synthesized.stateful_json, "AWS::DynamoDB::Table")
    # Then it bills per request, keeps point-in-time recovery, and survives stack deletion
    assert table["Properties"]["BillingMode"] == "PAY_PER_REQUEST"
    assert table["Properties"]["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] is True
    assert table["Properties"]["DeletionProtectionEnabled"] is True
    assert table["DeletionPolicy"] == "Retain"
    assert table["UpdateReplacePolicy"] == "Retain"


def test_every_bucket_is_private_encrypted_versioned_and_retained(synthesized: Synthesized) -> None:
    # Given the stateful stack's buckets (artifacts and their access logs)
    buckets = resources_of(synthesized.stateful_json, "AWS::S3::Bucket")
    assert len(buckets) == 2
    for bucket in buckets:
        props = bucket["Properties"]
        # Then none can be made public, all are encrypted and versioned, and deletion keeps them
        assert props["PublicAccessBlockConfiguration"] == {
            "BlockPublicAcls": True,
            "BlockPublicPolicy": True,
            "IgnorePublicAcls": True,
            "RestrictPublicBuckets": True,
        }
        assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
        assert props["VersioningConfiguration"] == {"Status": "Enabled"}
        assert bucket["DeletionPolicy"] == "Retain"


def test_artifact_bucket_logs_its_access_to_the_log_bucket(synthesized: Synthesized) -> None:
    # Given the bucket that holds pool manifests and results
    logged = [
        b
        for b in resources_of(synthesized.stateful_json, "AWS::S3::Bucket")
        if "LoggingConfiguration" in b["Properties"]
    ]
    # Then exactly it sends server access logs, to the other bucket of the stack
    assert len(logged) == 1
    target = logged[0]["Properties"]["LoggingConfiguration"]["DestinationBucketName"]
    assert "Ref" in target
    assert synthesized.stateful_json["Resources"][target["Ref"]]["Type"] == "AWS::S3::Bucket"


def _denies_plain_http(statement: dict) -> bool:
    secure = statement.get("Condition", {}).get("Bool", {}).get("aws:SecureTransport")
    return statement["Effect"] == "Deny" and secure == "false"


def test_every_bucket_refuses_requests_without_tls(synthesized: Synthesized) -> None:
    # Given the bucket policies
    policies = resources_of(synthesized.stateful_json, "AWS::S3::BucketPolicy")
    buckets = {p["Properties"]["Bucket"]["Ref"] for p in policies}
    # Then every bucket has one, and it denies any request not made over TLS
    assert len(buckets) == 2
    for policy in policies:
        statements = policy["Properties"]["PolicyDocument"]["Statement"]
        assert any(_denies_plain_http(s) for s in statements)


def test_outputs_name_the_table_and_the_bucket(synthesized: Synthesized) -> None:
    # Then clients find the table and bucket by stable output names
    outputs = synthesized.stateful_json["Outputs"]
    assert {constants.OUTPUT_TABLE_NAME, constants.OUTPUT_BUCKET_NAME} <= set(outputs)

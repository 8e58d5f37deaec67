"""What cfn-lint and checkov still say about the synthesized templates, and why it stays.

The infra tests (tests/infra/test_scanners.py) run both over every template and fail on any
finding not listed here, and on any entry here that no longer matches a finding, so this
stays the one place where a scanner's finding is accepted, with its reason (cdk-nag's are
acknowledged beside the resource they concern, infra/nag.py).
"""

from __future__ import annotations

from typing import Final

CFN_LINT_ACCEPTED: Final[dict[str, str]] = {
    "W3005": "CDK writes a DependsOn on each function's role beside the GetAtt of it, so the "
    "function waits for the role's policy too; redundant for the role, harmless.",
}

CHECKOV_ACCEPTED: Final[dict[str, str]] = {
    "CKV_AWS_115": "Functions are bounded by their event sources (SQS batch sizes, one-minute "
    "schedules, API Gateway throttling) rather than reserved concurrency, which would take "
    "from the account's pool for every deployment.",
    "CKV_AWS_116": "Failed work is kept by each function's event source: SQS queues redrive to "
    "their own dead-letter queue (alarmed), schedules run again next minute, API calls answer "
    "the caller; an async Lambda DLQ would hold nothing.",
    "CKV_AWS_117": "The functions call only AWS APIs (DynamoDB, SQS, S3, EC2, SSM, EventBridge) "
    "and no VPC resource; in a VPC they would need NAT or one endpoint per service.",
    "CKV_AWS_119": "The registry table uses DynamoDB's AWS-owned encryption at rest; a customer "
    "managed key is an institution's choice, and adds KMS cost and grants to every function.",
    "CKV_AWS_120": "No response caching: every answer is per caller and changes with the "
    "registry (sessions, hosts, quotas), so a cached one would be wrong.",
    "CKV_AWS_158": "Log groups use CloudWatch Logs' own encryption at rest; they hold no secrets "
    "(tokens are never logged, only their hashes are stored).",
    "CKV_AWS_173": "Function environments hold resource names and settings, no secrets; Lambda "
    "encrypts them at rest with its own key.",
    "CKV_AWS_18": "The access-log bucket does not log access to itself (that would loop); the "
    "artifact bucket logs to it.",
    "CKV_AWS_27": "Queues are encrypted with SQS-managed keys (SqsManagedSseEnabled), which "
    "checkov does not recognise; no KMS key is needed to read or write them.",
}

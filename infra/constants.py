"""Names that clients, tests and operators rely on: stack names, output ids, context keys.

CloudFormation outputs keep these logical ids, so the CLI and the tests find them by
name, never by a hashed id. The SSM document's parameter names live in
calque.resources, shared with the local plane.
"""

from __future__ import annotations

from typing import Final

from calque.resources import HOST_AGENT_VERBS, SSM_DOCUMENT_PARAMETERS, QueueDef

__all__ = ["HOST_AGENT_VERBS", "SSM_DOCUMENT_PARAMETERS"]

# Stacks (their CloudFormation names).
STATEFUL_STACK_NAME: Final = "CalqueState"
SERVICE_STACK_NAME: Final = "CalqueService"

# Outputs (logical ids, stable).
OUTPUT_TABLE_NAME: Final = "TableName"
OUTPUT_BUCKET_NAME: Final = "BucketName"
OUTPUT_API_ENDPOINT: Final = "ApiEndpoint"
OUTPUT_SSM_DOCUMENT_NAME: Final = "SsmDocumentName"
OUTPUT_HOST_ROLE_NAME: Final = "HostRoleName"
OUTPUT_HOST_INSTANCE_PROFILE_NAME: Final = "HostInstanceProfileName"
OUTPUT_MEMBERS_POLICY_ARN: Final = "MembersPolicyArn"
OUTPUT_ADMINS_POLICY_ARN: Final = "AdminsPolicyArn"


def pascal_case(identifier: str) -> str:
    """``host_tasks`` -> ``HostTasks``: resource ids from calque.resources as construct ids."""
    return "".join(part.capitalize() for part in identifier.split("_"))


def queue_url_output(queue: QueueDef) -> str:
    """``host_tasks`` -> ``HostTasksQueueUrl``: one output per queue in calque.resources."""
    return pascal_case(queue.id) + "QueueUrl"


# CDK context keys an admin sets with `-c key=value` (or in cdk.json).
CONTEXT_ADMINS: Final = "calque:admins"  # comma list of principals or ARN patterns
CONTEXT_SESSION_TTL_MAX: Final = "calque:session-ttl-max"  # e.g. 12h, 7d, or seconds
CONTEXT_BUNDLE_CACHE_DIR: Final = "calque:bundle-cache-dir"  # where built Lambda bundles are cached
# Identity and operations (docs/deploy.md).
CONTEXT_ORGANIZATION_ID: Final = "calque:organization-id"  # o-...: callers from this organization
# distinct (default): another account's principal is its own member, ACCOUNT:name; refuse: 403
CONTEXT_OTHER_ACCOUNTS: Final = "calque:other-accounts"
CONTEXT_SESSION_NAMED_ROLES: Final = "calque:session-named-roles"  # roles whose session names are pinned
CONTEXT_ALARM_TOPIC_ARN: Final = "calque:alarm-topic-arn"  # SNS topic the alarms notify
CONTEXT_PIN_ADMINS: Final = "calque:pin-admins"  # true (default): pin admin entries to unique ids
CONTEXT_ADMIN_PIN_EPOCH: Final = "calque:admin-pin-epoch"  # a new value looks the unique ids up again
# API Gateway's account-wide CloudWatch role: auto (default: set this stack's role only where the
# account has none, and say which in the output), true (always set this stack's), false (leave it).
CONTEXT_APIGATEWAY_CLOUDWATCH_ROLE: Final = "calque:create-apigateway-cloudwatch-role"
OUTPUT_APIGATEWAY_CLOUDWATCH_ROLE: Final = "ApiGatewayCloudWatchRole"

# Lambda: one architecture and one Python for the functions and the wheels in their layer.
LAMBDA_ARCHITECTURE: Final = "arm64"
LAMBDA_PIP_PLATFORM: Final = "manylinux2014_aarch64"
LAMBDA_PYTHON_VERSION: Final = "3.12"

# API Gateway.
API_STAGE_NAME: Final = "prod"
# The one route a host's own role may call: the agent's report.
HOST_REPORT_METHOD: Final = "POST"
HOST_REPORT_PATH: Final = "/v1/hosts/*/report"
# What a member may call (execute-api:Invoke in the members' managed policy); the API still
# decides per request (their own sessions, quota, usage). Admins may call every route. Every
# route the API lets a member use is here (tests/unit/api/test_member_routes.py holds them equal):
# a route missing from it is refused by API Gateway (403) before the API could answer.
MEMBER_ROUTES: Final = (
    ("GET", "/v1/health"),
    ("GET", "/v1/whoami"),
    ("GET", "/v1/openapi.json"),
    ("GET", "/v1/hosts"),
    ("GET", "/v1/hosts/*"),
    ("POST", "/v1/sessions"),
    ("GET", "/v1/sessions"),
    ("GET", "/v1/sessions/*"),
    ("DELETE", "/v1/sessions/*"),
    ("POST", "/v1/sessions/*/extend"),
    # the wait queue (session checkout --wait, session queue, session cancel) and its fair share
    ("POST", "/v1/session-requests"),
    ("GET", "/v1/session-requests"),
    ("GET", "/v1/session-requests/*"),
    ("DELETE", "/v1/session-requests/*"),
    ("GET", "/v1/fairshare"),
    ("GET", "/v1/quotas"),
    ("GET", "/v1/quotas/*"),
    ("GET", "/v1/pools"),
    ("GET", "/v1/pools/*"),
    ("POST", "/v1/pools/*/claims"),
    ("POST", "/v1/pools/*/claims/input"),  # where a claim's input is uploaded before its submit
    ("GET", "/v1/claims"),
    ("GET", "/v1/claims/*"),
    ("DELETE", "/v1/claims/*"),
    ("GET", "/v1/usage"),
    ("GET", "/v1/budget"),
    ("GET", "/v1/acquisitions"),  # their own (a member's pools' instances)
    ("GET", "/v1/acquisitions/*"),
    ("GET", "/v1/groups"),
    ("GET", "/v1/groups/*"),
)

# Where the host agent lives on an instance.
HOST_AGENT_ROOT: Final = "/opt/calque/agent"

# Warm pools: the routes pool workers report to, with their instance's role.
POOL_CLAIM_REPORT_PATH: Final = "/v1/pools/*/claims/*/report"
POOL_WORKER_REPORT_PATH: Final = "/v1/pools/*/workers/*/report"
# Where a pool worker fetches its own credentials (the pool worker role, scoped to its pool).
POOL_WORKER_CREDENTIALS_PATH: Final = "/v1/pools/*/workers/*/credentials"
# Every route a host role's session may call (on the API hosts report to).
POOL_HOST_PATHS: Final = (POOL_CLAIM_REPORT_PATH, POOL_WORKER_REPORT_PATH, POOL_WORKER_CREDENTIALS_PATH)

# The fleet (layer 0): where its instances run. Both given: the deployment's own subnets
# (subnet-ID@AZ, comma separated, tried in order); neither: the stack creates a small VPC
# with no internet access, reaching AWS through VPC endpoints (docs/fleet.md: what each costs).
CONTEXT_FLEET_VPC_ID: Final = "calque:fleet-vpc-id"
CONTEXT_FLEET_SUBNETS: Final = "calque:fleet-subnets"
# The created VPC's AZs (comma list), and EC2's offerings per instance type that synth checks
# them against (JSON, as `python -m infra.offerings` prints it).
CONTEXT_FLEET_AZS: Final = "calque:fleet-azs"
CONTEXT_FLEET_AZ_OFFERINGS: Final = "calque:fleet-az-offerings"
# Own VPC: its execute-api interface endpoint (vpce-...), through which hosts reach the private
# report API; unset, hosts report to the public API (through NAT, private DNS off for execute-api).
CONTEXT_FLEET_EXECUTE_API_ENDPOINT: Final = "calque:fleet-execute-api-endpoint"
# A customer-managed KMS key that encrypts the hosts' EBS volumes (the account's EBS default key).
CONTEXT_FLEET_EBS_KMS_KEY: Final = "calque:fleet-ebs-kms-key-arn"
# One AMI for every instance type (ami-...), instead of the Deep Learning AMIs' parameters
CONTEXT_FLEET_AMI_ID: Final = "calque:fleet-ami-id"
OUTPUT_HOST_REPORT_ENDPOINT: Final = "HostReportEndpoint"
OUTPUT_FLEET_LAUNCH_TEMPLATE: Final = "FleetLaunchTemplateName"
OUTPUT_FLEET_VPC_ID: Final = "FleetVpcId"

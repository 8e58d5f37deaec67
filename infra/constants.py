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

# Lambda: one architecture and one Python for the functions and the wheels in their layer.
LAMBDA_ARCHITECTURE: Final = "arm64"
LAMBDA_PIP_PLATFORM: Final = "manylinux2014_aarch64"
LAMBDA_PYTHON_VERSION: Final = "3.12"
# Provided by the Lambda Python runtime; left out of the dependency layer to keep it small.
LAMBDA_RUNTIME_PROVIDED: Final = ("boto3", "botocore", "s3transfer")

# API Gateway.
API_STAGE_NAME: Final = "prod"
# The one route a host's own role may call: the agent's report.
HOST_REPORT_METHOD: Final = "POST"
HOST_REPORT_PATH: Final = "/v1/hosts/*/report"

# Where the host agent lives on an instance.
HOST_AGENT_ROOT: Final = "/opt/calque/agent"

# The fleet (layer 0): where its instances run. Both given: the deployment's own subnets
# (subnet-ID@AZ, comma separated, tried in order); neither: the stack creates a small VPC
# with no internet access, reaching AWS through VPC endpoints (docs/fleet.md: what each costs).
CONTEXT_FLEET_VPC_ID: Final = "calque:fleet-vpc-id"
CONTEXT_FLEET_SUBNETS: Final = "calque:fleet-subnets"
OUTPUT_FLEET_LAUNCH_TEMPLATE: Final = "FleetLaunchTemplateName"
OUTPUT_FLEET_VPC_ID: Final = "FleetVpcId"

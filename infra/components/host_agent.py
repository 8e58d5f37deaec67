"""The host agent's way onto an instance: its bundle, the SSM Command document, the host role.

The bundle (host_agent/ and calque/ plus a requirements.txt) is an S3 asset; the
document downloads it and runs ``python3 -m host_agent --instance-id ... --report-to
<API> <verb> ...``. Its parameter names come from calque.resources, which the local
plane's SSM executor reads too. The host role gets what the agent needs and nothing
more: SSM's managed-instance core, read of that one bundle object, and invoking the
report route.
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import Aws, Fn, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from calque.resources import HOST_AGENT_VERBS, HOST_TAG_KEY, HOST_TAG_VALUE, SSM_DOCUMENT_PARAMETERS
from infra import constants
from infra.bundling import CopyPackages, local_asset, project_dependencies
from infra.nag import acknowledge

_SCRIPT = Path(__file__).with_name("run_host_agent.sh")
# What a spec or slice id may contain: no single quote, so even an SSM Agent too old for
# environment-variable interpolation cannot be made to run anything else.
_NO_QUOTE = "^[^']*$"
_SLICE_ID = r"^[A-Za-z0-9._:/-]{0,200}$"
_ENDPOINT = r"^(https?://[A-Za-z0-9.:/_-]+)?$"
_FENCE = r"^[0-9]{0,18}$"


def run_agent_script(*, version: str, download_dir: str, root: str = constants.HOST_AGENT_ROOT) -> list[str]:
    """The shell step's lines, with the parameter names and paths filled in."""
    p = SSM_DOCUMENT_PARAMETERS
    text = _SCRIPT.read_text()
    for placeholder, value in {
        "__P_VERB__": p.verb,
        "__P_SPEC__": p.spec,
        "__P_SLICE__": p.slice_id,
        "__P_REPORT__": p.report_to,
        "__P_FENCE__": p.fence,
        "__ROOT__": root,
        "__VERSION__": version,
        "__DOWNLOAD__": download_dir,
    }.items():
        text = text.replace(placeholder, value)
    return text.splitlines()


class HostAgent(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        project_root: Path,
        cache_dir: Path,
        report_endpoint: str,
    ) -> None:
        super().__init__(scope, construct_id)
        requirements = project_dependencies(project_root / "pyproject.toml", extras=("agent",))
        self.bundle = s3_assets.Asset(
            self,
            "Bundle",
            **local_asset(
                name="host-agent",
                recipe=CopyPackages(
                    root=project_root,
                    packages=("host_agent", "calque"),
                    extra_files=(("requirements.txt", "\n".join(requirements) + "\n"),),
                ),
                source=project_root,
                cache_dir=cache_dir,
            ).as_kwargs(),
        )
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description="calque GPU host: SSM agent, the host agent's bundle, its report route",
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name("AmazonSSMManagedInstanceCore")],
        )
        # Exactly the bundle object, not the whole asset bucket.
        self.role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject"],
                resources=[self.bundle.bucket.arn_for_objects(self.bundle.s3_object_key)],
            )
        )
        self.instance_profile = iam.InstanceProfile(self, "InstanceProfile", role=self.role)
        self.document = self._document(report_endpoint)
        self.document_arn = Stack.of(self).format_arn(
            service="ssm", resource="document", resource_name=self.document.ref
        )
        acknowledge(
            self.role,
            "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/AmazonSSMManagedInstanceCore]",
            "AmazonSSMManagedInstanceCore is AWS's maintained minimum for an instance to be managed by "
            "SSM, which is how the control plane runs the host agent.",
        )

    @property
    def document_name(self) -> str:
        return self.document.ref

    def _document(self, report_endpoint: str) -> ssm.CfnDocument:
        p = SSM_DOCUMENT_PARAMETERS
        download_dir = f"{constants.HOST_AGENT_ROOT}/downloads/{self.bundle.asset_hash}"
        linux = {"StringEquals": ["platformType", "Linux"]}
        bundle_url = Fn.join(
            "",
            [
                "https://",
                self.bundle.s3_bucket_name,
                ".s3.",
                Aws.REGION,
                ".",
                Aws.URL_SUFFIX,
                "/",
                self.bundle.s3_object_key,
            ],
        )
        return ssm.CfnDocument(
            self,
            "Document",
            document_type="Command",
            document_format="JSON",
            update_method="NewVersion",
            content={
                "schemaVersion": "2.2",
                "description": "Run the calque host agent on this instance: inventory, apply or assert "
                "a GPU layout, export it, reclaim a slice, or report.",
                "parameters": {
                    p.verb: {
                        "type": "String",
                        "description": "What the agent does.",
                        "allowedValues": list(HOST_AGENT_VERBS),
                    },
                    p.spec: {
                        "type": "String",
                        "description": "The layout spec as JSON (apply, assert); empty otherwise.",
                        "default": "",
                        "allowedPattern": _NO_QUOTE,
                        "interpolationType": "ENV_VAR",
                    },
                    p.slice_id: {
                        "type": "String",
                        "description": "The slice to reclaim (reclaim); empty otherwise.",
                        "default": "",
                        "allowedPattern": _SLICE_ID,
                        "interpolationType": "ENV_VAR",
                    },
                    p.fence: {
                        "type": "String",
                        "description": "The slice's fence when its lease ended (reclaim); the report "
                        "echoes it so a late report can never free a slice granted again since.",
                        "default": "",
                        "allowedPattern": _FENCE,
                        "interpolationType": "ENV_VAR",
                    },
                    p.report_to: {
                        "type": "String",
                        "description": "The control plane endpoint the agent reports to.",
                        "default": report_endpoint,
                        "allowedPattern": _ENDPOINT,
                        "interpolationType": "ENV_VAR",
                    },
                },
                "mainSteps": [
                    {
                        "action": "aws:downloadContent",
                        "name": "downloadAgent",
                        "precondition": linux,
                        "inputs": {
                            "sourceType": "S3",
                            "sourceInfo": Fn.join("", ['{"path":"', bundle_url, '"}']),
                            "destinationPath": download_dir,
                        },
                    },
                    {
                        "action": "aws:runShellScript",
                        "name": "runAgent",
                        "precondition": linux,
                        "inputs": {
                            "timeoutSeconds": "1800",
                            "runCommand": run_agent_script(
                                version=self.bundle.asset_hash[:16], download_dir=download_dir
                            ),
                        },
                    },
                ],
            },
        )

    def grant_send_command(self, grantee: iam.IGrantable) -> None:
        """Run this document, and only on instances tagged as calque hosts."""
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(actions=["ssm:SendCommand"], resources=[self.document_arn])
        )
        instances = Stack.of(self).format_arn(service="ec2", resource="instance", resource_name="*")
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["ssm:SendCommand"],
                resources=[instances],
                conditions={"StringEquals": {f"ssm:resourceTag/{HOST_TAG_KEY}": HOST_TAG_VALUE}},
            )
        )
        acknowledge(
            grantee.grant_principal,  # type: ignore[arg-type]
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:instance/*]",
            f"Hosts are launched and adopted at run time, so their ids are unknown at deploy time; "
            f"SendCommand is allowed only on instances tagged {HOST_TAG_KEY}={HOST_TAG_VALUE} and "
            "only with this stack's host-agent document.",
        )

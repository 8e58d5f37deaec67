"""The host agent's way onto an instance: its bundle, the SSM Command document, the host role.

The bundle (host_agent/ and calque/, plus a wheelhouse of the agent's dependencies
for every supported Python and machine) is an S3 asset; the document downloads it
(through the VPC's S3 gateway endpoint where there is no internet), unpacks the
wheels that fit the system python3, and runs ``python3 -m host_agent --instance-id
... --report-to <API> <verb> ...``. Nothing on the instance reaches an index. Its
parameter names come from calque.resources, which the local plane's SSM executor
reads too. The host role gets what the agent needs and nothing more: SSM's
managed-instance core, read of that one bundle object, and invoking the report route.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from calque.resources import (
    HOST_AGENT_STEP,
    HOST_AGENT_VERBS,
    HOST_TAG_KEY,
    HOST_TAG_VALUE,
    SSM_DOCUMENT_PARAMETERS,
)
from infra import constants
from infra.bundling import BundlingError, CopyPackages, local_asset
from infra.nag import acknowledge

_SCRIPT = Path(__file__).with_name("run_host_agent.sh")
# The system python3 of every supported AMI family (AL2023 3.9, Ubuntu 22.04 3.10, Ubuntu 24.04
# 3.12) and the versions between, on both machine kinds EC2 GPU instances come in.
AGENT_PYTHONS: tuple[str, ...] = ("3.9", "3.10", "3.11", "3.12", "3.13")
AGENT_MACHINES: tuple[str, ...] = ("x86_64", "aarch64")


def agent_requirements(project_root: Path) -> tuple[str, ...]:
    """host_agent/requirements.txt without comments: what the agent imports on a host."""
    lines = (project_root / "host_agent" / "requirements.txt").read_text().splitlines()
    return tuple(line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#"))


def wheel_tag(python: str, machine: str) -> str:
    """The wheelhouse folder for one interpreter and machine, as run_host_agent.sh names it."""
    return f"cp{python.replace('.', '')}-{machine}"


def requirements_for(requirements: Sequence[str], python: str, machine: str) -> list[str]:
    """The requirements that apply to that interpreter and machine, markers judged for it
    (pip would judge them by the interpreter building the bundle)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pip always carries its own copy
        from pip._vendor.packaging.requirements import Requirement  # type: ignore[assignment]

    env = {
        "python_version": python,
        "python_full_version": f"{python}.0",
        "platform_machine": machine,
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }
    out = []
    for line in requirements:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(env):
            req.marker = None
            out.append(str(req))
    return out


def build_wheelhouse(
    dest: Path,
    requirements: Sequence[str],
    *,
    pythons: Sequence[str] = AGENT_PYTHONS,
    machines: Sequence[str] = AGENT_MACHINES,
) -> None:
    """Binary wheels of the requirements for each (python, machine): every wheel once under
    ``files/``, and per interpreter and machine a ``<tag>.txt`` naming the ones it takes
    (pure-Python wheels such as botocore's serve every interpreter from one copy)."""
    import shutil
    import tempfile

    files = dest / "files"
    files.mkdir(parents=True, exist_ok=True)
    for python in pythons:
        for machine in machines:
            platforms = [f"manylinux2014_{machine}", f"manylinux_2_17_{machine}", f"manylinux_2_28_{machine}"]
            with tempfile.TemporaryDirectory() as tmp:
                command = [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--disable-pip-version-check",
                    "--no-input",
                    "--only-binary=:all:",
                    "--implementation",
                    "cp",
                    "--python-version",
                    python,
                    *[arg for p in platforms for arg in ("--platform", p)],
                    "--dest",
                    tmp,
                    *requirements_for(requirements, python, machine),
                ]
                result = subprocess.run(command, capture_output=True, text=True, check=False)
                if result.returncode != 0:
                    raise BundlingError(
                        f"pip could not fetch the host agent's wheels for Python {python} on {machine}:\n"
                        f"{result.stderr.strip()[-4000:]}"
                    )
                names = sorted(p.name for p in Path(tmp).glob("*.whl"))
                for name in names:
                    if not (files / name).exists():
                        shutil.copy2(Path(tmp) / name, files / name)
            (dest / f"{wheel_tag(python, machine)}.txt").write_text("".join(f"{n}\n" for n in names))


@dataclass(frozen=True, kw_only=True)
class AgentBundle:
    """Our packages as they are, and a wheelhouse of the agent's dependencies beside them."""

    root: Path
    requirements: tuple[str, ...]
    pythons: tuple[str, ...] = AGENT_PYTHONS
    machines: tuple[str, ...] = AGENT_MACHINES

    @property
    def _packages(self) -> CopyPackages:
        return CopyPackages(
            root=self.root,
            packages=("host_agent", "calque"),
            extra_files=(("requirements.txt", "\n".join(self.requirements) + "\n"),),
        )

    @property
    def fingerprint(self) -> str:
        parts = [self._packages.fingerprint, *self.pythons, *self.machines, *self.requirements]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def build(self, out: Path) -> None:
        self._packages.build(out)
        build_wheelhouse(out / "wheelhouse", self.requirements, pythons=self.pythons, machines=self.machines)


# What a spec or slice id may contain: no single quote, so even an SSM Agent too old for
# environment-variable interpolation cannot be made to run anything else.
_NO_QUOTE = "^[^']*$"
_SLICE_ID = r"^[A-Za-z0-9._:/-]{0,200}$"
_ENDPOINT = r"^(https?://[A-Za-z0-9.:/_-]+)?$"
_FENCE = r"^[0-9]{0,18}$"
_USER = r"^(calque-[0-9a-f]{12})?$"  # a session's account (host_agent.tenants.SESSION_ACCOUNT)
# A session's own account, or a GPU's shared MPS account (MPS slots connect as that one).
_SESSION_USER = r"^calque-([0-9a-f]{12}|mps-g[0-9]{1,3})$"
# base64 only (no space, quote, $, ;, |, &, ...), bounded
_SESSION_COMMAND = r"^[A-Za-z0-9+/]{0,8188}={0,2}$"
_SHA256 = r"^([0-9a-f]{64})?$"
_WORKER_ACTION = r"^(start|stop|status)?$"
_BUNDLE_URL = r"^(https://[^']*)?$"  # an S3 presigned URL (never pasted into the script)


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
        "__P_USER__": p.user,
        "__P_TOKEN__": p.token_sha256,
        "__P_WACTION__": p.worker_action,
        "__P_WORKER__": p.worker,
        "__P_BUNDLE__": p.bundle_url,
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
        self.bundle = s3_assets.Asset(
            self,
            "Bundle",
            **local_asset(
                name="host-agent",
                recipe=AgentBundle(  # type: ignore[arg-type]
                    root=project_root, requirements=agent_requirements(project_root)
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
        self.session_document = self._session_document()
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

    @property
    def session_document_name(self) -> str:
        """What a session's connect command names (calque.contracts.accounts.session_connect_command)."""
        return self.session_document.ref

    def _session_document(self) -> ssm.CfnDocument:
        # Session Manager runs these commands as root (runAsElevated); the agent's login asks for
        # the session's token and only then starts a login shell in the session's own account.
        return ssm.CfnDocument(
            self,
            "SessionDocument",
            document_type="Session",
            document_format="JSON",
            update_method="NewVersion",
            content={
                "schemaVersion": "1.0",
                "description": "Open a shell on a calque host as a session's own account, after "
                "the session's token is given.",
                "sessionType": "InteractiveCommands",
                "parameters": {
                    "user": {
                        "type": "String",
                        "description": "The session's account on the host (calque-<12 hex>), as "
                        "check-out's connect command names it.",
                        "allowedPattern": _SESSION_USER,
                    },
                    "command": {
                        "type": "String",
                        "description": "Empty: a shell. Else one command to run instead (calque session "
                        "exec), base64 of its shell words: no character of it can reach root's shell.",
                        "default": "",
                        "allowedPattern": _SESSION_COMMAND,
                    },
                },
                "properties": {
                    "linux": {
                        "commands": f"{constants.HOST_AGENT_ROOT}/login {{{{ user }}}} {{{{ command }}}}",
                        "runAsElevated": True,
                    }
                },
            },
        )

    def grant_start_session(self, grantee: iam.IGrantable) -> None:
        """Members connect to calque hosts with the session document (and no other)."""
        session_doc = Stack.of(self).format_arn(
            service="ssm", resource="document", resource_name=self.session_document.ref
        )
        instances = Stack.of(self).format_arn(service="ec2", resource="instance", resource_name="*")
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["ssm:StartSession"],
                resources=[session_doc, instances],
                conditions={"BoolIfExists": {"ssm:SessionDocumentAccessCheck": "true"}},
            )
        )

    def start_session_statements(self) -> list[iam.PolicyStatement]:
        """``ssm:StartSession`` with the session document only, and only on calque hosts.

        Two statements: the tag condition can only hold for the instance, and
        ``ssm:SessionDocumentAccessCheck`` makes Session Manager check the document too, so
        a start-session without ``--document-name`` (the default shell document, as
        ``ssm-user``) is refused."""
        session_doc = Stack.of(self).format_arn(
            service="ssm", resource="document", resource_name=self.session_document.ref
        )
        instances = Stack.of(self).format_arn(service="ec2", resource="instance", resource_name="*")
        own_sessions = Stack.of(self).format_arn(
            service="ssm", resource="session", resource_name="${aws:userid}-*"
        )
        return [
            iam.PolicyStatement(actions=["ssm:StartSession"], resources=[session_doc]),
            # Session Manager names a session after its starter's user id: end or resume one's own.
            iam.PolicyStatement(
                actions=["ssm:TerminateSession", "ssm:ResumeSession"], resources=[own_sessions]
            ),
            iam.PolicyStatement(
                actions=["ssm:StartSession"],
                resources=[instances],
                conditions={
                    "StringEquals": {f"ssm:resourceTag/{HOST_TAG_KEY}": HOST_TAG_VALUE},
                    "BoolIfExists": {"ssm:SessionDocumentAccessCheck": "true"},
                },
            ),
        ]

    def allow_start_session(self, policy: iam.ManagedPolicy) -> None:
        """Add ``start_session_statements`` to a managed policy (the members' one)."""
        policy.add_statements(*self.start_session_statements())
        acknowledge(
            policy,
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:ssm:<AWS::Region>:<AWS::AccountId>:"
            "session/<aws:userid>-*]",
            "Session Manager names each session after the user id of who started it: a member may end "
            "or resume their own sessions and no one else's (AWS's end-user policy for Session Manager).",
        )
        acknowledge(
            policy,
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:instance/*]",
            f"Hosts are launched and adopted at run time, so their ids are unknown at deploy time; "
            f"StartSession is allowed only on instances tagged {HOST_TAG_KEY}={HOST_TAG_VALUE} and only "
            "with this stack's session document, whose login asks for the session's token.",
        )

    def _document(self, report_endpoint: str) -> ssm.CfnDocument:
        p = SSM_DOCUMENT_PARAMETERS
        download_dir = f"{constants.HOST_AGENT_ROOT}/downloads/{self.bundle.asset_hash}"
        linux = {"StringEquals": ["platformType", "Linux"]}
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
                    p.user: {
                        "type": "String",
                        "description": "The session's account on the host (grant); empty otherwise.",
                        "default": "",
                        "allowedPattern": _USER,
                        "interpolationType": "ENV_VAR",
                    },
                    p.token_sha256: {
                        "type": "String",
                        "description": "The session token's SHA-256 (grant), which the host asks for at "
                        "login; empty otherwise.",
                        "default": "",
                        "allowedPattern": _SHA256,
                        "interpolationType": "ENV_VAR",
                    },
                    p.worker_action: {
                        "type": "String",
                        "description": "worker: start, stop or status a warm pool's workers; empty "
                        "otherwise.",
                        "default": "",
                        "allowedPattern": _WORKER_ACTION,
                        "interpolationType": "ENV_VAR",
                    },
                    p.worker: {
                        "type": "String",
                        "description": "worker: the pool's worker document as JSON (pool, queue, "
                        "runner, package in the artifact bucket, one worker id per slice).",
                        "default": "",
                        "allowedPattern": _NO_QUOTE,
                        "interpolationType": "ENV_VAR",
                    },
                    p.report_to: {
                        "type": "String",
                        "description": "The control plane endpoint the agent reports to.",
                        "default": report_endpoint,
                        "allowedPattern": _ENDPOINT,
                        "interpolationType": "ENV_VAR",
                    },
                    p.bundle_url: {
                        "type": "String",
                        "description": "A presigned GET of the agent's bundle, downloaded only when "
                        "this version is not installed on the instance.",
                        "default": "",
                        "allowedPattern": _BUNDLE_URL,
                        "interpolationType": "ENV_VAR",
                    },
                },
                "mainSteps": [
                    {
                        "action": "aws:runShellScript",
                        "name": HOST_AGENT_STEP,
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

    @property
    def bundle_location(self) -> str:
        """s3://bucket/key of the agent's bundle, which a sender presigns for the step."""
        return f"s3://{self.bundle.s3_bucket_name}/{self.bundle.s3_object_key}"

    def grant_send_command(self, grantee: iam.IGrantable) -> None:
        """Run this document, only on instances tagged as calque hosts, and presign its bundle
        (a presigned URL carries the signer's own right to read that one object)."""
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject"],
                resources=[self.bundle.bucket.arn_for_objects(self.bundle.s3_object_key)],
            )
        )
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

    def grant_read_invocations(self, grantee: iam.IGrantable) -> None:
        """How a command ended (the pool scaler's worker start: a start that failed gives its
        instance back at once)."""
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(actions=["ssm:GetCommandInvocation"], resources=["*"])
        )
        acknowledge(
            grantee.grant_principal,  # type: ignore[arg-type]
            "AwsSolutions-IAM5[Resource::*]",
            "ssm:GetCommandInvocation supports no resource-level permissions; it reads how a "
            "command ended and changes nothing.",
        )

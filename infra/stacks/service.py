"""The service: the API, one function per calque.resources.FUNCTIONS, queues, schedules, hosts.

Constructs come from infra/components; this stack composes them and does every grant
between them, following calque.resources.FUNCTION_WIRING.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aws_cdk import Annotations, Aws, CfnOutput, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from constructs import Construct

from calque import resources
from calque.settings import ApiSettings
from infra import constants
from infra.components.admin_pins import AdminPins
from infra.components.alarms import OperationsAlarms
from infra.components.apigateway_account import ApiGatewayAccountRole
from infra.components.fleet_network import FleetNetwork, FleetNetworkConfig
from infra.components.host_agent import HostAgent
from infra.components.host_report_api import HostReportApi
from infra.components.pools import PoolsAccess
from infra.components.python_packaging import PythonPackaging
from infra.components.registry_table import RegistryTable
from infra.components.rest_api import ControlPlaneApi, iam5_finding
from infra.components.schedule import Schedule
from infra.components.service_function import ServiceFunction
from infra.components.work_queue import WorkQueue
from infra.config import DeploymentConfig
from infra.nag import acknowledge

# Our own code shipped to every function (its dependencies travel in a layer).
_LAMBDA_PACKAGES = ("calque", "functions")
_LOG_RETENTION = logs.RetentionDays.THREE_MONTHS


@dataclass(frozen=True)
class _Binding:
    """What a FUNCTION_WIRING entry gives a function: environment variables and a grant."""

    environment: Mapping[str, str]
    grant: Callable[[iam.IGrantable], Any] | None = None


class ServiceStack(Stack):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        registry: RegistryTable,
        config: DeploymentConfig,
        project_root: Path,
        artifacts: s3.IBucket | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.registry = registry
        self._session_named_roles = tuple(dict.fromkeys(("AWSReservedSSO_*", *config.session_named_roles)))
        self._fleet_ami_id = config.fleet_ami_id
        self.artifacts = artifacts  # warm pools: manifests and results (the stateful stack's bucket)
        packaging = PythonPackaging(
            self,
            "Packaging",
            project_root=project_root,
            packages=_LAMBDA_PACKAGES,
            cache_dir=config.bundle_cache_dir,
        )
        common_env = self._common_environment(config)
        self.functions = {
            definition.id: ServiceFunction(
                self,
                f"{constants.pascal_case(definition.id)}Function",
                definition=definition,
                packaging=packaging,
                environment=common_env,
                log_retention=_LOG_RETENTION,
            )
            for definition in resources.FUNCTIONS
        }
        self.api = ControlPlaneApi(
            self,
            "Api",
            handler=self.functions["api"].function,
            log_retention=_LOG_RETENTION,
            organization_id=config.organization_id,
            create_cloudwatch_role=config.apigateway_cloudwatch_role == "create",
        )
        self.fleet_network = FleetNetwork(
            self, "FleetNetwork", config=FleetNetworkConfig.from_context(self.node)
        )
        self.host_api = self._host_report_api(config)
        # Where hosts (the agent, pool workers) report: the private API their network reaches.
        self.host_endpoint = self.host_api.url if self.host_api is not None else self.api.url
        self._apigateway_account(config)
        self.queues = {
            queue.id: WorkQueue(
                self,
                f"{constants.pascal_case(queue.id)}Queue",
                definition=queue,
                consumer=self.functions[queue.consumer].function,
            )
            for queue in resources.QUEUES
        }
        self.schedules = {
            schedule.id: Schedule(
                self,
                f"{constants.pascal_case(schedule.id)}Schedule",
                definition=schedule,
                target=self.functions[schedule.target].function,
            )
            for schedule in resources.SCHEDULES
        }
        self.host_agent = HostAgent(
            self,
            "HostAgent",
            project_root=project_root,
            cache_dir=config.bundle_cache_dir,
            report_endpoint=self.host_endpoint,
        )
        self._grant_report(
            constants.HOST_REPORT_PATH,
            "The wildcard is the {instance_id} segment of the report route, which exists "
            "for every host; the API accepts a report only from the instance the path names.",
        )
        # The host role's sessions may call the report routes (the agent's, and the pool
        # workers' on its instance, with their credentials route) and nothing else.
        self.api.restrict_to_routes(
            self.host_agent.role,
            method=constants.HOST_REPORT_METHOD,
            paths=(constants.HOST_REPORT_PATH, *constants.POOL_HOST_PATHS),
        )
        self._add_pools()
        self._add_fleet(config)
        self._wire_functions()
        self._outputs()
        self._fleet_outputs()
        self._identity_and_operations(config)

    def _common_environment(self, config: DeploymentConfig) -> dict[str, str]:
        admins = (
            AdminPins(self, "AdminPins", admins=config.admins, epoch=config.admin_pin_epoch).value
            if config.pin_admins
            else ",".join(config.admins)
        )
        env = {resources.ENV_ADMINS: admins}
        if not config.admins:
            Annotations.of(self).add_warning_v2(
                "calque:no-admins",
                f"No admins configured: pass -c {constants.CONTEXT_ADMINS}=PRINCIPAL[,PRINCIPAL...] or no "
                "one can register hosts, create pools or set quotas.",
            )
        if config.session_ttl_max_s is not None:
            alias = ApiSettings.model_fields["session_ttl_max_s"].alias
            assert alias is not None
            env[alias] = str(config.session_ttl_max_s)
        if config.other_accounts is not None:
            env[resources.ENV_OTHER_ACCOUNTS] = config.other_accounts
        return env

    def _bindings(self) -> dict[str, _Binding]:
        bindings = {
            "table": _Binding(
                environment={resources.ENV_TABLE_NAME: self.registry.table.table_name},
                grant=self.registry.grant_read_write,
            ),
            # An admin's quota listing scans for the quota items (calque.members.store.quota_users).
            "table_scan": _Binding(environment={}, grant=self.registry.grant_scan),
            "host_role": _Binding(
                environment={
                    resources.ENV_HOST_ROLE_NAME: self.host_agent.role.role_name,
                    # Its unique id: a same-named role elsewhere, or created again, is not this host.
                    _alias("host_role_id"): self.host_agent.role.role_id,
                    _alias("account_id"): Aws.ACCOUNT_ID,
                    _alias("session_named_roles"): ",".join(self._session_named_roles),
                }
            ),
            "ssm_document": _Binding(
                environment={
                    resources.ENV_SSM_DOCUMENT_NAME: self.host_agent.document_name,
                    resources.ENV_AGENT_BUNDLE: self.host_agent.bundle_location,
                },
                grant=self.host_agent.grant_send_command,
            ),
            "ssm_invocations": _Binding(environment={}, grant=self.host_agent.grant_read_invocations),
            # Where the host agent and pool workers report (host_tasks and the scaler send it).
            "api_endpoint": _Binding(environment={resources.ENV_API_ENDPOINT: self.host_endpoint}),
        }
        # Tenants isolated on the host: check-out's connect command names the session document.
        bindings["session_document"] = _Binding(
            environment={resources.ENV_SESSION_DOCUMENT_NAME: self.host_agent.session_document_name}
        )
        for queue_id, work_queue in self.queues.items():
            bindings[f"{queue_id}_queue"] = _Binding(
                environment={_queue_env(queue_id): work_queue.queue.queue_url},
                grant=work_queue.queue.grant_send_messages,
            )
        if self.pools is not None:  # warm pools
            bindings["artifact_bucket"] = _Binding(
                environment={resources.ENV_ARTIFACT_BUCKET: self.pools.bucket.bucket_name}
            )
            bindings["pool_queues"] = _Binding(
                environment={resources.ENV_POOL_QUEUE_PREFIX: self.pools.queue_prefix},
                grant=self.pools.grant_control,
            )
            assert self.pools.worker_role is not None
            worker_role = {resources.ENV_POOL_WORKER_ROLE_ARN: self.pools.worker_role.role_arn}
            # The API vends workers' credentials; the scaler tells workers to fetch them.
            bindings["pool_worker_credentials"] = _Binding(
                environment=worker_role, grant=self.pools.grant_vend
            )
            bindings["pool_worker_role"] = _Binding(environment=worker_role)
            bindings["pool_dead_letters"] = _Binding(
                environment={resources.ENV_POOL_QUEUE_PREFIX: self.pools.queue_prefix},
                grant=self.pools.grant_dead_letters,
            )
        bindings.update(self._fleet_bindings())
        return bindings

    def _add_pools(self) -> None:
        """Warm pools: functions manage per-pool queues; GPU hosts run the pool workers, which
        reach their own pool's queue and objects only, with credentials the API vends."""
        self.pools: PoolsAccess | None = None
        if self.artifacts is None:
            return
        self.pools = PoolsAccess(
            self, "Pools", bucket=self.artifacts, queue_prefix=resources.POOL_QUEUE_PREFIX_DEPLOYED
        )
        # The host role reaches no pool's queue or objects: its workers fetch credentials scoped
        # to their own pool from the API, which alone may assume the pool worker role.
        api_role = self.functions["api"].function.role
        assert api_role is not None
        self.pools.add_worker_role(api_role)
        for path in constants.POOL_HOST_PATHS:
            self._grant_report(
                path,
                "The wildcards are the {name}, {claim_id} and {worker_id} segments of the "
                "pool report and credentials routes; the API answers only a worker of that pool, on "
                "the instance the request names, signed by that instance's role.",
            )

    def _wire_functions(self) -> None:
        bindings = self._bindings()
        for function_id, wiring in resources.FUNCTION_WIRING.items():
            service_function = self.functions[function_id]
            for name in wiring:
                if name not in bindings:
                    raise KeyError(
                        f"FUNCTION_WIRING[{function_id!r}] names {name!r}, which the "
                        f"service stack does not provide (known: {sorted(bindings)})"
                    )
                binding = bindings[name]
                service_function.add_environment(binding.environment)
                if binding.grant is not None:
                    binding.grant(service_function.function)

    def _outputs(self) -> None:
        CfnOutput(
            self,
            constants.OUTPUT_API_ENDPOINT,
            value=self.api.url,
            description="The calque API (IAM/SigV4 authorization)",
        )
        for queue in resources.QUEUES:
            CfnOutput(self, constants.queue_url_output(queue), value=self.queues[queue.id].queue.queue_url)
        CfnOutput(
            self,
            constants.OUTPUT_SSM_DOCUMENT_NAME,
            value=self.host_agent.document_name,
            description="SSM Command document that runs the host agent",
        )
        CfnOutput(self, constants.OUTPUT_HOST_ROLE_NAME, value=self.host_agent.role.role_name)
        CfnOutput(
            self,
            constants.OUTPUT_HOST_INSTANCE_PROFILE_NAME,
            value=self.host_agent.instance_profile.instance_profile_name,
            description="Instance profile for GPU hosts the control plane manages",
        )

    # ---- identity and operations: who may call, and what an operator is told ------------------

    def _identity_and_operations(self, config: DeploymentConfig) -> None:
        members = self.api.invoke_policy(
            self,
            "MembersPolicy",
            routes=constants.MEMBER_ROUTES,
            description="calque members: call what members may call (their own sessions, claims, usage)",
            reason="Each * is one path parameter of a member route (a session id, a pool name); the API "
            "itself decides per request whose resource it is.",
        )
        admins = self.api.invoke_policy(
            self,
            "AdminsPolicy",
            routes=(("*", "/*"),),
            description="calque admins: call every route (and add the admin entry in calque:admins)",
            reason="Admins may call every route of this one API; the policy names the API and its stage.",
        )
        # Members connect to their session's host with the session document, and no other.
        self.host_agent.allow_start_session(members)
        CfnOutput(
            self,
            constants.OUTPUT_MEMBERS_POLICY_ARN,
            value=members.managed_policy_arn,
            description="Attach to members' users, groups or roles (execute-api:Invoke on member routes)",
        )
        CfnOutput(
            self,
            constants.OUTPUT_ADMINS_POLICY_ARN,
            value=admins.managed_policy_arn,
            description="Attach to admins' users or roles (execute-api:Invoke on every route)",
        )
        self.alarms = OperationsAlarms(
            self,
            "Alarms",
            functions={fid: f.function for fid, f in self.functions.items()},
            dead_letter_queues={qid: q.dead_letter_queue for qid, q in self.queues.items()},
            schedules={s.id: s for s in resources.SCHEDULES},
            failure_metrics=resources.FAILURE_METRICS,
            topic_arn=config.alarm_topic_arn,
        )

    # ---- how hosts reach the API, and the account's API Gateway logging role --------------------

    def _host_report_api(self, config: DeploymentConfig) -> HostReportApi | None:
        """A private API for the reports where the fleet network has an execute-api endpoint
        (which reaches private APIs only); else hosts report to the public API."""
        network = self.fleet_network
        if network.execute_api_endpoint_id is None:
            return None
        paths = [constants.HOST_REPORT_PATH]
        if self.artifacts is not None:
            paths += list(constants.POOL_HOST_PATHS)
        return HostReportApi(
            self,
            "HostReportApi",
            handler=self.functions["api"].function,
            endpoint_id=network.execute_api_endpoint_id,
            endpoint=network.execute_api_endpoint,
            report_paths=paths,
            log_retention=_LOG_RETENTION,
            organization_id=config.organization_id,
        )

    def _grant_report(self, path: str, reason: str) -> None:
        """The host role may call ``POST path`` on the API hosts report to."""
        role = self.host_agent.role
        if self.host_api is None:
            self.api.grant_invoke(
                role, method=constants.HOST_REPORT_METHOD, path=path, wildcard_reason=reason
            )
            return
        self.host_api.grant_report(role, path)
        acknowledge(role, iam5_finding(self.host_api.api, constants.HOST_REPORT_METHOD, path), reason)

    def _apigateway_account(self, config: DeploymentConfig) -> None:
        stages = [self.api.api.deployment_stage]
        if self.host_api is not None:
            stages.append(self.host_api.api.deployment_stage)
        if config.apigateway_cloudwatch_role == "auto":
            account = ApiGatewayAccountRole(self, "ApiGatewayAccountRole", log_retention=_LOG_RETENTION)
            for stage in stages:
                account.before(stage)
            outcome = account.outcome
        elif config.apigateway_cloudwatch_role == "create":
            for stage in stages[1:]:  # CDK's own account setting comes before the public stage
                stage.node.add_dependency(stages[0])
            outcome = f"set this stack's role ({constants.CONTEXT_APIGATEWAY_CLOUDWATCH_ROLE}=true)"
        else:
            outcome = f"left as the account has it ({constants.CONTEXT_APIGATEWAY_CLOUDWATCH_ROLE}=false)"
        CfnOutput(
            self,
            constants.OUTPUT_APIGATEWAY_CLOUDWATCH_ROLE,
            value=outcome,
            description="What this deploy did with API Gateway's account-wide CloudWatch role",
        )
        CfnOutput(
            self,
            constants.OUTPUT_HOST_REPORT_ENDPOINT,
            value=self.host_endpoint,
            description="Where hosts report: the private API their network reaches, or the public one",
        )

    # ---- the fleet (layer 0) ---------------------------------------------------------------------

    def _add_fleet(self, config: DeploymentConfig) -> None:
        from infra.components.fleet import FleetLaunch

        self.fleet = FleetLaunch(
            self,
            "Fleet",
            network=self.fleet_network,
            host_role=self.host_agent.role,
            instance_profile=self.host_agent.instance_profile,
            ebs_kms_key_arn=config.fleet_ebs_kms_key_arn,
        )
        for rule in resources.EVENT_RULES:
            self.fleet.add_event_rule(rule, self.functions[rule.target].function)

    def _fleet_bindings(self) -> dict[str, _Binding]:
        launch_env = {
            resources.ENV_FLEET_LAUNCH_TEMPLATE: self.fleet.launch_template_name,
            resources.ENV_FLEET_SUBNETS: ",".join(self.fleet_network.subnets),
        }
        if self._fleet_ami_id is not None:
            launch_env[resources.ENV_FLEET_AMI_ID] = self._fleet_ami_id
        return {
            "fleet_launch": _Binding(environment=launch_env, grant=self.fleet.grant_launch),
            "fleet_describe": _Binding(environment=launch_env, grant=self.fleet.grant_describe),
            # An admin's host registration asks EC2 about the instance, and a host whose MIG mode
            # applies only at boot is rebooted (calque.tenancy.lifecycle).
            "instance_describe": _Binding(environment={}, grant=self._grant_instance_checks),
            "events": _Binding(
                environment={resources.ENV_EVENT_BUS: "default"}, grant=self.fleet.grant_publish
            ),
        }

    def _grant_instance_checks(self, grantee: iam.IGrantable) -> None:
        self.fleet.grant_describe(grantee, instances_only=True)
        self.fleet.grant_reboot(grantee)

    def _fleet_outputs(self) -> None:
        CfnOutput(
            self,
            constants.OUTPUT_FLEET_LAUNCH_TEMPLATE,
            value=self.fleet.launch_template_name,
            description="The launch template every fleet instance starts from (IMDSv2, encrypted EBS)",
        )
        CfnOutput(self, constants.OUTPUT_FLEET_VPC_ID, value=self.fleet_network.vpc.vpc_id)


def _alias(field: str) -> str:
    alias = ApiSettings.model_fields[field].alias
    assert alias is not None
    return alias


def _queue_env(queue_id: str) -> str:
    """The variable a function reads a queue's URL from: resources.ENV_<ID>_QUEUE_URL."""
    return str(getattr(resources, f"ENV_{queue_id.upper()}_QUEUE_URL"))

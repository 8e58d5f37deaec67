"""cdk-nag's AwsSolutions pack as a synth-time validation plugin, and acknowledgments.

An unacknowledged error fails the synth. Every acknowledgment sits next to the
resource it concerns and carries the reason a security reviewer would read.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, App, Stack, Token, Validations
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct

# How cdk-nag writes the pseudo parameters in a finding's resource, when they are unresolved.
_PSEUDO_PARAMETERS = ("<AWS::Partition>", "<AWS::Region>", "<AWS::AccountId>")


def add_checks(app: App) -> None:
    Validations.of(app).add_plugins(AwsSolutionsChecks(app, verbose=True))


def acknowledge(scope: IConstruct, rule_id: str, reason: str) -> None:
    """Acknowledge one finding (e.g. ``AwsSolutions-IAM5[Resource::*]``) on ``scope`` and below.

    ``rule_id`` names ARNs with ``<AWS::Partition>``, ``<AWS::Region>`` and ``<AWS::AccountId>``,
    as cdk-nag writes them in an environment-agnostic stack. Where the stack is bound to an
    account and region (``cdk deploy`` with credentials: the CLI sets CDK_DEFAULT_ACCOUNT and
    CDK_DEFAULT_REGION), the ARNs CDK formats carry them as literals, and so does cdk-nag's
    finding; both spellings are acknowledged."""
    validations = Validations.of(scope)
    for finding in dict.fromkeys((rule_id, in_environment(scope, rule_id))):
        validations.acknowledge(Acknowledgment(id=finding, reason=reason))


def in_environment(scope: IConstruct, rule_id: str) -> str:
    """``rule_id`` with the pseudo parameters that ``scope``'s stack knows as literals."""
    stack = Stack.of(scope)
    for placeholder, value in zip(
        _PSEUDO_PARAMETERS, (stack.partition, stack.region, stack.account), strict=True
    ):
        if not Token.is_unresolved(value):
            rule_id = rule_id.replace(placeholder, value)
    return rule_id

"""cdk-nag's AwsSolutions pack as a synth-time validation plugin, and acknowledgments.

An unacknowledged error fails the synth. Every acknowledgment sits next to the
resource it concerns and carries the reason a security reviewer would read.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, App, Validations
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct


def add_checks(app: App) -> None:
    Validations.of(app).add_plugins(AwsSolutionsChecks(app, verbose=True))


def acknowledge(scope: IConstruct, rule_id: str, reason: str) -> None:
    """Acknowledge one finding (e.g. ``AwsSolutions-IAM5[Resource::*]``) on ``scope`` and below."""
    Validations.of(scope).acknowledge(Acknowledgment(id=rule_id, reason=reason))

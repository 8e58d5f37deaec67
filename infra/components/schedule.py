"""An EventBridge schedule that invokes one function at a fixed rate."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from calque.resources import ScheduleDef


class Schedule(Construct):
    """A missed tick is not retried for long: the next one comes within ``rate_s`` anyway."""

    def __init__(
        self, scope: Construct, construct_id: str, *, definition: ScheduleDef, target: lambda_.IFunction
    ) -> None:
        super().__init__(scope, construct_id)
        self.rule = events.Rule(
            self,
            "Rule",
            description=definition.description or f"calque {definition.id}",
            schedule=events.Schedule.rate(Duration.seconds(definition.rate_s)),
            targets=[
                targets.LambdaFunction(
                    target,
                    retry_attempts=2,
                    max_event_age=Duration.seconds(max(60, definition.rate_s)),
                )
            ],
        )

"""Alarms an operator acts on: messages in a dead-letter queue, function errors, a count
of partial failures a function publishes while it still succeeds (a pool it could not
scale), and a schedule whose function stopped running (its invocations went missing).
Each notifies the SNS topic the admin named, if any."""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from calque.resources import METRICS_NAMESPACE, FailureMetricDef, ScheduleDef


class OperationsAlarms(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        functions: Mapping[str, lambda_.IFunction],
        dead_letter_queues: Mapping[str, sqs.IQueue],
        schedules: Mapping[str, ScheduleDef],
        failure_metrics: tuple[FailureMetricDef, ...] = (),
        topic_arn: str | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.topic = sns.Topic.from_topic_arn(self, "Topic", topic_arn) if topic_arn else None
        self.alarms: dict[str, cloudwatch.Alarm] = {}
        for queue_id, dlq in dead_letter_queues.items():
            self._add(
                f"{queue_id}-dead-letters",
                dlq.metric_approximate_number_of_messages_visible(
                    period=Duration.minutes(5), statistic="Maximum"
                ),
                threshold=1,
                comparison=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                missing=cloudwatch.TreatMissingData.NOT_BREACHING,
                description=f"Messages of the {queue_id} queue failed every retry and wait in its "
                "dead-letter queue: inspect them, fix the cause, then redrive.",
            )
        for function_id, function in functions.items():
            self._add(
                f"{function_id}-errors",
                function.metric_errors(period=Duration.minutes(5), statistic="Sum"),
                threshold=1,
                comparison=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                missing=cloudwatch.TreatMissingData.NOT_BREACHING,
                description=f"The {function_id} function failed (an unhandled error or a timeout); "
                "see its log group.",
            )
        for failure in failure_metrics:
            if failure.function not in functions:
                raise ValueError(f"failure metric {failure.metric}: no function {failure.function!r}")
            self._add(
                f"{failure.function}-{failure.metric}",
                cloudwatch.Metric(
                    namespace=METRICS_NAMESPACE,
                    metric_name=failure.metric,
                    # Powertools' EMF: the service dimension is the function's id
                    dimensions_map={"service": failure.function},
                    period=Duration.minutes(5),
                    statistic="Sum",
                ),
                threshold=1,
                comparison=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                missing=cloudwatch.TreatMissingData.NOT_BREACHING,
                description=failure.description,
            )
        for schedule_id, schedule in schedules.items():
            # Three missed ticks in a row: a disabled rule, a throttled or broken target.
            window = max(300, 3 * schedule.rate_s)
            self._add(
                f"{schedule_id}-stopped",
                functions[schedule.target].metric_invocations(
                    period=Duration.seconds(window), statistic="Sum"
                ),
                threshold=1,
                comparison=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
                missing=cloudwatch.TreatMissingData.BREACHING,
                description=f"The {schedule_id} schedule has not run its function for {window} s: "
                "expired sessions are not being ended."
                if schedule.target == "reaper"
                else f"The {schedule_id} schedule has not run its function for {window} s.",
            )

    def _add(
        self,
        name: str,
        metric: cloudwatch.Metric,
        *,
        threshold: float,
        comparison: cloudwatch.ComparisonOperator,
        missing: cloudwatch.TreatMissingData,
        description: str,
    ) -> None:
        alarm = cloudwatch.Alarm(
            self,
            "".join(part.capitalize() for part in name.replace("_", "-").split("-")),
            metric=metric,
            threshold=threshold,
            evaluation_periods=1,
            comparison_operator=comparison,
            treat_missing_data=missing,
            alarm_description=description,
        )
        if self.topic is not None:
            alarm.add_alarm_action(actions.SnsAction(self.topic))
            alarm.add_ok_action(actions.SnsAction(self.topic))
        self.alarms[name] = alarm

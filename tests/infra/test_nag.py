"""cdk-nag's AwsSolutions pack runs at synth and fails it on an unacknowledged finding."""

from __future__ import annotations

import pytest

from .conftest import ADMINS, synth_context

pytestmark = pytest.mark.infra


def test_synth_passes_cdk_nag(synthesized) -> None:
    # Given the whole app synthesized with cdk-nag as a validation plugin (the fixture)
    # Then both stacks came out: no finding was left unacknowledged
    assert synthesized.stateful_json["Resources"]
    assert synthesized.service_json["Resources"]


def test_an_unacknowledged_finding_fails_the_synth(tmp_path) -> None:
    from aws_cdk import App
    from aws_cdk import aws_sqs as sqs

    from infra.deployment import build

    # Given the app, plus a queue with no DLQ, no encryption and no TLS policy
    app = App(context=synth_context(**{"calque:admins": ADMINS}), outdir=str(tmp_path))
    deployment = build(app)
    sqs.Queue(deployment.service, "CarelessQueue")
    # When it is synthesized
    # Then cdk-nag refuses it, naming the rule
    with pytest.raises(RuntimeError, match=r"ValidationFailed(.|\n)*AwsSolutions-SQS4"):
        app.synth()

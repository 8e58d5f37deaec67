#!/usr/bin/env python3
"""The calque CDK app. Synthesizes with no AWS credentials and makes no AWS call.

    npx aws-cdk deploy --all -c calque:admins=arn:aws:iam::123456789012:role/GpuAdmins

See docs/deploy.md.
"""

from __future__ import annotations

import os

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from aws_cdk import App

from infra.deployment import build, project_context


def main() -> None:
    # Under the CDK CLI the output directory comes from it; run directly, keep it where `cdk` would.
    app = App(context=project_context(), outdir=None if os.environ.get("CDK_OUTDIR") else "cdk.out")
    build(app)
    app.synth()


if __name__ == "__main__":
    main()

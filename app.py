#!/usr/bin/env python3
"""The calque CDK app. Synthesizes with no AWS credentials and makes no AWS call.

    npx aws-cdk deploy --all -c calque:admins=arn:aws:iam::123456789012:role/GpuAdmins

See docs/deploy.md.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from aws_cdk import App

from infra.config import ConfigError
from infra.deployment import build, project_context


def main() -> int:
    # Under the CDK CLI the output directory comes from it; run directly, keep it where `cdk` would.
    app = App(context=project_context(), outdir=None if os.environ.get("CDK_OUTDIR") else "cdk.out")
    try:
        build(app)
    except ConfigError as exc:
        # A context value the admin passed: one line naming the key, not a traceback.
        print(f"error: {exc}", file=sys.stderr)
        return 1
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())

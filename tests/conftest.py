"""Suite-wide fixtures. Every test starts from clean caches and a plain environment."""

from __future__ import annotations

import os

import pytest

# Nothing in the suite may reach a real AWS endpoint or the user's own AWS configuration.
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "1")
os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "Calque")
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
for _var in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
    os.environ.pop(_var, None)
os.environ["AWS_CONFIG_FILE"] = os.devnull
os.environ["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull


@pytest.fixture(autouse=True)
def _reset_caches():
    from calque import aws, settings

    settings.clear_caches()
    aws.clear_caches()
    yield
    settings.clear_caches()
    aws.clear_caches()

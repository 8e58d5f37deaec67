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
# ... nor the user's saved calque configurations (calque configure), which would beat the local plane.
os.environ.pop("CALQUE_CONFIG", None)
os.environ["CALQUE_CONFIG_FILE"] = os.devnull


@pytest.fixture(autouse=True)
def _reset_caches():
    from calque import aws, settings

    settings.clear_caches()
    aws.clear_caches()
    yield
    settings.clear_caches()
    aws.clear_caches()


# The order files are dealt to the parallel workers, longest first so that none is left to
# run alone at the end: the tests marked ``long`` (the modules of a minute or more: a whole
# trace replayed, a fuzz run, kill -9 rounds, the infra synth), then by tier: the integration
# files (each minutes of waiting on a local plane), the unit files (seconds each) last, to fill
# the gaps; within that, the order pytest collects.
_TIER_ORDER = ("tests/integration/", "tests/infra/", "tests/gpu/", "tests/unit/")


def _tier(nodeid: str) -> int:
    return next((n for n, prefix in enumerate(_TIER_ORDER) if nodeid.startswith(prefix)), len(_TIER_ORDER))


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects: a unit file is never left out of ``-m unit``
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith("tests/unit/") and item.get_closest_marker("unit") is None:
            item.add_marker(pytest.mark.unit)
    # stable: a file's tests stay in order; the ``long`` ones first, whatever their tier
    items.sort(key=lambda item: (item.get_closest_marker("long") is None, _tier(item.nodeid)))


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under ``--dist loadfile``, whole files go to one worker, and the infra tests all to
    the same one: each worker that touches the CDK starts its own jsii runtime (a Node.js
    process holding aws-cdk-lib, seconds of CPU), and they share one synthesis anyway."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FilesAndInfra(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "tests/infra/" if path.startswith("tests/infra/") else path

    return FilesAndInfra(config, log)

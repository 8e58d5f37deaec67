from __future__ import annotations

import json

import pytest

from tests.integration.host_box.box import Box, can_run

MIG4 = json.dumps({"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]})


@pytest.fixture(scope="module")
def box():
    why = can_run()
    if why is not None:
        pytest.skip(f"the host box {why}")
    b = Box().start()
    try:
        applied = b.agent("--simulate", "g7e.2xlarge", "apply", "--spec", MIG4)
        assert applied.returncode == 0, applied.stderr
        yield b
    finally:
        b.close()

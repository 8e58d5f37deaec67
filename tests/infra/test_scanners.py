"""cfn-lint and checkov over the synthesized templates: no finding but those accepted, with
their reasons, in infra/scan_findings.py, and no accepted one that no longer occurs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from infra.scan_findings import CFN_LINT_ACCEPTED, CHECKOV_ACCEPTED

from .conftest import Synthesized

pytestmark = pytest.mark.infra

ROOT = Path(__file__).resolve().parents[2]


def _templates(synthesized: Synthesized) -> list[Path]:
    return sorted(synthesized.outdir.glob("*.template.json"))


def test_cfn_lint_finds_nothing_but_what_is_accepted(synthesized: Synthesized):
    from cfnlint.api import ManualArgs, lint_file

    found: Counter[str] = Counter()
    for template in _templates(synthesized):
        for match in lint_file(template, config=ManualArgs(regions=["us-east-1"])):
            found[match.rule.id] += 1
    unexpected = {rule: n for rule, n in found.items() if rule not in CFN_LINT_ACCEPTED}
    assert not unexpected, f"cfn-lint: fix these or accept them in infra/scan_findings.py: {unexpected}"
    assert set(CFN_LINT_ACCEPTED) <= set(found), f"no longer found: {set(CFN_LINT_ACCEPTED) - set(found)}"


def _checkov() -> str | None:
    """checkov lives in its own environment (`make scan-tools`): its pins of boto3 and botocore
    are older than the project's, so it cannot share the dev virtualenv."""
    for candidate in (os.environ.get("CHECKOV"), str(ROOT / ".tools-venv" / "bin" / "checkov")):
        if candidate and Path(candidate).exists():
            return candidate
    return shutil.which("checkov")


def test_checkov_finds_nothing_but_what_is_accepted(synthesized: Synthesized, tmp_path: Path):
    checkov = _checkov()
    if checkov is None:
        pytest.skip("checkov is not installed: `make scan-tools` (or set CHECKOV=/path/to/checkov)")
    for template in _templates(synthesized):
        shutil.copy(template, tmp_path / template.name)
    result = subprocess.run(
        [checkov, "-d", str(tmp_path), "--framework", "cloudformation", "--skip-download", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    found = Counter(f["check_id"] for r in reports for f in r.get("results", {}).get("failed_checks", []))
    assert sum(r["summary"]["passed"] for r in reports) > 0, result.stderr[-3000:]  # it read them
    unexpected = {check: n for check, n in found.items() if check not in CHECKOV_ACCEPTED}
    assert not unexpected, f"checkov: fix these or accept them in infra/scan_findings.py: {unexpected}"
    assert set(CHECKOV_ACCEPTED) <= set(found), f"no longer found: {set(CHECKOV_ACCEPTED) - set(found)}"

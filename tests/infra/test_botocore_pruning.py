"""The layer's botocore keeps only the models of the services the functions call
(infra.bundling.prune_botocore), and those clients resolve exactly as botocore's full copy
resolves them: same endpoints, same signing, in every partition."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import botocore
import botocore.session
import pytest

from calque import aws
from infra.bundling import BundlingError, prune_botocore
from infra.deployment import PROJECT_ROOT

pytestmark = pytest.mark.infra

REGIONS = ("us-east-1", "eu-west-1", "ap-southeast-2", "cn-north-1", "us-gov-west-1")
# What a client's resolution is made of, for every service in every region above.
RESOLVE = """
import json, sys
services, regions, site = json.loads(sys.argv[1])
sys.path[:0] = [site] if site else []
import botocore, botocore.session
from botocore.exceptions import UnknownServiceError
session = botocore.session.get_session()
out = {"botocore": botocore.__file__, "clients": {}}
for service in services:
    for region in regions:
        m = session.create_client(service, region_name=region,
                                  aws_access_key_id="k", aws_secret_access_key="s").meta
        out["clients"][f"{service} {region}"] = [m.endpoint_url, m.region_name, m.service_model.signing_name,
                                                 m.service_model.signature_version, m.partition,
                                                 sorted(m.service_model.operation_names)]
try:
    session.create_client("rds", region_name="us-east-1")
    out["rds"] = "made"
except UnknownServiceError as e:
    out["rds"] = str(e)
print(json.dumps(out))
"""


def _resolve(site: Path | None, services: list[str]) -> dict:
    args = json.dumps([services, list(REGIONS), site and str(site)])
    quiet = {"AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
    done = subprocess.run(
        [sys.executable, "-I", "-B", "-c", RESOLVE, args],
        env={"PATH": "/usr/bin:/bin", **quiet},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_pruned_botocore_keeps_only_our_services_and_resolves_them_as_the_full_copy(tmp_path) -> None:
    # Given a copy of the installed botocore, pruned as the layer's is
    site = tmp_path / "site"
    shutil.copytree(Path(botocore.__file__).parent, site / "botocore")
    prune_botocore(site, aws.SERVICES)
    data = site / "botocore" / "data"
    # Then only our services' models are left, beside botocore's shared files
    assert {p.name for p in data.iterdir() if p.is_dir()} == set(aws.SERVICES)
    for shared in ("endpoints.json", "partitions.json", "_retry.json", "sdk-default-configuration.json"):
        assert (data / shared).is_file(), shared
    # And endpoints.json keeps every partition and region, with only our services in each
    full = json.loads((Path(botocore.__file__).parent / "data" / "endpoints.json").read_text())
    pruned = json.loads((data / "endpoints.json").read_text())
    assert [p["partition"] for p in pruned["partitions"]] == [p["partition"] for p in full["partitions"]]
    for before, after in zip(full["partitions"], pruned["partitions"], strict=True):
        assert after["regions"] == before["regions"]
        assert after["services"] == {k: v for k, v in before["services"].items() if k in aws.SERVICES}
    # When every one of our clients is made from it, in each partition, and from the full copy
    services = sorted(aws.SERVICES)
    ours = _resolve(site, services)
    theirs = _resolve(None, services)
    assert ours["botocore"].startswith(str(site))
    assert not theirs["botocore"].startswith(str(site))
    # Then each resolves the same endpoint, region, signing and operations
    assert ours["clients"] == theirs["clients"]
    assert len(ours["clients"]) == len(services) * len(REGIONS)
    # And a service it does not carry is unknown to it, but not to the full copy
    assert "Unknown service: 'rds'" in ours["rds"]
    assert theirs["rds"] == "made"


def test_pruning_for_a_service_botocore_does_not_have_fails_and_removes_nothing(tmp_path) -> None:
    site = tmp_path / "site"
    data = site / "botocore" / "data"
    for name in ("dynamodb", "sqs", "rds"):
        (data / name).mkdir(parents=True)
    (data / "endpoints.json").write_text(json.dumps({"partitions": [{"partition": "aws", "services": {}}]}))
    with pytest.raises(BundlingError, match="no model for no-such-service"):
        prune_botocore(site, ["dynamodb", "no-such-service"])
    assert {p.name for p in data.iterdir() if p.is_dir()} == {"dynamodb", "sqs", "rds"}
    with pytest.raises(BundlingError, match="no botocore data"):
        prune_botocore(tmp_path / "empty", ["dynamodb"])


def test_a_client_of_a_service_the_layer_does_not_carry_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"no client for 'rds'.*calque\.aws\.SERVICES"):
        aws.client("rds")
    with pytest.raises(ValueError, match="no client for 'lambda'"):
        aws.single_try_client("lambda")
    with pytest.raises(ValueError, match="no client for 'iam'"):
        _ = aws.lazy_client("iam").get_role


def _named_clients() -> set[tuple[str, str]]:
    """Every service named in a client call of the deployed packages (calque, functions), but
    the rooms that run only on a person's machine, with the botocore they installed (the CLI,
    the SDK, the console: `calque configure --from-stack` reads CloudFormation there)."""
    found = set()
    on_a_laptop = {PROJECT_ROOT / "calque" / room for room in ("cli", "sdk", "console")}
    for package in ("calque", "functions"):
        for path in (PROJECT_ROOT / package).rglob("*.py"):
            if on_a_laptop & set(path.parents):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.Call) and node.args):
                    continue
                fn = node.func
                name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
                first = node.args[0]
                if name in {"client", "lazy_client", "single_try_client", "_client", "create_client"} and (
                    isinstance(first, ast.Constant) and isinstance(first.value, str)
                ):
                    found.add((first.value, str(path.relative_to(PROJECT_ROOT))))
    return found


def test_every_service_the_code_names_is_one_the_layer_carries() -> None:
    named = _named_clients()
    # the scan sees the clients the functions make (a scan finding nothing proves nothing)
    assert {"dynamodb", "sqs", "ec2", "ssm", "s3", "events"} <= {service for service, _ in named}
    assert [(s, where) for s, where in sorted(named) if s not in aws.SERVICES] == []

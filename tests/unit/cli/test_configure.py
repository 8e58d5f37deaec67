"""Named configurations (calque configure): saved per name, read in the order flag,
environment, configuration, running local plane; `calque whoami` says which one it used;
`--from-stack` reads the deployed stack's endpoint output."""

from __future__ import annotations

import json
import stat

import pytest

from calque.cli.context import Context
from tests.unit.cli_support import context, forget_endpoint_and_aws_keys, run_cli, running_plane

pytestmark = pytest.mark.unit

API = "https://abc123.execute-api.eu-west-1.amazonaws.com/prod"


@pytest.fixture
def config_file(tmp_path, monkeypatch):
    forget_endpoint_and_aws_keys(monkeypatch)
    path = tmp_path / "calque" / "config"
    monkeypatch.setenv("CALQUE_CONFIG_FILE", str(path))
    monkeypatch.setenv("CALQUE_LOCAL_STATE_DIR", str(tmp_path / "no-plane"))
    for var in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    return path


@pytest.fixture
def aws_keys(tmp_path, monkeypatch):
    creds = tmp_path / "aws-credentials"
    creds.write_text(
        "[research]\naws_access_key_id = AKIARESEARCH00000000\naws_secret_access_key = s\n"
        "[other]\naws_access_key_id = AKIAOTHER00000000000\naws_secret_access_key = s\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_configure_saves_a_named_configuration_only_its_owner_reads(config_file, capsys):
    code, out, _ = run_cli(
        capsys,
        "configure",
        "--endpoint",
        API,
        "--profile",
        "research",
        "--region",
        "eu-west-1",
        "--output",
        "json",
    )
    assert code == 0
    assert json.loads(out) == {
        "config_name": "default",
        "file": str(config_file),
        "endpoint": API,
        "region": "eu-west-1",
        "profile": "research",
    }
    assert stat.S_IMODE(config_file.stat().st_mode) == 0o600

    # Given another name, When one value is set there, Then the default one is untouched
    assert (
        run_cli(capsys, "--config-name", "lab", "configure", "set", "endpoint", "https://lab.example")[0] == 0
    )
    code, out, _ = run_cli(capsys, "configure", "list", "--output", "json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["default"]["endpoint"] == API
    assert rows["default"]["in_use"] is True
    assert rows["lab"] == {"name": "lab", "endpoint": "https://lab.example", "in_use": False}
    assert run_cli(capsys, "configure", "get", "profile")[1] == "research\n"

    # An empty value clears a key
    assert run_cli(capsys, "configure", "set", "profile", "")[0] == 0
    code, _, err = run_cli(capsys, "configure", "get", "profile")
    assert code == 1
    assert "sets no profile" in err


def test_a_bad_endpoint_or_key_is_refused_and_nothing_is_saved(config_file, capsys):
    code, _, err = run_cli(capsys, "configure", "--endpoint", "abc123.execute-api")
    assert code == 2
    assert "http" in err
    code, _, err = run_cli(capsys, "configure", "set", "regoin", "eu-west-1")
    assert code == 2
    assert "did you mean 'region'" in err
    assert not config_file.exists()


def test_nothing_given_off_a_terminal_is_a_usage_error(config_file, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    code, _, err = run_cli(capsys, "configure")
    assert code == 2
    assert "nothing to save" in err


def _configured(config_file, **values):
    from calque.cli import config

    config.save("default", values, config_file)


def test_the_configured_endpoint_profile_and_region_are_used(config_file, aws_keys):
    _configured(config_file, endpoint=API, profile="research", region="eu-west-1")
    ctx = context()
    creds, region = ctx.credentials_and_region()
    assert ctx.endpoint == API
    assert creds.access_key == "AKIARESEARCH00000000"
    assert region == "eu-west-1"
    assert ctx.sources["endpoint"].startswith("configuration 'default'")
    assert ctx.sources["profile"].startswith("configuration 'default'")


def test_environment_beats_the_configuration_and_a_flag_beats_both(config_file, aws_keys, monkeypatch):
    _configured(config_file, endpoint=API, profile="research", region="eu-west-1")
    monkeypatch.setenv("CALQUE_ENDPOINT", "https://env.example")
    monkeypatch.setenv("AWS_PROFILE", "other")
    monkeypatch.setenv("AWS_REGION", "ap-south-1")
    assert _resolved(context()) == (
        ("https://env.example", "AKIAOTHER00000000000", "ap-south-1"),
        {"endpoint": "CALQUE_ENDPOINT", "profile": "AWS_PROFILE", "region": "AWS_REGION"},
    )
    assert _resolved(context(endpoint="https://flag.example", profile="research", region="us-west-2")) == (
        ("https://flag.example", "AKIARESEARCH00000000", "us-west-2"),
        {"endpoint": "--endpoint", "profile": "--profile", "region": "--region"},
    )


def _resolved(ctx) -> tuple[tuple[str, str, str], dict[str, str]]:
    """(endpoint, access key, region) the CLI would call with, and where each came from."""
    creds, region = ctx.credentials_and_region()
    return (ctx.endpoint, creds.access_key, region), ctx.sources


def test_the_configuration_beats_a_running_local_plane(config_file, aws_keys, tmp_path, monkeypatch):
    _configured(config_file, endpoint=API, profile="research")
    with running_plane(
        tmp_path / "plane", monkeypatch, endpoint="http://127.0.0.1:9999", region="eu-north-1"
    ):
        assert context().endpoint == API
        # another configuration that names no endpoint falls through to the plane
        ctx = context(config_name="empty")
        assert ctx.endpoint == "http://127.0.0.1:9999"
        assert ctx.sources["endpoint"].startswith("the running local plane")


def test_calque_config_names_the_configuration(config_file, monkeypatch):
    from calque.cli import config

    config.save("prod", {"endpoint": API}, config_file)
    monkeypatch.setenv("CALQUE_CONFIG", "prod")
    assert context().endpoint == API
    assert context(config_name="default").sources == {}  # nothing resolved yet


def test_whoami_says_where_each_value_came_from(config_file, aws_keys, monkeypatch, capsys):
    _configured(config_file, endpoint=API, profile="research", region="eu-west-1")

    class Api:
        region = "eu-west-1"

        def request(self, method, path, body=None, query=None):
            return {"principal": "research", "arn": "arn:aws:iam::1:user/r", "account": "1", "admin": False}

    def client(ctx):
        ctx.credentials_and_region()  # resolve as a real call would, then answer without a network
        return Api()

    monkeypatch.setattr(Context, "client", client)
    code, out, _ = run_cli(capsys, "whoami", "--output", "json")
    assert code == 0
    me = json.loads(out)
    assert me["endpoint"] == API
    assert me["endpoint_source"] == f"configuration 'default' ({config_file})"
    assert me["profile_source"] == me["endpoint_source"]
    assert me["region_source"] == me["endpoint_source"]
    assert me["config_name"] == "default"


def test_from_stack_reads_the_endpoint_output(config_file, monkeypatch, capsys):
    import boto3
    from moto import mock_aws

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    template = {
        "Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
        "Outputs": {"ApiEndpoint": {"Value": API}, "TableName": {"Value": "t"}},
    }
    with mock_aws():
        cfn = boto3.client("cloudformation", region_name="eu-west-1")
        cfn.create_stack(StackName="Calque", TemplateBody=json.dumps(template))
        code, _, err = run_cli(capsys, "configure", "--from-stack", "Calque", "--region", "eu-west-1")
        assert code == 0, err
        code, out, err = run_cli(
            capsys, "--output", "json", "configure", "--from-stack", "Nope", "--region", "eu-west-1"
        )
        assert code == 1
        assert "cannot read stack 'Nope'" in err
        assert json.loads(out)["error"]["code"] == "stack_not_found"
    from calque.cli import config

    assert config.load("default", config_file) == {"endpoint": API, "region": "eu-west-1"}


def test_from_stack_without_a_region_reads_the_configurations_else_us_east_1(
    config_file, monkeypatch, capsys
):
    # with no --region and no AWS_REGION, boto3's "You must specify a region" was the answer,
    # where every other command falls back to the configuration's region, then us-east-1
    import boto3
    from moto import mock_aws

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config_file.parent / "no-aws-config"))
    template = {
        "Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
        "Outputs": {"ApiEndpoint": {"Value": API}},
    }
    with mock_aws():
        boto3.client("cloudformation", region_name="us-east-1").create_stack(
            StackName="Home", TemplateBody=json.dumps(template)
        )
        boto3.client("cloudformation", region_name="eu-west-1").create_stack(
            StackName="Away", TemplateBody=json.dumps(template)
        )
        code, _, err = run_cli(capsys, "configure", "--from-stack", "Home")
        assert code == 0, err
        assert run_cli(capsys, "configure", "set", "region", "eu-west-1")[0] == 0
        code, _, err = run_cli(capsys, "configure", "--from-stack", "Away")
        assert code == 0, err


def test_the_output_name_is_the_stacks():
    from calque.cli.commands.configure import API_ENDPOINT_OUTPUT
    from infra.constants import OUTPUT_API_ENDPOINT

    assert API_ENDPOINT_OUTPUT == OUTPUT_API_ENDPOINT


def test_every_from_stack_example_names_the_stack_that_has_the_output():
    # Given every `--from-stack STACK` the help and the docs show (the output is the service stack's)
    import re
    from pathlib import Path

    from calque.cli.commands import configure
    from infra.constants import SERVICE_STACK_NAME

    root = Path(__file__).resolve().parents[3]
    texts = {"configure --help": configure._EPILOG, "README.md": (root / "README.md").read_text()}
    texts.update({f"docs/{p.name}": p.read_text() for p in (root / "docs").glob("*.md")})
    named = {
        (where, stack)
        for where, text in texts.items()
        for stack in re.findall(r"--from-stack ([A-Za-z]\w*)", text)
    }
    assert ("configure --help", SERVICE_STACK_NAME) in named
    # Then each names the deployed service stack, not one that does not exist
    assert {(w, stack) for w, stack in named if stack not in (SERVICE_STACK_NAME, "STACK")} == set()


def test_aws_profile_does_not_name_a_local_plane_profile(config_file, tmp_path, monkeypatch):
    with running_plane(
        tmp_path / "plane", monkeypatch, endpoint="http://127.0.0.1:9999", region="eu-north-1"
    ) as p:
        monkeypatch.setenv("AWS_PROFILE", "research")
        ctx = context()
        creds, _ = ctx.credentials_and_region()
        assert creds.access_key == p.principal("admin").access_key
        assert ctx.sources["profile"] == "the local plane's default"


def test_from_stack_without_credentials_says_so_not_that_the_stack_is_missing(
    config_file, monkeypatch, tmp_path, capsys
):
    # Given no AWS credentials anywhere
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # When the stack is read
    code, out, err = run_cli(
        capsys, "--output", "json", "configure", "--from-stack", "CalqueService", "--region", "eu-west-1"
    )
    # Then the refusal is about credentials, and nothing is saved
    assert code == 1
    assert json.loads(out)["error"]["code"] == "no_credentials"
    assert "credentials" in err
    assert not config_file.exists()

"""``calque configure``: save the endpoint, region and profile of a named configuration
(~/.calque/config, calque.cli.config), as ``aws configure`` does; ``--from-stack NAME`` reads
the endpoint from the deployed stack's outputs. ``calque configure get KEY | set KEY VALUE |
list`` read and change one value at a time."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from calque.cli.errors import CliError, UsageError

# The stack's output that names the API (infra/constants.py OUTPUT_API_ENDPOINT; a test holds them equal).
API_ENDPOINT_OUTPUT = "ApiEndpoint"

_EPILOG = """example:
  calque configure --endpoint https://abc123.execute-api.us-east-1.amazonaws.com/prod --profile research
  calque configure --from-stack CalqueService --region eu-west-1 --config-name prod
  calque --config-name prod session list"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "configure",
        help="save the endpoint, region and AWS profile to use (a named configuration)",
        description="Save the global --endpoint, --region and --profile given here in the named "
        "configuration (--config-name, default `default`) of ~/.calque/config. With none given on a "
        "terminal, asks for each, showing the current value (Enter keeps it). A value given by flag or "
        "environment wins over the file's: flag, environment, configuration, running local plane.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--from-stack",
        metavar="STACK",
        help="read the endpoint from this deployed CloudFormation stack's ApiEndpoint output (calque's "
        "service stack, CalqueService), with the --profile and --region given (default: none)",
    )
    verbs = p.add_subparsers(title="commands", metavar="COMMAND")
    p.set_defaults(func=_configure)

    q = verbs.add_parser("get", help="print one value of the configuration")
    q.add_argument("key", metavar="KEY", help="endpoint, region or profile")
    q.set_defaults(func=_get)
    q = verbs.add_parser("set", help="set one value of the configuration (an empty VALUE clears it)")
    q.add_argument("key", metavar="KEY", help="endpoint, region or profile")
    q.add_argument("value", metavar="VALUE")
    q.set_defaults(func=_set)
    q = verbs.add_parser("list", help="every configuration in the file, and which one is in use")
    q.set_defaults(func=_list)


def _name(args: argparse.Namespace) -> str:
    from calque.cli.config import config_name

    return config_name(getattr(args, "config_name", None))[0]


def _configure(ctx: Any, args: argparse.Namespace) -> None:
    do_configure(
        ctx,
        name=_name(args),
        endpoint=getattr(args, "endpoint", None),
        region=getattr(args, "region", None),
        profile=getattr(args, "profile", None),
        from_stack=args.from_stack,
    )


def do_configure(
    ctx: Any,
    *,
    name: str,
    endpoint: str | None,
    region: str | None,
    profile: str | None,
    from_stack: str | None,
) -> None:
    from calque.cli import config
    from calque.cli.context import check_endpoint

    if from_stack is not None:
        if endpoint is not None:
            raise UsageError(
                "give --endpoint or --from-stack, not both",
                code="invalid_input",
                details={"field": "--from-stack"},
            )
        endpoint = stack_endpoint(
            from_stack, profile=profile, region=stack_region(region, config.load(name).get("region"))
        )
    values: dict[str, str | None] = {"endpoint": endpoint, "region": region, "profile": profile}
    given: dict[str, str | None] = {k: v for k, v in values.items() if v is not None}
    if not given:
        if not sys.stdin.isatty():
            raise UsageError(
                "nothing to save: give --endpoint URL, --region REGION, --profile NAME or --from-stack STACK "
                "(or run it on a terminal to be asked)",
                code="nothing_to_change",
            )
        given = _ask(config.load(name))
    if given.get("endpoint"):
        check_endpoint(str(given["endpoint"]), "--endpoint")
    saved = config.save(name, dict(given))
    ctx.emit({"config_name": name, "file": str(config.config_file()), **saved})


def _ask(current: dict[str, str]) -> dict[str, str | None]:
    """Each key, as ``aws configure`` asks: Enter keeps the current value, ``-`` clears it."""
    from calque.cli.config import KEYS

    out: dict[str, str | None] = {}
    for key in KEYS:
        answer = input(f"{key} [{current.get(key, 'none')}]: ").strip()
        if answer == "-":
            out[key] = None
        elif answer:
            out[key] = answer
    return out


def stack_region(flag: str | None, configured: str | None) -> str | None:
    """The region the stack is read in, as every command finds its region (docs/cli.md): the
    flag, AWS_REGION / AWS_DEFAULT_REGION, the configuration's; None leaves the AWS profile's
    to boto3 (stack_endpoint then falls back to us-east-1)."""
    return flag or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or configured or None


def stack_endpoint(stack: str, *, profile: str | None, region: str | None) -> str:
    """The ApiEndpoint output of deployed stack ``stack`` (CloudFormation DescribeStacks)."""
    import boto3
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        CredentialRetrievalError,
        NoCredentialsError,
        PartialCredentialsError,
        SSOError,
        TokenRetrievalError,
    )

    from calque.cli.errors import credentials_refused

    try:
        session = boto3.Session(profile_name=profile, region_name=region)
        if session.region_name is None:  # no region anywhere: the CLI's own default
            session = boto3.Session(profile_name=profile, region_name="us-east-1")
        stacks = session.client("cloudformation").describe_stacks(StackName=stack)["Stacks"]
    except ClientError as exc:
        error = exc.response.get("Error", {})
        said = error.get("Message") or str(exc)
        # CloudFormation says "Stack with id X does not exist" as a ValidationError; anything
        # else (access denied, an expired token) is no answer about the stack
        missing = error.get("Code") == "ValidationError" and "does not exist" in said
        raise CliError(
            f"cannot read stack {stack!r}: {said}" + ("" if missing else f" ({error.get('Code')})"),
            code="stack_not_found" if missing else "stack_unreadable",
            details={"stack": stack, "aws_error": error.get("Code")},
        ) from None
    except (
        NoCredentialsError,
        PartialCredentialsError,
        CredentialRetrievalError,
        SSOError,
        TokenRetrievalError,
    ) as exc:
        raise credentials_refused(exc, f"CloudFormation (stack {stack})") from None
    except BotoCoreError as exc:
        raise CliError(
            f"cannot read stack {stack!r}: {exc}", code="stack_unreadable", details={"stack": stack}
        ) from None
    outputs = {o["OutputKey"]: o["OutputValue"] for s in stacks for o in s.get("Outputs", [])}
    if API_ENDPOINT_OUTPUT not in outputs:
        raise CliError(
            f"stack {stack!r} has no {API_ENDPOINT_OUTPUT} output "
            f"(outputs: {', '.join(sorted(outputs)) or 'none'}): "
            "is it calque's service stack, deployed completely?",
            code="stack_has_no_endpoint",
            details={"stack": stack, "outputs": sorted(outputs)},
        )
    return str(outputs[API_ENDPOINT_OUTPUT])


def _get(ctx: Any, args: argparse.Namespace) -> None:
    do_get(ctx, name=_name(args), key=args.key)


def do_get(ctx: Any, *, name: str, key: str) -> None:
    from calque.cli import config

    config.check_key(key)
    value = config.load(name).get(key)
    if value is None:
        raise CliError(
            f"configuration {name!r} sets no {key} (in {config.config_file()})",
            code="not_configured",
            details={"config_name": name, "key": key},
        )
    ctx.emit(value)


def _set(ctx: Any, args: argparse.Namespace) -> None:
    do_set(ctx, name=_name(args), key=args.key, value=args.value)


def do_set(ctx: Any, *, name: str, key: str, value: str) -> None:
    from calque.cli import config
    from calque.cli.context import check_endpoint

    config.check_key(key)
    if key == "endpoint" and value:
        check_endpoint(value, "VALUE")
    saved = config.save(name, {key: value})
    ctx.emit({"config_name": name, "file": str(config.config_file()), **saved})


def _list(ctx: Any, args: argparse.Namespace) -> None:
    do_list(ctx, name=_name(args))


def do_list(ctx: Any, *, name: str) -> None:
    from calque.cli import config

    rows = [{"name": n, **v, "in_use": n == name} for n, v in sorted(config.all_configs().items())]
    ctx.emit(
        rows,
        columns=[
            ("name", "name"),
            ("in_use", "in_use"),
            ("endpoint", "endpoint"),
            ("region", "region"),
            ("profile", "profile"),
        ],
    )

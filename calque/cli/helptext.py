"""How ``calque ... --help`` reads: every option says its default, every command shows an
example, the global options are listed once (under ``calque --help``), and a mistyped
command gets a "did you mean".

A command's example is its parser's ``epilog`` when the command module gives one, else the
line kept here in EXAMPLES under the command's path (``"session checkout"``).
tests/unit/cli/test_help.py walks the whole parser and fails on an option whose help states
no default (nor that it is required) and on a command without an example.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Iterable
from typing import Any

GLOBAL_NOTE = (
    "global options (--endpoint, --profile, --region, --config-name, --output, --query, --debug)\n"
    "may come before or after the command: see `calque --help`"
)

# An example for each command whose module gives none: the command's path -> its example lines.
EXAMPLES: dict[str, tuple[str, ...]] = {
    "configure get": ("calque configure get endpoint", "calque --config-name prod configure get region"),
    "configure set": ("calque configure set region eu-west-1", "calque configure set profile ''"),
    "configure list": ("calque configure list",),
    "whoami": ("calque whoami", "calque whoami --output json --query endpoint_source"),
    "local up": ("calque local up", "calque local up --port 8123 --state-dir /tmp/calque-2"),
    "local down": ("calque local down",),
    "local status": ("calque local status", "calque local status --query endpoint"),
    "local launch": ("calque local launch --instance-type g7e.2xlarge",),
    "local user add": ("calque local user add dave", "calque local user add erin --admin"),
    "local user remove": ("calque local user remove dave",),
    "local demo": ("calque local demo", "calque local demo pools"),
    "local inject spot-interruption": ("calque local inject spot-interruption i-0abc",),
    "local inject clear": ("calque local inject clear",),
    "local inject capacity": ("calque local inject capacity --instance-type p5e.48xlarge --times 3",),
    "local inject crash-after-launch": ("calque local inject crash-after-launch --times 2",),
    "local inject spot-price": (
        "calque local inject spot-price --instance-type g7e.2xlarge --az us-east-1a --usd-per-hour 0.9",
    ),
    "local terminate": ("calque local terminate i-0abc --yes",),
    "local reset": ("calque local reset", "calque local reset --yes --state-dir /tmp/calque-2"),
    "catalog types": ("calque catalog types", "calque catalog types --card L40S --output json"),
    "catalog cards": ("calque catalog cards",),
    "catalog profiles": ("calque catalog profiles --instance-type g7e.2xlarge",),
    "api spec": ("calque api spec > openapi.json", "calque api spec --query 'keys(paths)'"),
    "host register": (
        "calque host register --instance-id i-0abc --instance-type g7e.2xlarge --mig 1g.24gb=4 --wait",
    ),
    "host list": ("calque host list", "calque host list --output json --query '[].instance_id'"),
    "host show": ("calque host show i-0abc",),
    "host drain": ("calque host drain i-0abc --force --reason 'maintenance at 18:00'",),
    "host deregister": ("calque host deregister i-0abc --force",),
    "host acquire": (
        "calque host acquire --instance-type g7e.2xlarge --mig 1g.24gb=4 --ttl 12h "
        "--i-understand-this-spends-money --wait",
    ),
    "host release": ("calque host release i-0abc --i-understand-this-terminates-instances",),
    "host acquisitions": ("calque host acquisitions", "calque host acquisitions --instance-id i-0abc"),
    "session checkout": (
        "calque session checkout --backend mig --min-memory-gib 20 --ttl 2h",
        "calque session checkout --backend mig --profile 1g.24gb --ttl 30m",
    ),
    "session checkin": ("calque session checkin s-0123456789abcdef",),
    "session extend": ("calque session extend s-0123456789abcdef --ttl 1h",),
    "session connect": ("calque session connect s-0123456789abcdef",),
    "session exec": ("calque session exec s-0123456789abcdef -- nvidia-smi -L",),
    "session list": ("calque session list", "calque session list --all --output json --query '[].user'"),
    "session show": ("calque session show s-0123456789abcdef",),
    "session queue": ("calque session queue", "calque session queue --all --output json"),
    "session cancel": ("calque session cancel q-0123456789abcdef01234567",),
    "quota set": ("calque quota set alice --max-sessions 2 --max-gpu-hours-per-month 100",),
    "quota list": (
        "calque quota list",
        "calque quota list --output json --query '[?live_sessions > `0`].user'",
    ),
    "quota show": ("calque quota show", "calque quota show alice"),
    "simulate placement": (
        "calque simulate placement --trace examples/traces/alibaba-pods-head300.csv --hosts g7e.2xlarge=4 "
        "--layout mig:1g.24gb=4",
    ),
    "simulate pool": ("calque simulate pool --trace examples/traces/bursty.csv --instance-type g7e.2xlarge",),
    "pool create": (
        "calque pool create textstats --model textstats --instance-type g7e.2xlarge "
        "--runner textstats:TextStats --package examples/pools --i-understand-this-spends-money",
    ),
    "pool list": ("calque pool list",),
    "pool status": ("calque pool status llm",),
    "pool update": ("calque pool update llm --max-workers 8",),
    "pool delete": ("calque pool delete llm --i-understand-this-terminates-instances",),
    "pool submit": ("calque pool submit llm --items prompts.jsonl --wait",),
    "claim list": ("calque claim list --pool llm",),
    "claim show": ("calque claim show c-0123456789abcdef",),
    "claim result": ("calque claim result c-0123456789abcdef -o result.json",),
    "claim logs": ("calque claim logs c-0123456789abcdef --follow",),
    "claim cancel": ("calque claim cancel c-0123456789abcdef",),
    "usage": ("calque usage --since 2026-12-01 --by group", "calque usage --output csv > december.csv"),
    "group create": ("calque group create lab-a --max-sessions 4 --max-usd-per-month 500",),
    "group add": ("calque group add lab-a alice bob",),
    "group remove": ("calque group remove lab-a bob",),
    "group limits": ("calque group limits lab-a --max-gpu-hours-per-month 200",),
    "group list": ("calque group list",),
    "group show": ("calque group show lab-a",),
    "group update": ("calque group update lab-a --shares 2",),
    "group fairshare": ("calque group fairshare",),
    "group delete": ("calque group delete lab-a",),
    "budget set": ("calque budget set --max-instances 4 --max-hourly-usd 40",),
    "budget show": ("calque budget show",),
}


def _fmt_default(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Appends what an option's help does not say itself: ``(required)``, ``(default: off)``
    for a switch, ``(default: VALUE)`` for an option with a value. An option whose default is
    None says its default in its own words (``default: any``); the parser test holds them to it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        if text is None or text == argparse.SUPPRESS or not action.option_strings:
            return text
        if isinstance(action, argparse._HelpAction | argparse._VersionAction) or "default" in text:
            return text
        if action.required:
            return f"{text} (required)"
        if isinstance(action, argparse._StoreTrueAction):
            return f"{text} (default: off)"
        if isinstance(action, argparse._StoreFalseAction):
            return f"{text} (default: on)"
        default = action.default
        if default is None or default is argparse.SUPPRESS:
            return text
        if default == []:
            return f"{text} (default: none)"
        return f"{text} (default: {_fmt_default(default).replace('%', '%%')})"


def stated_help(action: argparse.Action) -> str:
    """The help line people read for ``action`` (the parser test reads it too)."""
    return HelpFormatter("calque")._get_help_string(action) or ""


def epilog_for(path: str, given: str | None) -> str:
    """The example section of ``path``'s help (``given``: the module's own epilog), and the
    note on the global options."""
    if given and GLOBAL_NOTE in given:
        return given  # finished already
    parts = [given] if given else []
    if path in EXAMPLES:
        parts.append("example:\n" + "\n".join(f"  {line}" for line in EXAMPLES[path]))
    return "\n\n".join([*parts, GLOBAL_NOTE])


def has_example(epilog: str | None) -> bool:
    return bool(epilog) and "calque " in (epilog or "").split(GLOBAL_NOTE)[0]


def did_you_mean(value: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'list'?)`` for a near miss among ``choices``, else ''."""
    close = difflib.get_close_matches(value, list(choices), n=2, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"

"""``calque``: the command line. Parses, resolves the global options, dispatches to a
command module (calque/cli/commands/), and turns failures into exit codes:
0 ok, 1 refusal or user error (one line on stderr), 2 usage, 3 unexpected."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from calque.cli.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_STDOUT_CLOSED,
    EXIT_UNEXPECTED,
    EXIT_USAGE,
    CliError,
)

PROG = "calque"
OUTPUTS = ("table", "json", "csv")
# A command that writes csv sets this default on its parser; --output csv elsewhere is refused.
CSV_OUTPUT = "_writes_csv"


def _global_options(shown: bool) -> argparse.ArgumentParser:
    """Options every command accepts, before or after it. SUPPRESS keeps a later parser
    level from overwriting a value given at an earlier one. ``shown``: listed in the help
    (``calque --help`` only; each command's help points there instead of repeating them)."""
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("global options")

    def said(text: str) -> str:
        return text if shown else argparse.SUPPRESS

    g.add_argument(
        "--endpoint",
        default=argparse.SUPPRESS,
        metavar="URL",
        help=said(
            "the control plane's API (default: CALQUE_ENDPOINT, else the configuration's endpoint "
            "(calque configure), else the running local plane)"
        ),
    )
    g.add_argument(
        "--profile",
        default=argparse.SUPPRESS,
        metavar="NAME",
        help=said(
            "AWS profile to sign with (default: the configuration's, else the AWS default; with the "
            "local plane: admin, alice, bob, carol, ...)"
        ),
    )
    g.add_argument(
        "--region",
        default=argparse.SUPPRESS,
        metavar="REGION",
        help=said("AWS region to sign for (default: the configuration's, else AWS's, else us-east-1)"),
    )
    g.add_argument(
        "--config-name",
        default=argparse.SUPPRESS,
        metavar="NAME",
        help=said(
            "the named configuration of ~/.calque/config to use (default: CALQUE_CONFIG, else `default`)"
        ),
    )
    g.add_argument(
        "--output",
        choices=OUTPUTS,
        default=argparse.SUPPRESS,
        help=said(
            "table for people (default: table), json for scripts: one document on stdout; "
            "csv for finance (calque usage)"
        ),
    )
    g.add_argument(
        "--query",
        default=argparse.SUPPRESS,
        metavar="JMESPATH",
        help=said(
            "a JMESPath expression applied to the command's JSON document before it is printed, "
            "e.g. '[].instance_id' (default: the whole document)"
        ),
    )
    g.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help=said("show tracebacks of unexpected errors (default: off)"),
    )
    return common


# Each command's parser gets them unlisted; `calque --help` lists them.
_COMMON = _global_options(shown=False)
_COMMON_SHOWN = _global_options(shown=True)


class _SubParsers(argparse._SubParsersAction):  # type: ignore[type-arg, unused-ignore]
    """Every parser added under a command group gets the global options.

    ``fallback``: the name of a hidden verb (``_``-prefixed, so never listed) that takes a
    first word no verb is named, as its own positional (``calque catalog g7e.2xlarge``)."""

    fallback: str | None = None

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        if self.fallback is not None and values and values[0] not in self._name_parser_map:
            values = [self.fallback, *values]
        super().__call__(parser, namespace, values, option_string)

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs.setdefault("parents", [])
        kwargs["parents"] = [*kwargs["parents"], _COMMON]
        if "help" in kwargs and "description" not in kwargs:
            kwargs["description"] = kwargs["help"]
        return super().add_parser(name, **kwargs)


class CalqueParser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _SubParsers)
        # `--ttl -5m` reaches --ttl (and is refused for what it is), not argparse's option lookup.
        from calque.cli.durations import NEGATIVE_NUMBER_OR_DURATION

        self._negative_number_matcher = NEGATIVE_NUMBER_OR_DURATION

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        """argparse's own check, with a "did you mean" for a near miss (``calque sesion``)."""
        if getattr(action, "fallback", None) is not None and not str(value).startswith("-"):
            return  # a word no verb is named goes to the group's fallback verb (_SubParsers)
        if action.choices is not None and value not in action.choices:
            from calque.cli.helptext import did_you_mean

            names = [str(c) for c in action.choices if not str(c).startswith("_")]
            raise argparse.ArgumentError(
                action,
                f"invalid choice: {value!r}{did_you_mean(str(value), names)} "
                f"(choose from {', '.join(names)})",
            )


def command_group(subparsers: Any, name: str, help: str | None = None) -> Any:
    """The sub-parsers of group ``name`` (``calque local ...``), created on first use, so
    several command modules can add verbs to one group."""
    groups: dict[str, Any] = subparsers.__dict__.setdefault("_calque_groups", {})
    if name not in groups:
        parser = subparsers.add_parser(name, help=help)
        groups[name] = parser.add_subparsers(title="commands", metavar="COMMAND")
        parser.set_defaults(func=None, _group_parser=parser)
    return groups[name]


def build_parser() -> argparse.ArgumentParser:
    from calque.cli.commands import COMMAND_MODULES
    from calque.cli.helptext import HelpFormatter

    parser = CalqueParser(
        prog=PROG,
        parents=[_COMMON_SHOWN],
        formatter_class=HelpFormatter,
        description="calque: share an institution's AWS GPU instances among its people.",
        epilog="example:\n  calque local up\n  calque configure --endpoint URL --profile NAME\n"
        "  calque session checkout --backend mig --min-memory-gib 20 --ttl 2h \\\n"
        "      --output json --query session_id",
    )
    import calque

    parser.add_argument("--version", action="version", version=f"{PROG} {calque.__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name in COMMAND_MODULES:
        module_name = f"calque.cli.commands.{name}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise  # a module that is there but broken must say so
            continue  # listed before its file landed: the other commands still work
        module.register(subparsers)
    parser.set_defaults(func=None, _group_parser=parser)
    _finish_help(parser, "")
    return parser


def _finish_help(parser: argparse.ArgumentParser, path: str) -> None:
    """Every command's help, however its module made its parser: options with their defaults
    (calque.cli.helptext.HelpFormatter), its example, and a pointer to the global options."""
    from calque.cli.helptext import HelpFormatter, epilog_for

    if path:
        parser.formatter_class = HelpFormatter
        parser.epilog = epilog_for(path, parser.epilog)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:  # an alias is the same parser
                    seen.add(id(sub))
                    _finish_help(sub, f"{path} {name}".strip())


def _print_error(message: str) -> None:
    """One line on stderr, whatever free text the message quotes (calque.errors.one_line)."""
    from calque.errors import one_line

    sys.stderr.write(f"{PROG}: error: {message if message.isprintable() else one_line(message)}\n")


def _stdout_closed() -> int:
    """stdout's reader went away (``| head``): nothing wrong and no one to tell. Later writes,
    the interpreter's own flush at exit included, go nowhere instead of raising again."""
    import os

    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_STDOUT_CLOSED


def _stdout_gone() -> bool:
    """Whether stdout is a pipe its reader has closed (poll says POLLERR on its write end)."""
    import select

    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows), no real stdout (a test)
        return False


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["__complete"]:  # the shell's completion asking (calque.cli.completion)
        from calque.cli.completion import complete_main

        return complete_main(words[1:], build_parser)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.func is None:
        args._group_parser.print_help(sys.stderr)
        return EXIT_USAGE
    if getattr(args, "output", None) == "csv" and not getattr(args, CSV_OUTPUT, False):
        # given before the command or after it, the option is the same one: refused the same way
        _print_error("--output csv is for `calque usage`; this command writes table or json")
        return EXIT_USAGE
    from calque.cli.context import Context

    ctx = Context.from_args(args)
    try:  # an error document written to a closed stdout is a closed stdout too
        return _run(ctx, args)
    except BrokenPipeError:
        return _stdout_closed()


def _run(ctx: Any, args: argparse.Namespace) -> int:
    try:
        ctx.check_query()  # a malformed --query is refused before the command changes anything
        args.func(ctx, args)
        sys.stdout.flush()  # a reader gone early is told here, not at the interpreter's exit
        return EXIT_OK
    except CliError as exc:
        if ctx.json:
            ctx.emit_error(exc.document)
        _print_error(exc.message)
        return exc.exit_code  # 1, or 2 for a UsageError
    except KeyboardInterrupt:
        _print_error("interrupted")
        return EXIT_INTERRUPTED
    except Exception as exc:
        from calque.errors import CalqueError

        if isinstance(exc, BrokenPipeError) and _stdout_gone():
            raise  # main's: the reader left, not a bug (another pipe or socket broken is one)
        if isinstance(exc, CalqueError):  # a domain refusal raised on this side (e.g. the catalog)
            if ctx.json:
                ctx.emit_error({"error": {"code": exc.code, "message": exc.message, "details": exc.details}})
            _print_error(exc.message)
            return EXIT_REFUSED
        if ctx.debug:
            import traceback

            traceback.print_exc()
        _print_error(
            f"unexpected {type(exc).__name__}: {exc}"
            + ("" if ctx.debug else " (rerun with --debug for details)")
        )
        return EXIT_UNEXPECTED


if __name__ == "__main__":
    sys.exit(main())

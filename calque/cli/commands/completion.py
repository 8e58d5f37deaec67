"""``calque completion bash|zsh``: the shell's completion script (calque.cli.completion)."""

from __future__ import annotations

import sys
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "completion",
        help="print the completion script for bash or zsh: commands, flags and live values",
        description="Completes commands, flags, choices, instance types, cards and MIG profiles, and "
        "(asking the API, 2 s at most) session ids, host ids, pool and group names.",
        epilog='example:\n  eval "$(calque completion bash)"    # in ~/.bashrc\n'
        '  eval "$(calque completion zsh)"     # in ~/.zshrc, after compinit',
    )
    p.add_argument("shell", choices=("bash", "zsh"), metavar="SHELL", help="bash or zsh")
    p.set_defaults(func=lambda ctx, args: do_completion(ctx, shell=args.shell))


def do_completion(ctx: Any, *, shell: str) -> None:
    from calque.cli.completion import SCRIPTS

    if ctx.json:  # one JSON document on stdout, as every command answers with --output json
        ctx.emit({"shell": shell, "script": SCRIPTS[shell]})
        return
    sys.stdout.write(SCRIPTS[shell])

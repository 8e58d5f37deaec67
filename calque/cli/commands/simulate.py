"""``calque simulate ...``: replay traces through the real code with a virtual clock.

Each subcommand's parser and ``do_`` function live with its simulator (calque/simulate/).
"""

from __future__ import annotations

from typing import Any


def register(subparsers: Any) -> None:
    from calque.cli.main import command_group

    group = command_group(
        subparsers, "simulate", help="replay traces through the real code with a virtual clock"
    )

    from calque.simulate.placement import add_placement_parser

    add_placement_parser(group)

"""``calque api spec``: the control plane's OpenAPI document, as the API itself serves it."""

from __future__ import annotations

from typing import Any

SPEC_PATH = "/v1/openapi.json"


def register(subparsers: Any) -> None:
    from calque.cli.main import command_group

    group = command_group(subparsers, "api", help="the control plane's API itself")
    p = group.add_parser(
        "spec",
        help="print the OpenAPI document of the endpoint's API (JSON; --query selects from it)",
    )
    p.set_defaults(func=lambda ctx, args: do_spec(ctx))


def do_spec(ctx: Any) -> None:
    from calque.cli.output import to_json

    doc = ctx.client().request("GET", SPEC_PATH)
    # the document is for tools: JSON for people too, unless a --query picks from it
    ctx.emit(doc, text=to_json(doc))

"""``calque console``: a live page of the fleet, served on 127.0.0.1 and read with your
own credentials (calque/console/)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from calque.cli.argtypes import non_negative_int, positive_float

DEFAULT_REFRESH_S = 5.0
MIN_REFRESH_S = 1.0  # each refresh costs the API a handful of reads


def _port(text: str) -> int:
    value = non_negative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0 to 65535)")
    return value


def _refresh(text: str) -> float:
    value = positive_float(text)
    if value < MIN_REFRESH_S:
        raise argparse.ArgumentTypeError(f"{text!r} is too often: at least {MIN_REFRESH_S:g} second")
    return value


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "console",
        help="serve a live page of the fleet on 127.0.0.1 and open it in the browser",
        epilog="examples:\n"
        "  calque console --profile admin\n"
        "  calque console --port 8001 --no-browser --refresh 10\n",
    )
    p.add_argument(
        "--port",
        type=_port,
        default=0,
        metavar="N",
        help="the port on 127.0.0.1 to serve on (default 0: any free port)",
    )
    p.add_argument("--no-browser", action="store_true", help="print the address only; do not open a browser")
    p.add_argument(
        "--refresh",
        type=_refresh,
        default=DEFAULT_REFRESH_S,
        metavar="SECONDS",
        help=f"how often the page refreshes itself, in seconds (default {DEFAULT_REFRESH_S:g}; "
        f"at least {MIN_REFRESH_S:g})",
    )
    p.set_defaults(func=_console)


def _console(ctx: Any, args: argparse.Namespace) -> None:
    do_console(ctx, port=args.port, open_browser=not args.no_browser, refresh_s=args.refresh)


def do_console(ctx: Any, *, port: int, open_browser: bool, refresh_s: float) -> None:
    from calque.console.server import ConsoleServer
    from calque.console.snapshot import Reader

    client = ctx.client()
    me = client.request("GET", "/v1/whoami")  # credentials and endpoint proved before serving
    reconnect = None
    if ctx.finds_local_plane():
        # a local plane restarted while the console runs may listen on another port: follow it

        def reconnect() -> tuple[Any, str]:
            return ctx.reconnect(), ctx.endpoint

    try:
        server = ConsoleServer(port, Reader(client, ctx.endpoint, reconnect=reconnect), refresh_s)
    except OSError as exc:
        from calque.cli.errors import CliError

        raise CliError(
            f"cannot serve on 127.0.0.1:{port}: {exc.strerror or exc}; pick another --port (or 0 for any)",
            code="port_unavailable",
            details={"port": port},
        ) from None
    ctx.emit(
        {
            "url": server.url,
            "port": server.guard.port,
            "principal": me.get("principal"),
            "endpoint": ctx.endpoint,
        },
        columns=[("url", "url"), ("principal", "principal"), ("endpoint", "endpoint")],
    )
    sys.stdout.flush()
    if not ctx.json:
        sys.stderr.write("the console reads the fleet as you; Ctrl-C stops it\n")
    if open_browser:
        import webbrowser

        if not webbrowser.open(server.url) and not ctx.json:
            sys.stderr.write("no browser could be opened here: open the address above yourself\n")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()

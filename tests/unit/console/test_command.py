"""`calque console`'s options: what each defaults to, and the values refused before anything
starts; a port already taken is a refusal that says what to do."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from calque.cli.commands.console import DEFAULT_REFRESH_S, do_console
from calque.cli.errors import CliError
from calque.cli.main import build_parser

pytestmark = pytest.mark.unit


def test_the_defaults_are_any_free_port_a_browser_and_a_five_second_refresh():
    args = build_parser().parse_args(["console"])
    assert (args.port, args.no_browser, args.refresh) == (0, False, DEFAULT_REFRESH_S)
    args = build_parser().parse_args(["--profile", "alice", "console", "--port", "8001", "--no-browser"])
    assert (args.port, args.no_browser, args.profile) == (8001, True, "alice")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--port", "70000"], "not a port"),
        (["--port", "-1"], "--port"),
        (["--port", "http"], "not a whole number"),
        (["--refresh", "0.2"], "at least 1 second"),
        (["--refresh", "0"], "more than 0"),
        (["--refresh", "nan"], "not a finite number"),
    ],
)
def test_bad_values_are_usage_errors_naming_the_option(capsys, argv, says):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["console", *argv])
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err


class _Ctx:
    endpoint = "https://api.example/prod"
    json = False

    def __init__(self) -> None:
        self.emitted: list[Any] = []

    def client(self) -> Any:
        class Client:
            def request(self, method: str, path: str, *a: Any, **k: Any) -> Any:
                assert (method, path) == ("GET", "/v1/whoami")
                return {"principal": "alice", "admin": False}

        return Client()

    def emit(self, data: Any, **kwargs: Any) -> None:
        self.emitted.append(data)

    def finds_local_plane(self) -> bool:
        return False


def test_a_port_already_taken_is_refused_before_anything_is_served():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        ctx = _Ctx()
        with pytest.raises(CliError) as refused:
            do_console(ctx, port=taken.getsockname()[1], open_browser=False, refresh_s=5)
        assert refused.value.code == "port_unavailable"
        assert "pick another --port" in refused.value.message
        assert ctx.emitted == []  # no address printed for a server that is not there
    finally:
        taken.close()

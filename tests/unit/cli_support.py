"""The CLI in unit tests: a recording fake of the API, a way to put it behind the CLI, a runner
that returns what people and scripts see, and the local-plane surroundings the CLI looks for.
No network."""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from calque.cli.context import Context
    from calque.local.state import StateDir

# ---- the API, faked ------------------------------------------------------------------------------


class FakeApi:
    """Answers each request with ``responses[(METHOD, path)]`` (a value, a function of the body,
    or an exception to raise) and records every request the CLI sent."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any, dict[str, Any] | None]] = []
        self.responses: dict[tuple[str, str], Any] = {}
        self.profile: str | None = None  # the AWS profile the CLI signed as

    def request(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None) -> Any:
        self.requests.append((method, path, body, query))
        answer = self.responses.get((method, path))
        if isinstance(answer, Exception):
            raise answer
        return answer(body) if isinstance(answer, Callable) else answer

    def pages(self, path: str, query: dict[str, Any] | None = None, *, max_items: int | None = None) -> Any:
        """A list in one page (paging itself: tests/unit/cli/test_client.py)."""
        items = self.request("GET", path, None, query)
        return items if max_items is None or not isinstance(items, list) else items[:max_items]


class VersionedLimits:
    """A member's quota or a group's limits as the API keeps them: GET answers them with their
    version; PUT replaces them and counts one more version, but only on the version it names
    in ``if_version`` (409 limits_changed otherwise, nothing changed). ``meanwhile``: changes
    another admin lands between each of this CLI's reads and its write, one per read."""

    def __init__(self, doc: dict[str, Any], *, meanwhile: Sequence[dict[str, Any]] = ()) -> None:
        self.doc = {**doc, "version": doc.get("version", 1)}
        self.meanwhile = list(meanwhile)

    def install(self, fake: FakeApi, *, read: str, write: str) -> VersionedLimits:
        fake.responses[("GET", read)] = self.get
        fake.responses[("PUT", write)] = self.put
        return self

    def get(self, _body: Any = None) -> dict[str, Any]:
        answer = dict(self.doc)
        if self.meanwhile:
            self.doc = {**self.doc, **self.meanwhile.pop(0), "version": self.doc["version"] + 1}
        return answer

    def put(self, body: dict[str, Any]) -> dict[str, Any]:
        from calque.cli.errors import ApiError

        asked = body.get("if_version")
        if asked is not None and asked != self.doc["version"]:
            raise ApiError(
                409,
                {
                    "error": {
                        "code": "limits_changed",
                        "message": "another change landed first",
                        "details": {"version": self.doc["version"], "if_version": asked},
                    }
                },
            )
        limits = {k: v for k, v in body.items() if k != "if_version"}
        self.doc = {**self.doc, **limits, "version": self.doc["version"] + 1}
        return dict(self.doc)


def install_fake_api(
    monkeypatch,
    fake: FakeApi,
    command_modules: Sequence[str],
    *,
    endpoint: str | None = None,
    record_profile: bool = False,
) -> FakeApi:
    """Give the CLI only ``command_modules`` and have every command talk to ``fake``.

    ``endpoint``: also pin the endpoint the CLI reports (left to the CLI when None).
    ``record_profile``: note on ``fake.profile`` the profile the CLI was told to sign as."""
    from calque.cli import commands
    from calque.cli.context import Context

    monkeypatch.setattr(commands, "COMMAND_MODULES", list(command_modules))
    if record_profile:

        def client(ctx):
            fake.profile = ctx.profile_arg
            return fake

        monkeypatch.setattr(Context, "client", client)
    else:
        monkeypatch.setattr(Context, "client", lambda ctx: fake)
    if endpoint is not None:
        monkeypatch.setattr(Context, "endpoint", endpoint)
    return fake


# ---- running the CLI -----------------------------------------------------------------------------


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """Run ``calque *argv`` -> (exit code, stdout, stderr); argparse's own exits count as their code."""
    from calque.cli.main import main

    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def cli_runner(capsys) -> Callable[..., tuple[int, str, str]]:
    """``run_cli`` bound to ``capsys``: what the ``cli`` fixtures return."""
    return functools.partial(run_cli, capsys)


def context(**args: Any) -> Context:
    """The CLI's context for these parsed arguments."""
    from calque.cli.context import Context

    return Context.from_args(argparse.Namespace(**args))


# ---- where the CLI looks for a plane -------------------------------------------------------------


def forget_endpoint_and_aws_keys(monkeypatch) -> None:
    for var in (
        "CALQUE_ENDPOINT",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_PROFILE",
        "CALQUE_CONFIG",
    ):
        monkeypatch.delenv(var, raising=False)
    import os

    monkeypatch.setenv("CALQUE_CONFIG_FILE", os.devnull)  # no saved configuration (calque configure)


def no_aws_config_and_no_plane(tmp_path: Path, monkeypatch) -> Path:
    """An AWS config with no profiles at all, no keys in the environment, no instance metadata,
    and a local state directory where no plane runs. Returns ``tmp_path``."""
    forget_endpoint_and_aws_keys(monkeypatch)
    (tmp_path / "aws-config").write_text("")
    (tmp_path / "aws-credentials").write_text("")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("CALQUE_LOCAL_STATE_DIR", str(tmp_path / "no-plane-here"))
    return tmp_path


def stopped_plane(path: Path, monkeypatch) -> StateDir:
    """A local plane's state directory at ``path`` with its default people, no plane running,
    named to the CLI by CALQUE_LOCAL_STATE_DIR."""
    from calque.local.state import StateDir

    state = StateDir(path)
    state.ensure()
    state.initialize_people()
    monkeypatch.setenv("CALQUE_LOCAL_STATE_DIR", str(state.path))
    return state


@contextmanager
def running_plane(path: Path, monkeypatch, *, endpoint: str, region: str) -> Iterator[StateDir]:
    """A local plane's state directory at ``path``, with its people, listening (as its file says)
    at ``endpoint``, holding its lock, and named to the CLI by CALQUE_LOCAL_STATE_DIR."""
    from calque.local.state import StateDir

    state = StateDir(path)
    state.ensure()
    state.initialize_people()
    state.write_plane({"endpoint": endpoint, "region": region})
    monkeypatch.setenv("CALQUE_LOCAL_STATE_DIR", str(state.path))
    held = state.acquire_plane_lock()
    try:
        yield state
    finally:
        held.close()

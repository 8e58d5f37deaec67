"""What every command needs, resolved once from the global options.

Endpoint: ``--endpoint``, else ``CALQUE_ENDPOINT``, else the named configuration's
(``calque configure``, calque.cli.config), else the running local plane's ``plane.json``;
``sources`` records which one was used (``calque whoami`` shows it). The profile and region
follow the same order (flag, environment, configuration).
Credentials: with the local plane's endpoint, its own profiles
(``credentials`` in its state directory, read by our botocore session only: the
user's ~/.aws is neither read for them nor written); otherwise the standard AWS
chain with ``--profile``. ``localhost`` and ``127.0.0.1`` name the same local plane
(which listens on 127.0.0.1 only). An endpoint that is not an http(s) URL is a usage
error (exit 2) naming ``--endpoint``. A profile that does not exist, or no credentials at all, is a refusal
(exit 1) that says what to do.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calque.cli.errors import CliError, UsageError, credentials_refused

ENDPOINT_ENV = "CALQUE_ENDPOINT"
LOCAL_DEFAULT_PROFILE = "admin"
# The local plane listens on 127.0.0.1 only, so ::1 does not name it.
_LOOPBACK = frozenset({"localhost", "127.0.0.1"})


def check_endpoint(url: str, source: str = "--endpoint") -> None:
    """UsageError (exit 2) unless ``url`` is an http(s) URL with a host, before any credentials
    are looked for or any connection tried; ``source`` names where it came from."""
    from urllib.parse import urlsplit

    problem = None
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        problem = str(exc)
    else:
        if parts.scheme.lower() not in ("http", "https"):
            problem = "it needs http:// or https://"
        elif not parts.hostname:
            problem = "it names no host"
    if problem is not None:
        raise UsageError(
            f"{source} {url!r} is not a URL of the control plane ({problem}): give "
            "http(s)://HOST[:PORT][/PATH], e.g. https://abc123.execute-api.us-east-1.amazonaws.com/prod",
            code="invalid_endpoint",
            details={"field": source, "endpoint": url},
        )


def _endpoint_key(url: str) -> tuple[str, str, int | None, str]:
    """(scheme, host, port, path) with every loopback name as one host and default ports filled."""
    from urllib.parse import urlsplit

    parts = urlsplit(url.strip())
    scheme = (parts.scheme or "http").lower()
    host = (parts.hostname or "").lower()
    if host in _LOOPBACK:
        host = "loopback"
    try:
        port = parts.port or {"http": 80, "https": 443}.get(scheme)
    except ValueError:
        port = None
    return scheme, host, port, parts.path.rstrip("/")


def same_endpoint(a: str, b: str) -> bool:
    return _endpoint_key(a) == _endpoint_key(b)


def is_loopback(url: str) -> bool:
    return _endpoint_key(url)[1] == "loopback"


def on_this_machine(url: str) -> bool:
    """Any loopback address (``[::1]``, ``127.0.0.2``, ``*.localhost``), not only the two that
    name the local plane: credentials are not what such an endpoint is missing."""
    import ipaddress
    from urllib.parse import urlsplit

    try:
        host = (urlsplit(url.strip()).hostname or "").lower()
    except ValueError:
        return False
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def checkout_plane_hint(state_dir: Path) -> str:
    """When no plane runs on ``state_dir`` but one runs on the checkout the CLI is run in
    (``make run``'s ``.calque/local`` in the working directory or a directory above it): a
    sentence naming it and how to point the CLI there; else "". A hint only: the CLI never
    picks a state directory by where it is run."""
    import shlex

    from calque.local.state import STATE_DIR_ENV, StateDir

    here = Path.cwd()
    for folder in (here, *here.parents):
        candidate = folder / ".calque" / "local"
        if candidate.resolve() == Path(state_dir).resolve() or not (candidate / "plane.json").is_file():
            continue
        if StateDir(candidate).running_pid() is not None:
            venv = folder / ".venv" / "bin" / "activate"
            how = f"`source {shlex.quote(str(venv))}` (make run's venv names it) or " * venv.is_file()
            return (
                f"; the local plane of this checkout runs on {candidate}: to use it, "
                f"{how}export {STATE_DIR_ENV}={shlex.quote(str(candidate))}"
            )
    return ""


@dataclass
class Context:
    output: str = "table"
    debug: bool = False
    endpoint_arg: str | None = None
    profile_arg: str | None = None
    region_arg: str | None = None
    state_dir_arg: str | None = None
    config_name_arg: str | None = None
    query: str | None = None
    sources: dict[str, str] = field(default_factory=dict)
    _config: tuple[str, dict[str, str]] | None = field(default=None, repr=False)
    _client: Any = field(default=None, repr=False)
    _resolved: tuple[str, Path | None, dict[str, Any] | None] | None = field(default=None, repr=False)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Context:
        return cls(
            output=getattr(args, "output", None) or "table",
            debug=bool(getattr(args, "debug", False)),
            endpoint_arg=getattr(args, "endpoint", None),
            profile_arg=getattr(args, "profile", None),
            region_arg=getattr(args, "region", None),
            state_dir_arg=getattr(args, "state_dir", None),
            config_name_arg=getattr(args, "config_name", None),
            query=getattr(args, "query", None),
        )

    @property
    def json(self) -> bool:
        return self.output == "json"

    def emit(self, data: Any, **kwargs: Any) -> None:
        from calque.cli.output import emit

        emit(self.output, data, query=self.query, **kwargs)

    def emit_error(self, document: Any) -> None:
        """An error document as it is: --query shapes what a command answers, not its refusals."""
        from calque.cli.output import emit

        emit(self.output, document)

    def check_query(self) -> None:
        if self.query is not None:
            from calque.cli.output import compile_query

            compile_query(self.query)

    # the named configuration (calque configure)
    def config(self) -> tuple[str, dict[str, str]]:
        """(the configuration's name, the values it sets), read once."""
        if self._config is None:
            from calque.cli import config

            name, _ = config.config_name(self.config_name_arg)
            self._config = (name, config.load(name))
        return self._config

    def _config_source(self) -> str:
        from calque.cli.config import config_file

        return f"configuration {self.config()[0]!r} ({config_file()})"

    def _profile_choice(self, *, local: bool = False) -> str | None:
        """--profile, else (unless AWS_PROFILE names one; the local plane's profiles are its
        own, never AWS's) the configuration's profile."""
        if self.profile_arg:
            self.sources["profile"] = "--profile"
            return self.profile_arg
        if os.environ.get("AWS_PROFILE") and not local:
            self.sources["profile"] = "AWS_PROFILE"
            return None  # botocore reads it
        configured = self.config()[1].get("profile")
        if configured:
            self.sources["profile"] = self._config_source()
        return configured

    # the local plane
    def local_state(self) -> Any:
        from calque.local.state import StateDir, state_dir_from

        return StateDir(state_dir_from(self.state_dir_arg))

    def running_plane(self) -> dict[str, Any]:
        """plane.json of the running local plane, or a refusal saying how to start one."""
        state = self.local_state()
        plane = state.read_plane()
        if not plane or state.running_pid() is None:
            raise CliError(
                f"no local plane runs on {state.path}: start one with `calque local up`"
                + checkout_plane_hint(state.path),
                code="local_plane_not_running",
                details={"state_dir": str(state.path)},
            )
        return plane

    def _resolve(self) -> tuple[str, Path | None, dict[str, Any] | None]:
        """(endpoint, the local state dir when the endpoint is the local plane's, plane.json)."""
        if self._resolved is None:
            endpoint = self.endpoint_arg or os.environ.get(ENDPOINT_ENV)
            if endpoint is not None:
                source = "--endpoint" if self.endpoint_arg else ENDPOINT_ENV
            else:
                endpoint = self.config()[1].get("endpoint")
                source = self._config_source()
            if endpoint is not None:
                check_endpoint(endpoint, source)
                self.sources["endpoint"] = source
            state = self.local_state()
            plane = state.read_plane() if state.plane_file.exists() else None
            if endpoint is None:
                if not plane or state.running_pid() is None:
                    from calque.local.state import STATE_DIR_ENV

                    raise CliError(
                        "no endpoint: pass --endpoint URL (or set CALQUE_ENDPOINT, or save one with "
                        "`calque configure --endpoint URL`), or start the "
                        f"local plane with `calque local up` (no local plane runs on {state.path}; "
                        f"for one started with --state-dir DIR, set {STATE_DIR_ENV}=DIR)"
                        + checkout_plane_hint(state.path),
                        code="no_endpoint",
                        details={"state_dir": str(state.path)},
                    )
                endpoint = str(plane["endpoint"])
                self.sources["endpoint"] = f"the running local plane ({state.path})"
            is_local = plane is not None and same_endpoint(endpoint, str(plane["endpoint"]))
            self._resolved = (endpoint, state.path if is_local else None, plane if is_local else None)
        return self._resolved

    @property
    def endpoint(self) -> str:
        return self._resolve()[0]

    def finds_local_plane(self) -> bool:
        """Whether the endpoint is found from the running local plane (no --endpoint,
        CALQUE_ENDPOINT or configured one): a restarted plane may then be on another port."""
        if self.endpoint_arg or os.environ.get(ENDPOINT_ENV) or self.config()[1].get("endpoint"):
            return False
        return self.local_plane

    def anew(self) -> Context:
        """The same options, resolved again from scratch (a restarted local plane's new port)."""
        import dataclasses

        return dataclasses.replace(self, sources={}, _config=None, _client=None, _resolved=None)

    def reconnect(self) -> Any:
        """The client of the local plane as it runs now (restarted: on another port), kept as
        this context's from now on; a refusal when none runs there yet (the old one is kept)."""
        fresh = self.anew()
        client = fresh.client()
        self.sources, self._config, self._resolved, self._client = (
            fresh.sources,
            fresh._config,
            fresh._resolved,
            client,
        )
        return client

    @property
    def local_plane(self) -> bool:
        """Whether the endpoint is a running local plane's (its hosts simulated); False when
        none can be resolved (a client given outright)."""
        try:
            return self._resolve()[1] is not None
        except CliError:
            return False

    def credentials_and_region(self) -> tuple[Any, str]:
        import botocore.session

        _endpoint, local_dir, plane = self._resolve()
        session = botocore.session.Session()
        if local_dir is not None and plane is not None:
            session.set_config_variable("credentials_file", str(local_dir / "credentials"))
            session.set_config_variable("config_file", os.devnull)
            profile = self._profile_choice(local=True) or LOCAL_DEFAULT_PROFILE
            self.sources.setdefault("profile", "the local plane's default")
            region = self.region_arg or plane.get("region") or "us-east-1"
            self.sources["region"] = "--region" if self.region_arg else "the local plane"
            available = session.available_profiles
            if profile not in available:
                raise CliError(
                    f"the local plane has no profile {profile!r} (people: "
                    f"{', '.join(sorted(p for p in available if not p.startswith('i-')))}); "
                    "add one with `calque local user add`",
                    code="unknown_profile",
                )
            session.set_config_variable("profile", profile)
            creds = _profile_credentials(session, profile)
        else:
            creds, region = self._aws_credentials_and_region(session)
        if creds is None:
            self._refuse_if_no_local_plane()
            raise CliError(
                "no AWS credentials found: pass --profile or configure the AWS CLI", code="no_credentials"
            )
        return creds, region

    def _aws_credentials_and_region(self, session: Any) -> tuple[Any, str]:
        """The standard AWS chain, with --profile; a missing profile or broken config is a refusal."""
        from botocore.exceptions import BotoCoreError, ProfileNotFound

        profile = self._profile_choice()
        try:
            if profile:
                session.set_config_variable("profile", profile)
            creds = session.get_credentials()
            region = self._region(session)
        except ProfileNotFound:
            self._refuse_if_no_local_plane()
            named = profile or os.environ.get("AWS_PROFILE")
            raise CliError(
                f"no AWS profile named {named!r} in your AWS config (from "
                f"{self.sources.get('profile', '--profile')}); pass another "
                f"--profile, or add it with `aws configure --profile {named}`",
                code="unknown_profile",
                details={"profile": named, "endpoint": self.endpoint},
            ) from None
        except BotoCoreError as exc:
            raise credentials_refused(exc, self.endpoint) from None
        return creds, region

    def _region(self, session: Any) -> str:
        """--region, else AWS_REGION / AWS_DEFAULT_REGION, else the configuration's, else the
        AWS profile's, else us-east-1."""
        for value, source in (
            (self.region_arg, "--region"),
            (os.environ.get("AWS_REGION"), "AWS_REGION"),
            (os.environ.get("AWS_DEFAULT_REGION"), "AWS_DEFAULT_REGION"),
            (self.config()[1].get("region"), self._config_source()),
            (session.get_config_variable("region"), "the AWS profile"),
        ):
            if value:
                self.sources["region"] = source
                return value
        self.sources["region"] = "built in"
        return "us-east-1"

    def _refuse_if_no_local_plane(self) -> None:
        """A loopback endpoint that no running local plane serves: that is the likelier mistake."""
        endpoint = self._resolve()[0]
        if on_this_machine(endpoint):
            path = self.local_state().path
            where = "" if is_loopback(endpoint) else " (a local plane listens on 127.0.0.1 only)"
            raise CliError(
                f"no local plane of {path} runs at {endpoint}{where}: start one with `calque local up` "
                "(or set CALQUE_LOCAL_STATE_DIR to the state directory of the one that runs there)"
                + checkout_plane_hint(path),
                code="local_plane_not_running",
                details={"endpoint": endpoint, "state_dir": str(path)},
            )

    def client(self) -> Any:
        """The signed API client for this invocation (created once)."""
        if self._client is None:
            from calque.cli.client import ApiClient

            creds, region = self.credentials_and_region()
            # a write whose answer was lost is asked again there: a restarted plane has another port
            refind = (lambda: self.anew().endpoint) if self.finds_local_plane() else None
            self._client = ApiClient(self.endpoint, creds, region, refind=refind)
        return self._client


def _profile_credentials(session: Any, profile: str) -> Any:
    """Credentials of exactly that profile of the shared-credentials file, never the environment's."""
    from botocore.credentials import SharedCredentialProvider

    provider = SharedCredentialProvider(
        creds_filename=session.get_config_variable("credentials_file"), profile_name=profile
    )
    return provider.load()

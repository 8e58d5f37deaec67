"""The local plane's state directory: the files the CLI, the HTTP front and the
SSM executor share.

    plane.json    endpoint, moto endpoint, account, region, resource names, pid
    credentials   an AWS shared-credentials file: one section per profile
                  (people by name, simulated hosts by instance id)
    users.json    who each access key is: people (admin or member) and instances, and the
                  plane's own key pair for its moto endpoint (nothing else may use it)
    plane.lock    held (flock) by the running plane: a second one is refused
    hosts/        each simulated host's GPU state (<instance-id>.json, the agent's)
    ssm/          what each SSM command did on each simulated host
    aws/          the moto services' contents, kept across restarts (calque/local/persistence.py)

Writers take ``state.lock`` and replace files atomically; readers re-read a file
when its modification time changes, so a running plane sees ``local user add`` and
``local launch`` at once. Secrets live only here, readable by the owner alone.
"""

from __future__ import annotations

import configparser
import contextlib
import fcntl
import json
import os
import re
import secrets
import string
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calque.errors import Conflict, InvalidInput, NotFound

DEFAULT_STATE_DIR = Path("~/.calque/local")
STATE_DIR_ENV = "CALQUE_LOCAL_STATE_DIR"
# moto's default account: ARNs of the moto resources and of our principals agree.
ACCOUNT_ID = "123456789012"
REGION = "us-east-1"
DEFAULT_PEOPLE: tuple[tuple[str, bool], ...] = (
    ("admin", True),
    ("alice", False),
    ("bob", False),
    ("carol", False),
)

_USER_NAME = re.compile(r"[A-Za-z0-9+=,.@_-]{1,64}")


def state_dir_from(value: str | os.PathLike[str] | None = None) -> Path:
    """--state-dir, else CALQUE_LOCAL_STATE_DIR, else ~/.calque/local."""
    raw = value or os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR
    return Path(raw).expanduser().resolve()


def user_arn(account: str, name: str) -> str:
    return f"arn:aws:iam::{account}:user/{name}"


def instance_arn(account: str, role: str, instance_id: str) -> str:
    return f"arn:aws:sts::{account}:assumed-role/{role}/{instance_id}"


def _unique_id(prefix: str, seed: str) -> str:
    """IAM-style unique ids (AIDA... for users, AROA... for roles), stable per name."""
    import hashlib

    digest = hashlib.sha256(seed.encode()).hexdigest().upper()
    return prefix + "".join(c for c in digest if c in string.ascii_uppercase + string.digits)[:17]


def _new_key_pair() -> tuple[str, str]:
    alphabet = string.ascii_uppercase + string.digits
    key = "AKIA" + "".join(secrets.choice(alphabet) for _ in range(16))
    secret = secrets.token_urlsafe(30)[:40]
    return key, secret


@dataclass(frozen=True)
class Principal:
    """Who an access key is, as API Gateway's IAM authorization would report it."""

    profile: str
    kind: str  # "user" | "instance"
    arn: str
    access_key: str
    secret_key: str
    unique_id: str
    admin: bool = False
    instance_type: str | None = None
    pool: str | None = None  # the warm pool a simulated host was launched for (its role's reach)

    @property
    def caller(self) -> str:
        # requestContext.identity.caller / .user: the unique id, plus the session for a role
        return f"{self.unique_id}:{self.profile}" if self.kind == "instance" else self.unique_id


class StateDir:
    """The files of one state directory. Thread-safe; safe across processes via flock."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._cache: dict[str, tuple[float, Any]] = {}
        self._mutex = threading.Lock()

    # paths
    @property
    def plane_file(self) -> Path:
        return self.path / "plane.json"

    @property
    def credentials_file(self) -> Path:
        return self.path / "credentials"

    @property
    def users_file(self) -> Path:
        return self.path / "users.json"

    @property
    def lock_file(self) -> Path:
        return self.path / "plane.lock"

    @property
    def hosts_dir(self) -> Path:
        return self.path / "hosts"

    @property
    def ssm_dir(self) -> Path:
        return self.path / "ssm"

    @property
    def aws_dir(self) -> Path:
        return self.path / "aws"

    def host_state_file(self, instance_id: str) -> Path:
        return self.hosts_dir / f"{instance_id}.json"

    def ensure(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.hosts_dir.mkdir(exist_ok=True)
        self.ssm_dir.mkdir(exist_ok=True)
        self.aws_dir.mkdir(exist_ok=True, mode=0o700)

    # whether a plane runs here
    def running_pid(self) -> int | None:
        """The pid of the plane holding this directory's lock, or None when none runs."""
        if not self.lock_file.exists():
            return None
        with open(self.lock_file, "a+") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                fh.seek(0)
                text = fh.read().strip()
                return int(text) if text.isdigit() else -1
            fcntl.flock(fh, fcntl.LOCK_UN)
            return None

    def acquire_plane_lock(self) -> Any:
        """Hold the plane lock for this process's lifetime; refuse when another plane holds it."""
        self.ensure()
        fh = open(self.lock_file, "a+")  # noqa: SIM115 - held until the plane stops
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            pid = fh.read().strip() or "?"
            fh.close()
            plane = self.read_plane() or {}
            raise Conflict(
                f"a local plane already runs on {self.path} (pid {pid}, endpoint "
                f"{plane.get('endpoint', '?')}); stop it first (calque local down) "
                "or pass another --state-dir",
                code="plane_already_running",
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        return fh

    @contextlib.contextmanager
    def _write_lock(self) -> Iterator[None]:
        self.ensure()
        with self._mutex, open(self.path / "state.lock", "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _write_atomic(self, path: Path, text: str, mode: int = 0o600) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)

    # the temporary files each writer here names (state.py, the SSM executor, the host agent's fake
    # GPUs); aws/ has its own (calque/local/moto_state.py)
    TEMP_GLOBS = (".*.tmp", "ssm/*/*.tmp", "hosts/*.json.tmp")

    def remove_stale_temps(self) -> int:
        """At the plane's start (its lock held, under the writers' lock): remove the temporary
        files a kill left in the middle of a write; their renames never happened."""
        removed = 0
        with self._write_lock():
            for pattern in self.TEMP_GLOBS:
                for tmp in self.path.glob(pattern):
                    with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                        tmp.unlink()
                        removed += 1
        return removed

    def _read_json(self, path: Path) -> Any:
        """Parsed content, re-read only when the file changed."""
        try:
            mtime = path.stat().st_mtime_ns
        except FileNotFoundError:
            return None
        key = str(path)
        cached = self._cache.get(key)
        if cached and cached[0] == mtime:
            return cached[1]
        data = json.loads(path.read_text())
        self._cache[key] = (mtime, data)
        return data

    # plane.json
    def read_plane(self) -> dict[str, Any] | None:
        return self._read_json(self.plane_file)

    def write_plane(self, plane: dict[str, Any]) -> None:
        with self._write_lock():
            self._write_atomic(self.plane_file, json.dumps(plane, indent=2) + "\n", 0o644)

    def clear_plane(self) -> None:
        with self._write_lock(), contextlib.suppress(FileNotFoundError):
            self.plane_file.unlink()

    # users.json + credentials
    def _users(self) -> dict[str, Any]:
        return self._read_json(self.users_file) or {"account": ACCOUNT_ID, "people": {}, "instances": {}}

    def _save_users(self, users: dict[str, Any]) -> None:
        self._write_atomic(self.users_file, json.dumps(users, indent=2) + "\n")
        cfg = configparser.ConfigParser()
        for name, entry in {**users["people"], **users["instances"]}.items():
            cfg[name] = {
                "aws_access_key_id": entry["access_key"],
                "aws_secret_access_key": entry["secret_key"],
            }
        from io import StringIO

        buf = StringIO()
        buf.write(
            "# calque local plane profiles: written by `calque local up`, secrets for this plane only\n"
        )
        cfg.write(buf)
        self._write_atomic(self.credentials_file, buf.getvalue())

    def initialize_people(self, account: str = ACCOUNT_ID) -> None:
        """Keep the people (and their keys) of an earlier run and its simulated hosts (the
        plane restores their instances, or forgets them with ``forget_instances``), add the
        default profiles, and make the plane's own moto key pair once."""
        with self._write_lock():
            users = self._users()
            users = {
                "account": account,
                "people": dict(users.get("people", {})),
                "instances": dict(users.get("instances", {})),
                **({"plane": users["plane"]} if users.get("plane") else {}),
            }
            for name, admin in DEFAULT_PEOPLE:
                if name not in users["people"]:
                    key, secret = _new_key_pair()
                    users["people"][name] = {"admin": admin, "access_key": key, "secret_key": secret}
            if "plane" not in users:
                key, secret = _new_key_pair()
                users["plane"] = {"access_key": key, "secret_key": secret}
            self._save_users(users)

    def forget_instances(self, keep: set[str]) -> list[str]:
        """Drop the profiles of simulated hosts whose instance did not come back; returns them."""
        with self._write_lock():
            users = self._users()
            gone = [i for i in users["instances"] if i not in keep]
            if gone:
                users = {**users, "instances": {k: v for k, v in users["instances"].items() if k in keep}}
                self._save_users(users)
        return gone

    def plane_credentials(self) -> tuple[str, str] | None:
        """The key pair the plane's own processes sign their moto calls with (None before
        the first ``local up``). Never a profile: no person or host may use it."""
        entry = self._users().get("plane")
        return (str(entry["access_key"]), str(entry["secret_key"])) if entry else None

    def add_person(self, name: str, *, admin: bool = False) -> Principal:
        if not _USER_NAME.fullmatch(name):
            raise InvalidInput(
                f"invalid user name {name!r}: 1-64 of letters, digits and +=,.@_-", details={"field": "name"}
            )
        with self._write_lock():
            users = self._users()
            if name in users["people"] or name in users["instances"]:
                raise Conflict(
                    f"a profile named {name!r} already exists", code="profile_exists", details={"name": name}
                )
            key, secret = _new_key_pair()
            users["people"][name] = {"admin": admin, "access_key": key, "secret_key": secret}
            self._save_users(users)
        return self.principal(name)  # type: ignore[return-value]

    def remove_person(self, name: str) -> Principal:
        """Forget a person's profile and keys (a running plane refuses them from the next
        request). The last admin stays: without one, nobody could add people again."""
        with self._write_lock():
            users = self._users()
            removed = self._principal(users, name) if name in users["people"] else None
            if removed is None:
                raise NotFound(f"no profile named {name!r}", details={"name": name})
            if removed.admin and [n for n, e in users["people"].items() if e.get("admin")] == [name]:
                raise Conflict(
                    f"{name!r} is the plane's last admin: add another admin first",
                    code="last_admin",
                    details={"name": name},
                )
            users = {**users, "people": {k: v for k, v in users["people"].items() if k != name}}
            self._save_users(users)
        return removed

    def add_instance(
        self, instance_id: str, instance_type: str, host_role: str, *, pool: str | None = None
    ) -> Principal:
        with self._write_lock():
            users = self._users()
            key, secret = _new_key_pair()
            users["instances"][instance_id] = {
                "instance_type": instance_type,
                "host_role": host_role,
                "access_key": key,
                "secret_key": secret,
                **({"pool": pool} if pool else {}),
            }
            self._save_users(users)
        return self.principal(instance_id)  # type: ignore[return-value]

    def _principal(self, users: dict[str, Any], name: str) -> Principal | None:
        account = users.get("account", ACCOUNT_ID)
        if name in users["people"]:
            e = users["people"][name]
            return Principal(
                profile=name,
                kind="user",
                arn=user_arn(account, name),
                access_key=e["access_key"],
                secret_key=e["secret_key"],
                unique_id=_unique_id("AIDA", name),
                admin=bool(e.get("admin")),
            )
        if name in users["instances"]:
            e = users["instances"][name]
            return Principal(
                profile=name,
                kind="instance",
                arn=instance_arn(account, e["host_role"], name),
                access_key=e["access_key"],
                secret_key=e["secret_key"],
                unique_id=_unique_id("AROA", e["host_role"]),
                instance_type=e.get("instance_type"),
                pool=e.get("pool"),
            )
        return None

    def principal(self, name: str) -> Principal | None:
        return self._principal(self._users(), name)

    def principal_for_key(self, access_key: str) -> Principal | None:
        users = self._users()
        for section in ("people", "instances"):
            for name, entry in users[section].items():
                if entry["access_key"] == access_key:
                    return self._principal(users, name)
        return None

    def people(self) -> list[Principal]:
        users = self._users()
        return [p for n in users["people"] if (p := self._principal(users, n))]

    def instances(self) -> list[Principal]:
        users = self._users()
        return [p for n in users["instances"] if (p := self._principal(users, n))]

    def admins(self) -> list[str]:
        return [p.profile for p in self.people() if p.admin]

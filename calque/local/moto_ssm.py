"""The plane's SSM Run Command records on disk, one file per command, and as many as are
live or recent: what a restart reads and what moto keeps in memory follow the commands
that can still matter, not every command ever sent.

    aws/ssm/<command-id>.json   one command and its invocations (moto's record, which the
                                plane keeps true to what its executor did)

A command is written again only when it changed, so sending one command, or one host
finishing one, writes one file. Commands still running (an invocation ``Pending`` or
``InProgress``) are always kept; of the finished ones, the latest ``KEEP_FINISHED`` are
(a scaler asks how a worker start ended shortly after sending it; nothing reads a command
from long ago), and the rest are forgotten by moto and removed from disk, as SSM itself
expires its command history. A state directory from before (one ``aws/ssm.json`` holding
every command) is read once and replaced.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from calque.local.moto_state import read_json, write_durably

if TYPE_CHECKING:
    from calque.local.restored import Restored

log = logging.getLogger("calque.local")

KEEP_FINISHED = 200
RUNNING = frozenset({"Pending", "InProgress", "Delayed", "Cancelling"})
_ORDER = "_calque_order"  # where a command stands among those sent (moto keeps them in a list)


def _running(invocations: list[dict[str, Any]] | None, status: str | None) -> bool:
    """A command still running somewhere (or not yet given its targets)."""
    return any(i.get("Status") in RUNNING for i in invocations or []) or (
        not invocations and status in RUNNING
    )


def running(command: Any) -> bool:
    return _running(getattr(command, "invocations", None), getattr(command, "status", None))


def _fields(command: Any) -> dict[str, Any]:
    fields = {}
    for k, v in vars(command).items():
        try:
            json.dumps(v)
        except TypeError:
            continue  # datetimes: moto makes them anew
        fields[k] = v
    return fields


class SsmCommands:
    """Save and restore one account's and region's Run Command records (see the module)."""

    def __init__(self, directory: Path, *, account: str, region: str, keep_finished: int = KEEP_FINISHED):
        self.dir = directory / "ssm"
        self.legacy = directory / "ssm.json"
        self.account = account
        self.region = region
        self.keep_finished = keep_finished
        self._saved: dict[str, str] = {}  # command id -> digest of what its file holds
        self._order: dict[str, int] = {}
        self._next = 0

    def _backend(self) -> Any:
        from moto.ssm.models import ssm_backends

        return ssm_backends[self.account][self.region]

    def _file(self, command_id: str) -> Path:
        return self.dir / f"{quote(command_id, safe='')}.json"

    def _order_of(self, command_id: str) -> int:
        if command_id not in self._order:
            self._next += 1
            self._order[command_id] = self._next
        return self._order[command_id]

    def prune(self) -> None:
        """moto forgets finished commands past the latest ``keep_finished`` (running ones stay)."""
        commands = self._backend()._commands
        finished = [c for c in list(commands) if not running(c)]
        for old in finished[: max(0, len(finished) - self.keep_finished)]:
            with contextlib.suppress(ValueError):  # another save removed it first
                commands.remove(old)

    def save(self) -> None:
        self.prune()
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        now: dict[str, str] = {}
        for command in list(self._backend()._commands):
            command_id = str(command.command_id)
            doc = {**_fields(command), _ORDER: self._order_of(command_id)}
            data = json.dumps(doc, sort_keys=True).encode()
            digest = hashlib.sha256(data).hexdigest()
            now[command_id] = digest
            if self._saved.get(command_id) != digest:
                write_durably(self._file(command_id), data)
        for gone in set(self._saved) - set(now):
            with contextlib.suppress(FileNotFoundError):
                self._file(gone).unlink()
            self._order.pop(gone, None)
        self._saved = now
        if self.legacy.exists():
            self.legacy.unlink()  # every command it held that still matters has its own file now

    def _saved_commands(self, out: Restored) -> list[dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        legacy = read_json(self.legacy) or {}
        for n, saved in enumerate(legacy.get("commands") or []):
            if isinstance(saved, dict) and "command_id" in saved:
                found[str(saved["command_id"])] = {_ORDER: n - len(legacy["commands"]), **saved}
        if self.dir.is_dir():
            for f in self.dir.glob("*.json"):
                try:
                    saved = json.loads(f.read_bytes())
                    found[unquote(f.name[: -len(".json")])] = saved
                except ValueError as exc:
                    out.problems.append(f"SSM command file {f} could not be read: {exc}")
        ordered = sorted(found.values(), key=lambda s: int(s.get(_ORDER, 0)))
        finished = [s for s in ordered if not _running(s.get("invocations"), s.get("status"))]
        dropped = {id(s) for s in finished[: max(0, len(finished) - self.keep_finished)]}
        return [s for s in ordered if id(s) not in dropped]

    def restore(self, out: Restored) -> None:
        from moto.ssm.models import Command

        backend = self._backend()
        for saved in self._saved_commands(out):
            saved = dict(saved)
            saved.pop(_ORDER, None)
            command = Command(self.account, backend_region=self.region)
            try:
                vars(command).update(saved)
                command.command_id = str(saved["command_id"])
            except (KeyError, TypeError) as exc:
                out.problems.append(f"an SSM command record could not be restored: {exc}")
                continue
            backend._commands.append(command)
            self._order_of(command.command_id)
            out.commands += 1
            for inv in saved.get("invocations") or []:
                if inv.get("Status") in ("Pending", "InProgress"):
                    out.resumed_commands.append(
                        (saved["command_id"], inv["InstanceId"], dict(saved.get("parameters") or {}))
                    )

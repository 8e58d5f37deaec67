"""Real shells completing ``calque`` on <TAB>: an interactive bash or zsh on a pseudo-terminal
loads ``calque completion SHELL`` as a user's rc file does, a line is typed and TAB pressed,
and a probe around the shell's completion records what was offered (and, in zsh, the line as
the completion left it). bash completes through readline's programmable completion, zsh
through its completion system (compinit); nothing calls the script's function by hand.

    with CompletingShell("zsh", env) as sh:
        sh.complete("calque session ch")  -> Completion(offered=["checkin", "checkout"], line=...)

``env`` must put a ``calque`` on PATH (``calque_on_path``)."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
COMPLETE_TIMEOUT_S = 60  # one TAB runs `calque __complete` (a Python start) on a busy machine
KILL_LINE = b"\x15"  # Ctrl-U: both shells' emacs keymaps clear the line with it

# What each shell runs before the first TAB: the completion script, loaded as documented,
# then a probe that writes what the completion offered to $CALQUE_PROBE, one call at a time.
SETUP = {
    "bash": r"""
set -o emacs; bind 'set bell-style none' 2>/dev/null
eval "$(calque completion bash)"
_calque_probe() {
    _calque_complete "$@"
    local c
    for c in "${COMPREPLY[@]}"; do printf 'offered %s\n' "$c"; done >> "$CALQUE_PROBE"
    printf 'line %s\n' "$COMP_LINE" >> "$CALQUE_PROBE"
    printf 'done\n' >> "$CALQUE_PROBE"
}
complete -o default -F _calque_probe calque
printf 'ready %s\n' "$(complete -p calque)" >> "$CALQUE_PROBE"
""",
    "zsh": r"""
bindkey -e; unsetopt beep
autoload -U compinit && compinit -u -D
{LOAD}
compadd() {
    builtin compadd "$@"
    local -a offered
    builtin compadd -O offered "$@"
    (( $#offered )) && print -rl -- "${offered[@]/#/offered }" >> $CALQUE_PROBE
    return 0
}
_calque_probe() {
    zle complete-word
    print -r -- "line $BUFFER" >> $CALQUE_PROBE
    print -r -- done >> $CALQUE_PROBE
}
zle -N _calque_probe; bindkey '^I' _calque_probe
print -r -- "ready ${_comps[calque]}" >> $CALQUE_PROBE
""",
}
ZSH_EVAL = 'eval "$(calque completion zsh)"'


@dataclass
class Completion:
    offered: list[str]  # what the completion function gave the shell, in its order
    line: str  # bash: the line completed (COMP_LINE); zsh: the line after the completion


def calque_on_path(folder: Path, env: dict[str, str]) -> dict[str, str]:
    """``env`` with a ``calque`` on PATH that runs this checkout's CLI with this interpreter."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    calque = bin_dir / "calque"
    calque.write_text(f'#!/bin/sh\nexec {sys.executable} -m calque "$@"\n')
    calque.chmod(0o755)
    pythonpath = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return {**env, "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", "PYTHONPATH": pythonpath}


def shell_missing(shell: str) -> str | None:
    """Why ``shell`` cannot run here, or None."""
    if shutil.which(shell) is None:
        return f"{shell} is not installed (as root, `make test` installs it: the Makefile's shell-tools)"
    return None


class CompletingShell:
    def __init__(self, shell: str, env: dict[str, str], *, load: str = ZSH_EVAL, cwd: Path | None = None):
        """``load``: (zsh) how the script is loaded after compinit (default: eval, as documented)."""
        self.shell = shell
        self.env = env
        self.cwd = cwd or REPO
        self.setup = SETUP[shell].replace("{LOAD}", load)
        self._tmp = tempfile.TemporaryDirectory(prefix="calque-completion-")
        self.probe = Path(self._tmp.name) / "probe"
        self.transcript = bytearray()
        self.registered = ""

    def __enter__(self) -> CompletingShell:
        argv = {"bash": ["bash", "--norc", "--noprofile", "-i"], "zsh": ["zsh", "-f", "-i"]}[self.shell]
        self._master, slave = os.openpty()
        env = {**self.env, "CALQUE_PROBE": str(self.probe), "TERM": "dumb", "HOME": self._tmp.name}
        self.process = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=self.cwd, start_new_session=True
        )
        os.close(slave)
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        os.write(self._master, self.setup.encode())
        self.registered = self._wait_for(lambda lines: next((x for x in lines if x[:5] == "ready"), None))
        return self

    def __exit__(self, *_exc: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        os.close(self._master)
        self._tmp.cleanup()

    def complete(self, line: str) -> Completion:
        """Type ``line``, press TAB once; what the completion offered. The line is cleared after."""
        calls = self._calls()
        os.write(self._master, line.encode() + b"\t")
        self._wait_for(lambda _lines: len(self._calls()) > len(calls) or None)
        os.write(self._master, KILL_LINE)
        return self._calls()[len(calls)]

    def _calls(self) -> list[Completion]:
        calls, offered, typed = [], [], ""
        for entry in self._lines():
            if entry.startswith("offered "):
                offered.append(entry.removeprefix("offered "))
            elif entry.startswith("line "):
                typed = entry.removeprefix("line ")
            elif entry == "done":
                calls.append(Completion(offered, typed))
                offered, typed = [], ""
        return calls

    def _lines(self) -> list[str]:
        try:
            return self.probe.read_text().splitlines()
        except FileNotFoundError:
            return []

    def _wait_for(self, found: Callable[[list[str]], Any]) -> Any:
        deadline = time.monotonic() + COMPLETE_TIMEOUT_S
        while time.monotonic() < deadline:
            answer = found(self._lines())
            if answer is not None:
                return answer
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(
            f"{self.shell} gave no completion within {COMPLETE_TIMEOUT_S}s; probe: {self._lines()}; "
            f"terminal: {bytes(self.transcript[-2000:]).decode(errors='replace')!r}"
        )

    def _drain(self) -> None:
        """Read the terminal as it is written (a shell blocks on a full one); kept for errors."""
        while True:
            try:
                ready, _, _ = select.select([self._master], [], [], 0.5)
                if ready:
                    chunk = os.read(self._master, 65536)
                    if not chunk:
                        return
                    self.transcript += chunk
            except (OSError, ValueError):
                return

"""The real CLI for integration tests: each call its own process, forked from one that has
already imported the CLI.

``plane.cli(...)`` runs ``python -m calque.cli.main ARGS`` as a user's shell would. Each
such process paid Python's start and the CLI's imports (botocore's above all) before it
did anything: about 0.35 s of CPU, for each of the suite's hundreds of calls. Here one
server per test process imports the CLI once and forks a child for each call. The child
takes the call's environment (replacing the server's whole), working directory, stdin,
stdout and stderr, runs the module as ``-m`` runs it, and ends with the exit status the
spawned process would have had, which the caller gets with the output, as from
``subprocess.run``. Nothing of one call reaches another: each is a fresh fork of a server
that never ran a command.

``CALQUE_TEST_CLI_SPAWN=1`` spawns a process per call instead, and so does any call made
when the server cannot start.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import locale
import os
import runpy
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
_INT = struct.Struct("!i")
KILLED = -signal.SIGKILL  # the status of a call whose process ended without saying its own


def _exit_status(code: object) -> int:
    """What the interpreter exits with for ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _child(conn: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    """One call, in the forked child; never returns."""
    status = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the server's own setting, not the CLI's
        for target, fd in zip((0, 1, 2), fds, strict=True):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        module, *argv = request["args"]
        sys.argv = ["-m", *argv]  # run_module puts the module's path first, as -m does
        # run as -m runs it: the module's code afresh as __main__ (the server imported it as
        # itself, which runpy would warn of on stderr), the modules it imports already loaded
        sys.modules.pop(module, None)
        conn.send(_INT.pack(os.getpid()))
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            status = 0
        except SystemExit as exc:
            status = _exit_status(exc.code)
        except BaseException:
            traceback.print_exc()
            status = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        with contextlib.suppress(OSError):
            conn.send(_INT.pack(status))
        os._exit(status)


def serve(path: str) -> None:
    """The server: import the CLI once, then fork a child for each call."""
    import calque.cli.main as cli_main
    from calque.cli import client, context  # noqa: F401 (what every command imports)

    cli_main.build_parser()  # imports each command's module
    import botocore.credentials  # a command's credentials
    import botocore.session  # noqa: F401

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    parent = os.getppid()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.bind(path)
    server.listen(64)
    server.settimeout(2.0)
    while True:
        try:
            conn, _ = server.accept()
        except TimeoutError:
            if os.getppid() != parent:
                return  # the test process is gone (killed, say): so is its server
            continue
        conn.setblocking(True)
        try:
            message, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 3)
        except OSError:
            conn.close()
            continue
        if not message or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            conn.close()
            continue
        if os.fork() == 0:
            server.close()
            _child(conn, json.loads(message), fds)
        for fd in fds:
            os.close(fd)
        conn.close()


class ForkServer:
    """This test process's CLI server, started at its first call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._path = ""
        self._failed = False

    def _ensure(self) -> str | None:
        with self._lock:
            if self._process is not None and self._process.poll() is None:
                return self._path
            if self._failed:
                return None
            where = tempfile.mkdtemp(prefix="calque-cli-fork-")
            self._path = os.path.join(where, "socket")
            log = open(os.path.join(where, "server.log"), "wb")  # noqa: SIM115 (the server's for its life)
            self._process = subprocess.Popen(
                [sys.executable, "-m", "tests.integration.cli_fork", self._path],
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
            log.close()
            deadline = time.monotonic() + 60
            while not os.path.exists(self._path):
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self._process.kill()
                    self._failed = True  # every call spawns its own process from now on
                    return None
                time.sleep(0.02)
            atexit.register(self.close)
            return self._path

    def close(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        if self._path:
            shutil.rmtree(os.path.dirname(self._path), ignore_errors=True)

    def run(
        self, args: list[str], *, env: dict[str, str], cwd: Path, input: str | None, timeout: float
    ) -> subprocess.CompletedProcess[str] | None:
        """``python -m calque.cli.main`` with ``args`` (``args`` starting at the module's own
        name), as ``subprocess.run(..., capture_output=True, text=True)`` answers it; None
        when there is no server (the caller spawns a process)."""
        path = self._ensure()
        if path is None:
            return None
        encoding = locale.getpreferredencoding(False)
        with contextlib.ExitStack() as stack:
            files = [stack.enter_context(tempfile.TemporaryFile()) for _ in range(3)]
            stdin, stdout, stderr = files
            if input is not None:
                stdin.write(input.encode(encoding))
                stdin.seek(0)
            conn = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET))
            conn.settimeout(timeout)
            try:
                conn.connect(path)
            except OSError:
                return None  # the server is gone: this call spawns its own process
            request = {"args": args, "env": env, "cwd": str(cwd)}
            socket.send_fds(conn, [json.dumps(request).encode()], [f.fileno() for f in files])
            pid = 0
            try:
                answer = conn.recv(_INT.size)
                if len(answer) == _INT.size:
                    (pid,) = _INT.unpack(answer)
                    answer = conn.recv(_INT.size)
            except TimeoutError:
                if pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(
                    [sys.executable, "-m", *args], timeout, _read(stdout, encoding), _read(stderr, encoding)
                ) from None
            status = _INT.unpack(answer)[0] if len(answer) == _INT.size else KILLED
            return subprocess.CompletedProcess(
                [sys.executable, "-m", *args], status, _read(stdout, encoding), _read(stderr, encoding)
            )


def _read(fh: Any, encoding: str) -> str:
    """What a call wrote, as ``text=True`` reads it (universal newlines)."""
    fh.seek(0)
    return fh.read().decode(encoding).replace("\r\n", "\n").replace("\r", "\n")


SERVER = ForkServer()


def run_cli(
    args: list[str], *, env: dict[str, str], cwd: Path, input: str | None, timeout: float
) -> subprocess.CompletedProcess[str]:
    """The CLI with ``args`` (after ``-m``), forked from this process's server, or spawned."""
    if os.environ.get("CALQUE_TEST_CLI_SPAWN") != "1":
        done = SERVER.run(args, env=env, cwd=cwd, input=input, timeout=timeout)
        if done is not None:
            return done
    return subprocess.run(
        [sys.executable, "-m", *args],
        env=env,
        capture_output=True,
        text=True,
        input=input,
        timeout=timeout,
        check=False,
        cwd=cwd,
    )


if __name__ == "__main__":
    serve(sys.argv[1])

"""The MPS control daemon on a real host: one per GPU, each with its own pipe and log
directories, driven through `nvidia-cuda-mps-control` with that GPU's environment.

The per-client limits are the daemon's: `status` asks it (get_default_*), and a
set_default_* it refuses fails the start. The slot count is ours, not the daemon's: it
is kept beside the pipe directory (calque-mps.json) so `export` and `assert` can read
the layout back. One MPS server serves one Unix user at a time, so every tenant of a
GPU's slots runs as that GPU's shared MPS account (host_agent.tenants).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from host_agent.backend import GpuInfo, MpsState
from host_agent.errors import GpuError

DEFAULT_MPS_ROOT = "/var/run/calque/mps"
CONTROL = "nvidia-cuda-mps-control"
QUIT_WAIT_SECONDS = 30.0


def mps_dirs(root: str | Path, gpu_index: int) -> tuple[Path, Path]:
    """The pipe and log directories of GPU ``gpu_index``'s MPS control daemon under ``root``:
    one daemon per GPU, each in a directory of its own (on a real host and on the fake)."""
    base = Path(root) / f"gpu{gpu_index}"
    return base / "pipe", base / "log"


class SubprocessMps:
    def __init__(self, root: str = DEFAULT_MPS_ROOT, *, on_change: Callable[[str], None] | None = None):
        self.root = Path(root)
        self._on_change = on_change or (lambda what: None)

    def _dirs(self, gpu: GpuInfo) -> tuple[Path, Path]:
        return mps_dirs(self.root, gpu.index)

    def _env(self, gpu: GpuInfo) -> dict[str, str]:
        pipe, log = self._dirs(gpu)
        return {
            **os.environ,
            "CUDA_VISIBLE_DEVICES": gpu.uuid,
            "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(log),
        }

    def _control(
        self, gpu: GpuInfo, command: str | None = None, *, daemon: bool = False
    ) -> subprocess.CompletedProcess:
        argv = [CONTROL, "-d"] if daemon else [CONTROL]
        try:
            return subprocess.run(
                argv,
                input=command or "",
                env=self._env(gpu),
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except FileNotFoundError:
            raise GpuError(f"{CONTROL} is not installed on this host", code="mps_unavailable") from None
        except subprocess.TimeoutExpired:
            raise GpuError(f"{CONTROL} did not answer on GPU {gpu.index}", code="mps_unhealthy") from None

    def _settings_file(self, gpu: GpuInfo) -> Path:
        return self.root / f"gpu{gpu.index}" / "calque-mps.json"

    def status(self, gpu: GpuInfo) -> MpsState:
        pipe, log = self._dirs(gpu)
        settings: dict = {}
        with contextlib.suppress(OSError, ValueError):
            settings = json.loads(self._settings_file(gpu).read_text())
        running = (pipe / "control").exists()
        healthy = False
        threads: int | None = None
        pinned: int | None = None
        if running:
            try:
                healthy = self._control(gpu, "get_server_list\n").returncode == 0
                # The limits the daemon applies, not what we meant to set.
                threads = _percentage(self._ask(gpu, "get_default_active_thread_percentage"))
                pinned = _mib(self._ask(gpu, "get_default_device_pinned_mem_limit 0"))
            except GpuError:
                healthy = False
        return MpsState(
            running=running,
            healthy=healthy,
            pipe_directory=str(pipe),
            log_directory=str(log),
            clients=settings.get("clients"),
            active_thread_percentage=threads,
            pinned_memory_limit_mib=pinned,
        )

    def _ask(self, gpu: GpuInfo, command: str) -> str:
        res = self._control(gpu, command + "\n")
        if res.returncode != 0:
            raise GpuError(f"MPS control daemon on GPU {gpu.index} refused {command!r}", code="mps_unhealthy")
        return res.stdout.strip()

    def _set(self, gpu: GpuInfo, command: str) -> None:
        res = self._control(gpu, command + "\n")
        said = (res.stdout + res.stderr).strip()
        if res.returncode != 0 or re.search(r"(?i)\b(error|invalid|fail)", said):
            raise GpuError(
                f"MPS control daemon on GPU {gpu.index} refused {command!r}: {said or res.returncode}",
                code="mps_failed",
                details={"command": command, "answer": said},
            )

    def start(
        self,
        gpu: GpuInfo,
        *,
        clients: int,
        active_thread_percentage: int | None,
        pinned_memory_limit_mib: int | None,
    ) -> MpsState:
        self._on_change(f"start the MPS control daemon on GPU {gpu.index}")
        pipe, log = self._dirs(gpu)
        pipe.mkdir(parents=True, exist_ok=True)
        log.mkdir(parents=True, exist_ok=True)
        res = self._control(gpu, daemon=True)
        if res.returncode != 0:
            raise GpuError(
                f"MPS control daemon on GPU {gpu.index} did not start: {res.stderr.strip()}",
                code="mps_failed",
            )
        # Per-client defaults for every server this daemon spawns; a refusal stops the daemon again.
        try:
            if active_thread_percentage is not None:
                self._set(gpu, f"set_default_active_thread_percentage {active_thread_percentage}")
            if pinned_memory_limit_mib is not None:
                self._set(gpu, f"set_default_device_pinned_mem_limit 0 {pinned_memory_limit_mib}M")
        except GpuError:
            self._quit(gpu)
            raise
        self._settings_file(gpu).write_text(
            json.dumps(
                {
                    "clients": clients,
                    "active_thread_percentage": active_thread_percentage,
                    "pinned_memory_limit_mib": pinned_memory_limit_mib,
                }
            )
        )
        return self.status(gpu)

    def stop(self, gpu: GpuInfo) -> None:
        self._on_change(f"stop the MPS control daemon on GPU {gpu.index}")
        self._quit(gpu)
        with contextlib.suppress(FileNotFoundError):
            self._settings_file(gpu).unlink()

    def _quit(self, gpu: GpuInfo) -> None:
        """`quit`, then wait until the daemon has gone (its control pipe removed)."""
        pipe, _ = self._dirs(gpu)
        self._control(gpu, "quit\n")
        deadline = time.monotonic() + QUIT_WAIT_SECONDS
        while (pipe / "control").exists():
            if time.monotonic() >= deadline:
                raise GpuError(
                    f"MPS control daemon on GPU {gpu.index} did not quit within {QUIT_WAIT_SECONDS:g}s",
                    code="mps_unhealthy",
                )
            time.sleep(0.1)


def _percentage(answer: str) -> int | None:
    m = re.search(r"(\d+(?:\.\d+)?)", answer)
    return round(float(m.group(1))) if m else None


def _mib(answer: str) -> int | None:
    """ "11000M", "0=11000M", "10G" -> MiB; None when the daemon has no limit set."""
    m = re.search(r"(\d+(?:\.\d+)?)\s*([KMGT]?)B?\s*$", answer.split("=")[-1].strip(), re.IGNORECASE)
    if not m or float(m.group(1)) == 0:
        return None
    scale = {"": 1 / (1024 * 1024), "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[m.group(2).upper()]
    return round(float(m.group(1)) * scale)

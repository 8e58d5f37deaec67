"""The real MPS control path, against a stand-in `nvidia-cuda-mps-control` on PATH that
records how it was called (there is no CUDA here)."""

from __future__ import annotations

import os
import stat

import pytest

from host_agent.backend import GpuInfo
from host_agent.mps import SubprocessMps

pytestmark = pytest.mark.integration

# Like the real daemon: it keeps the per-client defaults it was given and answers for them,
# refuses a thread percentage over 100, and goes away a moment after `quit`.
CONTROL = """#!/bin/sh
input="$(cat)"
echo "$CUDA_VISIBLE_DEVICES|$CUDA_MPS_PIPE_DIRECTORY|$CUDA_MPS_LOG_DIRECTORY|$*|$input" >> "$MPS_CALLS"
d="$CUDA_MPS_PIPE_DIRECTORY"
if [ "$1" = "-d" ]; then touch "$d/control"; echo 100 > "$d/threads"; echo 0 > "$d/pinned"; exit 0; fi
set -- $input
case "$1" in
  quit) (sleep 0.5; rm -f "$d/control") >/dev/null 2>&1 & ;;
  get_server_list) ;;
  set_default_active_thread_percentage)
    if [ "$2" -gt 100 ]; then echo "Invalid active thread percentage"; exit 0; fi
    echo "$2" > "$d/threads" ;;
  get_default_active_thread_percentage) printf '%s.0\\n' "$(cat "$d/threads")" ;;
  set_default_device_pinned_mem_limit) echo "$3" > "$d/pinned" ;;
  get_default_device_pinned_mem_limit) echo "$(cat "$d/pinned")" ;;
esac
exit 0
"""

GPU = GpuInfo(
    index=2,
    uuid="GPU-1111",
    name="NVIDIA L40S",
    memory_mib=46068,
    mig_capable=False,
    mig_current=None,
    mig_pending=None,
)


@pytest.fixture
def control(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "nvidia-cuda-mps-control"
    exe.write_text(CONTROL)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    calls = tmp_path / "calls.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("MPS_CALLS", str(calls))
    return calls


def test_daemon_per_gpu_with_its_own_directories_and_client_defaults(control, tmp_path):
    changes: list[str] = []
    mps = SubprocessMps(str(tmp_path / "mps"), on_change=changes.append)
    # When the daemon is started for GPU 2 with per-client limits
    state = mps.start(GPU, clients=4, active_thread_percentage=25, pinned_memory_limit_mib=11000)
    # Then it runs, answers, and remembers the slots
    assert state.running
    assert state.healthy
    assert state.clients == 4
    assert (state.active_thread_percentage, state.pinned_memory_limit_mib) == (25, 11000)
    assert state.pipe_directory == str(tmp_path / "mps" / "gpu2" / "pipe")
    calls = control.read_text().splitlines()
    pipe, log = str(tmp_path / "mps/gpu2/pipe"), str(tmp_path / "mps/gpu2/log")
    assert calls[0] == f"GPU-1111|{pipe}|{log}|-d|"
    assert f"GPU-1111|{pipe}|{log}||set_default_active_thread_percentage 25" in calls
    assert f"GPU-1111|{pipe}|{log}||set_default_device_pinned_mem_limit 0 11000M" in calls
    # And stopping it quits the daemon, and waits until it has gone
    mps.stop(GPU)
    assert not mps.status(GPU).running
    assert changes == ["start the MPS control daemon on GPU 2", "stop the MPS control daemon on GPU 2"]


def test_missing_mps_control_is_a_clear_error(tmp_path, monkeypatch):
    from host_agent.errors import GpuError

    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(GpuError, match="not installed"):
        SubprocessMps(str(tmp_path / "mps")).start(
            GPU, clients=2, active_thread_percentage=None, pinned_memory_limit_mib=None
        )


def test_status_reports_the_limits_the_daemon_applies_not_what_was_meant(control, tmp_path):
    # Given a daemon started with 25% threads, whose default someone later changed to 50%
    mps = SubprocessMps(str(tmp_path / "mps"))
    mps.start(GPU, clients=4, active_thread_percentage=25, pinned_memory_limit_mib=None)
    (tmp_path / "mps" / "gpu2" / "pipe" / "threads").write_text("50\n")
    # When the agent reads its state / Then it reports what the daemon says
    assert mps.status(GPU).active_thread_percentage == 50
    mps.stop(GPU)


def test_a_limit_the_daemon_refuses_fails_the_start_and_leaves_no_daemon(control, tmp_path):
    from host_agent.errors import GpuError

    mps = SubprocessMps(str(tmp_path / "mps"))
    # When the daemon is given a thread percentage it refuses
    with pytest.raises(GpuError, match="refused") as caught:
        mps.start(GPU, clients=2, active_thread_percentage=150, pinned_memory_limit_mib=None)
    # Then the start fails with its answer, and no daemon is left running unlimited
    assert caught.value.code == "mps_failed"
    assert not mps.status(GPU).running

"""The agent's ``worker`` verb: one worker per slice, each bound to its own slice, the runner
package taken from the artifact bucket, workers that outlive the command that started them."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from host_agent import pool_workers as pw
from host_agent.cli import main

pytestmark = pytest.mark.unit

FOUR_SLICES = json.dumps({"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]})


class RecordingLauncher(pw.Launcher):
    def __init__(self) -> None:
        super().__init__(use_systemd=False)
        self.started: list[dict[str, Any]] = []
        self.stopped: list[dict[str, Any]] = []

    def start(
        self, unit: str, argv: list[str], env: dict[str, str], log: Path, cwd: Path, jail: Any = None
    ) -> dict[str, Any]:
        self.started.append({"unit": unit, "argv": argv, "env": env})
        return {"pid": os.getpid()}  # "alive"

    def stop(self, info: dict[str, Any]) -> None:
        self.stopped.append(info)


class FakeS3:
    def __init__(self, objects: dict[tuple[str, str], bytes]) -> None:
        self.objects = objects
        self.downloads = 0

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        self.downloads += 1
        if (Bucket, Key) not in self.objects:
            raise RuntimeError("An error occurred (NoSuchKey) when calling the GetObject operation")
        return {"Body": io.BytesIO(self.objects[(Bucket, Key)])}


def _zip(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return buf.getvalue()


def _doc(n: int, **over: Any) -> dict[str, Any]:
    doc = {
        "pool": "small-models",
        "queue_url": "http://sqs/q",
        "runner": "my_runner:Runner",
        "package": {"bucket": "art", "key": "pools/small-models/package/abc.zip"},
        "worker_ids": [f"w-0001-{k}" for k in range(n)],
        "visibility_s": 30,
        "idle_timeout_s": 600,
        "poll_wait_s": 5,
    }
    doc.update(over)
    return doc


@pytest.fixture
def launcher(monkeypatch) -> RecordingLauncher:
    rec = RecordingLauncher()
    monkeypatch.setattr(pw, "Launcher", lambda use_systemd=None: rec)
    return rec


@pytest.fixture
def s3(monkeypatch) -> FakeS3:
    fake = FakeS3(
        {("art", "pools/small-models/package/abc.zip"): _zip({"my_runner.py": "class Runner: pass\n"})}
    )
    real = pw.stage_package
    monkeypatch.setattr(pw, "stage_package", lambda doc, d, s3=None, **kw: real(doc, d, fake))
    return fake


def _start(tmp_path: Path, doc: dict[str, Any], *extra: str, itype: str = "g7e.2xlarge") -> tuple[int, Any]:
    args = ["--simulate", itype, "--state", str(tmp_path / "host.json"), "--instance-id", "i-0abc"]
    args += ["--report-to", "http://api", "worker", "start", "--worker", json.dumps(doc), *extra]
    return main(args), None


def test_start_with_a_mig_layout_runs_one_worker_per_slice_each_bound_to_its_own_mig_device(
    tmp_path, launcher, s3, capsys
):
    rc, _ = _start(tmp_path, _doc(4), "--spec", FOUR_SLICES)
    out = json.loads(capsys.readouterr().out)
    assert rc == 0, out
    assert out["applied"] is True
    assert [w["slice_id"] for w in out["workers"]] == [f"g0-1g.24gb-{k}" for k in range(4)]
    bound = [s["env"]["CUDA_VISIBLE_DEVICES"] for s in launcher.started]
    assert len(set(bound)) == 4
    assert all(b.startswith("MIG-") for b in bound)
    assert bound == [w["device_uuid"] for w in out["workers"]]
    # each worker is the real worker module with its own id, this instance and the staged package
    argv = launcher.started[2]["argv"]
    assert argv[1:3] == ["-m", "host_agent.worker"]
    assert argv[argv.index("--worker-id") + 1] == "w-0001-2"
    assert argv[argv.index("--instance-id") + 1] == "i-0abc"
    package = Path(argv[argv.index("--package") + 1])
    assert (package / "my_runner.py").read_text().startswith("class Runner")
    assert launcher.started[0]["env"]["CALQUE_SLICE_ID"] == "g0-1g.24gb-0"
    # records for status and stop, where the plane's tooling finds them (beside --state)
    assert sorted(p.name for p in (tmp_path / "pools" / "small-models").glob("*.json")) == [
        f"w-0001-{k}.json" for k in range(4)
    ]


def test_start_again_keeps_the_running_workers_and_the_package_is_downloaded_once(
    tmp_path, launcher, s3, capsys
):
    _start(tmp_path, _doc(4), "--spec", FOUR_SLICES)
    capsys.readouterr()
    rc, _ = _start(tmp_path, _doc(4), "--spec", FOUR_SLICES)
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert len(launcher.started) == 4
    assert all(w["already_running"] for w in out["workers"])
    assert s3.downloads == 1


def test_a_slot_whose_worker_exited_gets_a_worker_again_and_the_others_stay(tmp_path, launcher, s3, capsys):
    # Given four workers started, and the one on slot 2 since exited (its process is gone)
    _start(tmp_path, _doc(4), "--spec", FOUR_SLICES)
    capsys.readouterr()
    record = tmp_path / "pools" / "small-models" / "w-0001-2.json"
    dead = subprocess.Popen(["true"])
    dead.wait()
    record.write_text(json.dumps({**json.loads(record.read_text()), "pid": dead.pid}))
    # When the control plane starts that slot's worker again, and the whole set once more
    rc, _ = _start(tmp_path, _doc(4, worker_ids=["w-0001-2"]), "--spec", FOUR_SLICES)
    out = json.loads(capsys.readouterr().out)
    # Then a new worker runs on slot 2's slice, recorded in place of the old one
    assert rc == 0, out
    assert len(launcher.started) == 5
    assert launcher.started[4]["env"]["CALQUE_SLICE_ID"] == "g0-1g.24gb-2"
    assert [w.get("already_running", False) for w in out["workers"]] == [False]
    assert json.loads(record.read_text())["pid"] == os.getpid()
    rc, _ = _start(tmp_path, _doc(4), "--spec", FOUR_SLICES)
    assert all(w["already_running"] for w in json.loads(capsys.readouterr().out)["workers"])
    assert len(launcher.started) == 5


@pytest.mark.parametrize(
    ("state", "running"),
    [
        ("active", True),
        ("activating", True),
        ("deactivating", True),
        ("inactive", False),
        ("failed", False),
        ("", False),
    ],
)
def test_a_systemd_worker_runs_while_its_unit_is_loaded_and_not_ended(monkeypatch, state, running):
    calls: list[list[str]] = []

    class Shown:
        stdout = f"{state}\n"

    monkeypatch.setattr(pw.subprocess, "run", lambda cmd, **kw: calls.append(cmd) or Shown())
    assert pw.Launcher(use_systemd=True).running({"unit": "calque-worker-p-w1", "pid": 4242}) is running
    assert calls == [["systemctl", "show", "--property=ActiveState", "--value", "calque-worker-p-w1"]]


def test_without_a_layout_there_is_one_worker_per_gpu(tmp_path, launcher, s3, capsys):
    rc, _ = _start(tmp_path, _doc(1), itype="g6e.xlarge")
    out = json.loads(capsys.readouterr().out)
    assert rc == 0, out
    assert out["applied"] is False
    assert [w["slice_id"] for w in out["workers"]] == ["g0-whole"]
    assert launcher.started[0]["env"]["CUDA_VISIBLE_DEVICES"].startswith("GPU-")


def test_more_worker_ids_than_slices_is_refused_and_starts_nothing(tmp_path, launcher, s3, capsys):
    rc, _ = _start(
        tmp_path,
        _doc(3),
        "--spec",
        json.dumps({"version": "v1", "gpus": [{"devices": "all", "mig": {"2g.48gb": 2}}]}),
    )
    captured = capsys.readouterr()
    assert rc == 1
    assert "asked for 3 worker(s) but this host has 2 slice(s)" in captured.err
    assert json.loads(captured.out)["error"]["code"] == "slices_mismatch"
    assert launcher.started == []


def test_fewer_worker_ids_than_slices_start_on_their_own_slots_and_leave_the_rest_untouched(
    tmp_path, launcher, s3, capsys
):
    # Given a host of four 1g.24gb slices, When the pool asks for three workers (slots 0..2)
    rc, _ = _start(tmp_path, _doc(3), "--spec", FOUR_SLICES)
    out = json.loads(capsys.readouterr().out)
    # Then three workers run, each on the slice its slot names, and the fourth slice has none
    assert rc == 0, out
    assert [(w["worker_id"], w["slice_id"]) for w in out["workers"]] == [
        (f"w-0001-{k}", f"g0-1g.24gb-{k}") for k in range(3)
    ]
    assert [s["env"]["CALQUE_SLICE_ID"] for s in launcher.started] == [f"g0-1g.24gb-{k}" for k in range(3)]
    assert sorted(p.name for p in (tmp_path / "pools" / "small-models").glob("*.json")) == [
        f"w-0001-{k}.json" for k in range(3)
    ]


def test_a_worker_id_is_bound_to_the_slice_its_slot_names_not_to_its_place_in_the_list(
    tmp_path, launcher, s3, capsys
):
    rc, _ = _start(tmp_path, _doc(1, worker_ids=["w-00ab-3", "w-00ab-1"]), "--spec", FOUR_SLICES)
    out = json.loads(capsys.readouterr().out)
    assert rc == 0, out
    assert {w["worker_id"]: w["slice_id"] for w in out["workers"]} == {
        "w-00ab-1": "g0-1g.24gb-1",
        "w-00ab-3": "g0-1g.24gb-3",
    }


def test_a_bare_worker_id_is_slot_0_of_a_one_slot_host(tmp_path, launcher, s3, capsys):
    rc, _ = _start(tmp_path, _doc(1, worker_ids=["w-1a2b3c4d"]), itype="g6e.xlarge")
    out = json.loads(capsys.readouterr().out)
    assert rc == 0, out
    assert [(w["worker_id"], w["slice_id"]) for w in out["workers"]] == [("w-1a2b3c4d", "g0-whole")]


@pytest.mark.parametrize(
    ("ids", "named", "says"),
    [
        (["w-00ab-0", "w-00ab-4"], "w-00ab-4", "names slot 4 but this host has 4 slice(s)"),
        (["w-00ab-1", "w-00cd-1"], "w-00cd-1", "names slot 1, already named by w-00ab-1"),
        (["w-00ab"], "w-00ab", "names no slot (w-<hex>-<slot>) but this host has 4 slices"),
    ],
)
def test_a_slot_the_host_cannot_give_is_refused_naming_the_worker_and_starts_nothing(
    tmp_path, launcher, s3, capsys, ids, named, says
):
    rc, _ = _start(tmp_path, _doc(1, worker_ids=ids), "--spec", FOUR_SLICES)
    captured = capsys.readouterr()
    assert rc == 1
    assert f"worker id {named} {says}" in captured.err
    assert json.loads(captured.out)["error"]["details"]["worker_id"] == named
    assert launcher.started == []
    assert not list((tmp_path / "pools").glob("*/*.json"))


def test_slot_order_is_the_planners_order_with_ordinals_counted_as_numbers():
    from calque.catalog.planner import expand_slices
    from calque.contracts.layout import LayoutSpec

    # Given a layout of two GPUs, one with two MIG profiles and one with twelve MPS clients
    spec = LayoutSpec.model_validate(
        {"version": "v1", "gpus": [
            {"devices": [0], "mig": {"2g.48gb": 1, "1g.24gb": 2}},
            {"devices": [1], "mps": {"clients": 12}},
        ]}
    )  # fmt: skip
    planned = expand_slices("g7e.12xlarge", spec)

    class Seen:  # what the agent reads back, shuffled
        def __init__(self, p: Any) -> None:
            self.slice_id, self.gpu_index, self.backend, self.profile = (
                p.slice_id, p.gpu_index, p.backend, p.profile
            )  # fmt: skip

    seen = [Seen(p) for p in reversed(planned)]
    # Then the agent's slot order is the planner's: slot k is the same slice on both sides
    assert [s.slice_id for s in pw.slot_order(seen)] == [p.slice_id for p in planned]


def test_a_package_missing_from_the_bucket_is_a_clear_refusal(tmp_path, launcher, s3, capsys):
    doc = _doc(1, package={"bucket": "art", "key": "pools/small-models/package/nope.zip"})
    rc, _ = _start(tmp_path, doc, itype="g6e.xlarge")
    captured = capsys.readouterr()
    assert rc == 1
    assert "cannot download the runner package s3://art/pools/small-models/package/nope.zip" in captured.err
    assert launcher.started == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"pool": "Bad Name"}, "pool"),
        ({"runner": "no-colon"}, "runner"),
        ({"worker_ids": []}, "worker_ids"),
        ({"worker_ids": ["a", "a"]}, "worker_ids"),
        ({"package": {"bucket": "b"}}, "package"),
        ({"surprise": 1}, "surprise"),
        ({"visibility_s": 0}, "visibility_s"),
    ],
)
def test_a_bad_worker_document_is_refused_naming_the_field(tmp_path, launcher, s3, capsys, change, field):
    rc, _ = _start(tmp_path, _doc(1, **change), itype="g6e.xlarge")
    captured = capsys.readouterr()
    assert rc == 1
    assert json.loads(captured.out)["error"]["details"]["field"] == field
    assert launcher.started == []


class _Interleaving:
    """A download body that runs ``meanwhile`` once its first chunk is read."""

    def __init__(self, data: bytes, meanwhile: Any) -> None:
        self.buf, self.meanwhile = io.BytesIO(data), meanwhile

    def read(self, n: int) -> bytes:
        chunk = self.buf.read(n)
        if self.meanwhile is not None:
            run, self.meanwhile = self.meanwhile, None
            run()
        return chunk


def test_two_starts_staging_one_package_at_once_both_get_it_whole(tmp_path):
    # Given two starts of one pool on one disk (two commands, or the local plane's simulated
    # hosts), the second staging the package whole while the first is mid-download
    data = _zip({"my_runner.py": "class Runner: pass\n"})
    doc = pw.WorkerDoc.parse(json.dumps(_doc(1)))
    second: list[str] = []

    class S3:
        calls = 0

        def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:
            self.calls += 1
            if self.calls == 1:
                return {
                    "Body": _Interleaving(data, lambda: second.append(pw.stage_package(doc, tmp_path, self)))
                }
            return {"Body": io.BytesIO(data)}

    first = pw.stage_package(doc, tmp_path, S3())
    # Then both name one complete copy, and no staging directory is left behind
    assert second == [first]
    assert (Path(first) / "src" / "my_runner.py").read_text() == "class Runner: pass\n"
    assert (Path(first) / ".complete").exists()
    assert [p.name for p in (tmp_path / "package").iterdir()] == [Path(first).name]


def test_an_incomplete_copy_left_by_a_staging_that_died_is_replaced(tmp_path):
    doc = pw.WorkerDoc.parse(json.dumps(_doc(1)))
    left = tmp_path / "package" / "pools_small-models_package_abc.zip"
    (left / "src").mkdir(parents=True)
    (left / "src" / "half.py").write_text("")  # no .complete: it died mid-way
    fake = FakeS3({("art", "pools/small-models/package/abc.zip"): _zip({"my_runner.py": "x = 1\n"})})
    staged = Path(pw.stage_package(doc, tmp_path, fake))
    assert staged == left
    assert sorted(p.name for p in (staged / "src").iterdir()) == ["my_runner.py"]
    assert (staged / ".complete").exists()


def test_a_zip_reaching_outside_its_directory_is_refused(tmp_path):
    fake = FakeS3({("art", "k.zip"): _zip({"../evil.py": "x"})})
    doc = pw.WorkerDoc.parse(json.dumps(_doc(1, package={"bucket": "art", "key": "k.zip"})))
    with pytest.raises(pw.InvalidInput, match="unsafe path"):
        pw.stage_package(doc, tmp_path, fake)
    assert not (tmp_path.parent / "evil.py").exists()


def test_status_and_stop_name_the_pools_workers(tmp_path, launcher, s3, capsys):
    _start(tmp_path, _doc(4), "--spec", FOUR_SLICES)
    capsys.readouterr()
    base = ["--simulate", "g7e.2xlarge", "--state", str(tmp_path / "host.json")]
    assert main([*base, "worker", "status", "--pool", "small-models"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert [w["running"] for w in status["workers"]] == [True] * 4
    assert main([*base, "worker", "stop", "--pool", "small-models"]) == 0
    assert len(json.loads(capsys.readouterr().out)["workers"]) == 4
    assert len(launcher.stopped) == 4
    assert list((tmp_path / "pools" / "small-models").glob("*.json")) == []


def test_stop_without_a_pool_is_refused(tmp_path, capsys):
    assert main(["--simulate", "g6e.xlarge", "worker", "stop"]) == 1
    assert "worker stop needs --pool" in capsys.readouterr().err


def test_a_detached_worker_outlives_its_starter_in_a_session_of_its_own(tmp_path):
    info = pw.Launcher(use_systemd=False).start(
        "u", ["sleep", "30"], dict(os.environ), tmp_path / "log", tmp_path
    )
    try:
        assert os.getsid(info["pid"]) == info["pid"] != os.getsid(0)
        assert (tmp_path / "log").stat().st_mode & 0o777 == 0o600  # the runner's output: not for all
    finally:
        os.kill(info["pid"], signal.SIGKILL)
        time.sleep(0.05)
        pw._alive(info["pid"])


def test_systemd_hosts_get_a_restarting_transient_unit(tmp_path, monkeypatch):
    calls: list[list[str]] = []

    class Done:
        stdout = "4242\n"

    monkeypatch.setattr(pw.subprocess, "run", lambda cmd, **kw: calls.append(cmd) or Done())
    info = pw.Launcher(use_systemd=True).start(
        "calque-worker-p-w1",
        ["python3", "-m", "host_agent.worker"],
        {"CUDA_VISIBLE_DEVICES": "MIG-x"},
        tmp_path / "l",
        tmp_path,
    )
    assert info == {"unit": "calque-worker-p-w1", "pid": 4242}
    # the log systemd appends to is made first, root's alone (systemd would make it 0644)
    assert (tmp_path / "l").stat().st_mode & 0o777 == 0o600
    assert calls[0] == ["systemctl", "reset-failed", "calque-worker-p-w1"]
    run = calls[1]
    assert run[:3] == ["systemd-run", "--unit", "calque-worker-p-w1"]
    assert "--property=Restart=on-failure" in run
    assert "--setenv=CUDA_VISIBLE_DEVICES=MIG-x" in run
    assert run[-3:] == ["python3", "-m", "host_agent.worker"]

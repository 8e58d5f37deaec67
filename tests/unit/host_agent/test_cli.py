"""The agent's command line: usage, exit codes, output."""

from __future__ import annotations

import json

import pytest

from host_agent.cli import main

pytestmark = pytest.mark.unit


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["apply"])  # --spec missing
    assert exc.value.code == 2


@pytest.mark.parametrize(
    ("verb", "says"),
    [
        ("inventory", "every GPU: MIG mode, instances, processes, MPS daemon"),
        ("export", "the current state as a layout spec"),
        ("reclaim", "stop every process on a slice and confirm none remains"),
        ("report", "the agent's report of this host"),
    ],
)
def test_each_verbs_help_says_what_it_does(capsys, verb, says):
    # When a host admin asks a verb for its help
    with pytest.raises(SystemExit) as exc:
        main([verb, "--help"])
    # Then it says what the verb does, not only its usage line
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert says in out


def test_every_option_of_reclaim_and_simulate_process_is_explained(capsys):
    with pytest.raises(SystemExit):
        main(["simulate-process", "--help"])
    out = capsys.readouterr().out
    assert "the slice, e.g. g0-1g.24gb-1" in out
    assert "GPU memory it holds, in MiB" in out


@pytest.mark.parametrize("url", ["notaurl", "ftp://api.example/prod", "https://", "api.example/prod"])
def test_a_report_to_that_is_not_an_http_url_is_a_usage_error_before_anything_runs(capsys, tmp_path, url):
    # Given a simulated host's state
    state = tmp_path / "host.json"
    assert main(["--simulate", "g7e.2xlarge", "--state", str(state), "inventory"]) == 0
    before = state.read_text()
    capsys.readouterr()
    # When a verb is asked to report to something that is not the control plane's URL
    with pytest.raises(SystemExit) as exc:
        main(["--state", str(state), "--report-to", url, "apply", "--spec", '{"version": "v1", "gpus": []}'])
    # Then it is a usage error naming the flag (not a traceback from the signer), and nothing ran
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --report-to" in err
    assert "is not a URL of the control plane" in err
    assert "Traceback" not in err
    assert state.read_text() == before


def test_unknown_instance_type_is_a_one_line_refusal(capsys):
    rc = main(["--simulate", "m5.large", "inventory"])
    captured = capsys.readouterr()
    assert rc == 1
    assert captured.err.startswith("error: unknown or non-GPU instance type 'm5.large'")
    assert json.loads(captured.out)["error"]["code"] == "invalid_input"


def test_bad_spec_is_refused_naming_the_field(capsys, tmp_path):
    f = tmp_path / "s.json"
    f.write_text('{"version": "v1", "gpus": [{"devices": [0], "mig": {"1g.24gb": 1}, "exclusive": true}]}')
    rc = main(["--simulate", "g7e.2xlarge", "apply", "--spec", str(f)])
    assert rc == 1
    assert "gpus[0]" in capsys.readouterr().err


def test_state_without_simulate_must_exist(capsys, tmp_path):
    rc = main(["--state", str(tmp_path / "none.json"), "inventory"])
    assert rc == 1
    assert "--simulate" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "why"),
    [("garbage", "not JSON"), ("{}", "not the GPUs"), ("[]", "not the GPUs"), (None, "Is a directory")],
)
def test_a_state_file_that_is_no_simulated_host_is_a_one_line_refusal(capsys, tmp_path, content, why):
    # it was "unexpected error (JSONDecodeError)", exit 3
    state = tmp_path / "state.json"
    if content is None:
        state.mkdir()
    else:
        state.write_text(content)
    rc = main(["--state", str(state), "report"])
    out, err = capsys.readouterr()
    assert rc == 1
    assert json.loads(out)["error"]["details"]["field"] == "state"
    assert err.startswith(f"error: --state {state} is not a simulated host's state file")
    assert why in err
    assert len(err.splitlines()) == 1


def test_inventory_json_is_one_document(capsys):
    rc = main(["--simulate", "g6e.12xlarge", "--instance-id", "i-1", "inventory"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert doc["instance_id"] == "i-1"
    assert doc["simulated"] is True
    assert [g["name"] for g in doc["gpus"]] == ["NVIDIA L40S"] * 4


def test_text_output_lists_slices(capsys):
    rc = main(["--simulate", "g7e.2xlarge", "--output", "text", "report"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "g0-whole" in out


@pytest.mark.parametrize("output", ["text", "json"])
def test_a_reader_that_left_early_is_no_traceback(capsys, monkeypatch, tmp_path, output):
    # `python -m host_agent --output text export | head -3`: the pipe closes under the agent
    import io
    import os

    class ClosedPipe(io.StringIO):
        def __init__(self, fd: int) -> None:
            super().__init__()
            self.fd = fd

        def write(self, _text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self) -> int:
            return self.fd

    fd = os.open(tmp_path / "stdout", os.O_WRONLY | os.O_CREAT)
    monkeypatch.setattr("sys.stdout", ClosedPipe(fd))
    try:
        rc = main(["--simulate", "g7e.2xlarge", "--output", output, "report"])
    finally:
        os.close(fd)
    assert rc == 0  # what was done stands
    assert "Traceback" not in capsys.readouterr().err


def test_simulate_process_only_runs_on_a_simulated_host():
    from contextlib import nullcontext

    from host_agent import verbs

    class Hardware:
        mutating_calls = 0

        def session(self):
            return nullcontext(self)

        def gpu_count(self):
            return 0

    report = verbs.do_simulate_process(verbs.Context(backend=Hardware(), instance_id="i-1"), "g0-whole")
    assert not report.ok
    assert "simulated host" in report.error.message


def test_unexpected_errors_hide_the_traceback_unless_debug(capsys, monkeypatch):
    import host_agent.cli as cli

    def boom(args):
        raise RuntimeError("kaput")

    monkeypatch.setattr(cli, "run", boom)
    assert main(["--simulate", "g6.xlarge", "inventory"]) == 3
    assert "--debug" in capsys.readouterr().err
    with pytest.raises(RuntimeError):
        main(["--debug", "--simulate", "g6.xlarge", "inventory"])


def test_read_only_refuses_changes_on_a_simulated_host_too(capsys, tmp_path):
    state = str(tmp_path / "h.json")
    spec = '{"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]}'
    rc = main(["--simulate", "g7e.2xlarge", "--state", state, "--read-only", "apply", "--spec", spec])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert doc["error"]["code"] == "read_only"
    assert doc["actions"] == []
    assert main(["--state", state, "assert", "--spec", spec]) == 1


def test_a_change_waits_for_any_run_and_a_read_waits_only_for_a_change(tmp_path, capsys):
    import fcntl

    from host_agent.cli import main

    lock_file = tmp_path / "host-agent.lock"
    spec = json.dumps({"version": "v1", "gpus": [{"devices": "all", "mps": {"clients": 2}}]})
    base = ["--simulate", "g6.xlarge", "--lock-file", str(lock_file), "--lock-timeout", "0"]
    # Given another run is changing this host (the lock held exclusively)
    with open(lock_file, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        applied = main([*base, "apply", "--spec", spec])
        applied_out = json.loads(capsys.readouterr().out)
        read = main([*base, "inventory"])
        read_out = json.loads(capsys.readouterr().out)
    # Then neither an apply nor a read runs: a read would see the layout half applied
    assert (applied, read) == (1, 1)
    assert applied_out["error"]["code"] == read_out["error"]["code"] == "host_busy"
    # Given another run only reads (the lock held shared)
    with open(lock_file, "w") as held:
        fcntl.flock(held, fcntl.LOCK_SH)
        assert main([*base, "inventory"]) == 0  # reads go together
        capsys.readouterr()
        assert main([*base, "apply", "--spec", spec]) == 1  # a change waits for the reader
        capsys.readouterr()
    # And once the lock is free the apply runs
    assert main([*base, "apply", "--spec", spec]) == 0


@pytest.mark.parametrize("verb", [["guard"], ["login", "--user", "calque-aaaaaaaaaaaa"]])
def test_guard_and_login_on_a_simulated_host_are_refused_before_they_touch_this_machine(
    verb, capsys, monkeypatch
):
    from host_agent import linux_host
    from host_agent.cli import main

    # Given a simulated host (where grant and apply record everything in the fake's state)
    touched = []
    monkeypatch.setattr(linux_host.LinuxHost, "__init__", lambda *a, **k: touched.append("this machine"))
    # When the boot guard or a login is run against it
    code = main(["--simulate", "g6.xlarge", *verb])
    # Then it is a usage error saying how to mean it, and this machine was never reached
    assert code == 2
    assert "--host-access linux" in capsys.readouterr().err
    assert touched == []


def test_guard_holds_the_host_lock_as_grant_and_reclaim_do(tmp_path, capsys, monkeypatch):
    import fcntl

    from host_agent import cli

    lock_file = tmp_path / "host-agent.lock"
    ran = []
    monkeypatch.setattr(cli, "_linux_host", lambda args: ran.append("guard") or object())
    monkeypatch.setattr("host_agent.guard.guard", lambda host, **kw: ran.append("ran") or 0)
    argv = ["--simulate", "g6.xlarge", "--host-access", "linux", "--lock-file", str(lock_file)]
    # Given a grant or reclaim running (the lock held exclusively)
    with open(lock_file, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        # Then the guard waits for it, and refuses as busy once its wait is over
        assert cli.main([*argv, "--lock-timeout", "0", "guard"]) == 1
        assert "host_busy" in capsys.readouterr().out
    assert ran == []
    # And once the lock is free it runs
    assert cli.main([*argv, "guard"]) == 0
    assert ran == ["guard", "ran"]

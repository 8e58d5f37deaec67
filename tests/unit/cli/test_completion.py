"""Shell completion: commands, flags, choices, catalog values, and live values from the API
(asked with a short timeout, failing silently); the scripts themselves, loaded by a real bash
and zsh and completing on TAB (live values from a running plane in real shells:
tests/integration/test_completion_local.py)."""

from __future__ import annotations

import json
import os

import pytest

from calque.cli.completion import API_TIMEOUT_S
from calque.cli.completion import candidates as _candidates
from calque.cli.errors import EndpointUnreachable
from calque.cli.main import build_parser
from tests.completion_shells import CompletingShell, calque_on_path, shell_missing
from tests.unit.cli_support import forget_endpoint_and_aws_keys, run_cli, running_plane

pytestmark = pytest.mark.unit

PARSER = build_parser()


def candidates(words: list[str], cword: int) -> list[str]:
    return _candidates(words, cword, PARSER)


def test_commands_verbs_and_flags():
    assert candidates(["calque", "se"], 1) == ["session"]
    assert {"checkout", "checkin", "list", "show", "extend"} <= set(candidates(["calque", "session", ""], 2))
    flags = candidates(["calque", "session", "checkout", "--"], 3)
    assert {"--backend", "--ttl", "--min-memory-gib", "--query", "--endpoint"} <= set(flags)
    assert "__complete" not in candidates(["calque", ""], 1)


def test_choices_and_catalog_values():
    assert candidates(["calque", "--output", ""], 2) == ["csv", "json", "table"]
    assert candidates(["calque", "session", "checkout", "--backend", "m"], 4) == ["mig", "mps"]
    assert "g7e.2xlarge" in candidates(["calque", "host", "acquire", "--instance-type", "g7e"], 4)
    assert "1g.24gb" in candidates(
        ["calque", "session", "checkout", "--backend", "mig", "--profile", "1g.2"], 6
    )
    assert "1g.24gb" in candidates(["calque", "host", "register", "--mig", ""], 4)
    assert candidates(["calque", "completion", ""], 2) == ["bash", "zsh"]
    # `calque catalog [TYPE]`: its verbs and the instance types, never the hidden verb
    catalog = candidates(["calque", "catalog", ""], 2)
    assert {"types", "cards", "profiles", "g7e.2xlarge"} <= set(catalog)
    assert "_type" not in catalog
    assert candidates(["calque", "catalog", "g7e.2x"], 2) == ["g7e.2xlarge"]


@pytest.fixture
def plane_api(tmp_path, monkeypatch):
    """A running plane's files (no server) and the API answers its client would get."""
    from calque.cli.client import ApiClient

    forget_endpoint_and_aws_keys(monkeypatch)
    asked: list[tuple[str, float, int]] = []
    answers = {
        "/v1/sessions": [{"session_id": "s-0123456789abcdef"}, {"session_id": "s-fedcba9876543210"}],
        "/v1/hosts": [{"instance_id": "i-0aaa0001"}],
        "/v1/pools": [{"name": "llm"}],
        "/v1/groups": [{"name": "lab-a"}, {"name": "course"}],
    }

    def request(self, method, path, body=None, query=None, **_kw):
        asked.append((path, self.timeout_s, self.retries))
        answer = answers[path]
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(ApiClient, "request", request)
    with running_plane(tmp_path / "plane", monkeypatch, endpoint="http://127.0.0.1:9999", region="us-east-1"):
        yield answers, asked


def test_live_values_come_from_the_api_with_a_short_timeout(plane_api):
    _answers, asked = plane_api
    assert candidates(["calque", "session", "show", "s-0"], 3) == ["s-0123456789abcdef"]
    assert candidates(["calque", "host", "drain", ""], 3) == ["i-0aaa0001"]
    assert candidates(["calque", "session", "checkout", "--instance-id", ""], 4) == ["i-0aaa0001"]
    assert candidates(["calque", "pool", "status", ""], 3) == ["llm"]
    assert candidates(["calque", "group", "show", "c"], 3) == ["course"]
    assert candidates(["calque", "--profile", "b"], 2) == ["bob"]  # the plane's people
    assert all(timeout == API_TIMEOUT_S and retries == 0 for _p, timeout, retries in asked)


def test_an_unreachable_api_completes_nothing_and_says_nothing(plane_api, capsys):
    answers, _ = plane_api
    answers["/v1/sessions"] = EndpointUnreachable("http://127.0.0.1:9999", "connection refused")
    code, out, err = run_cli(capsys, "__complete", "--cword", "3", "--", "calque", "session", "show", "")
    assert (code, out, err) == (0, "", "")


def test_the_completion_scripts_are_printed(capsys):
    code, out, _ = run_cli(capsys, "completion", "bash")
    assert code == 0
    assert "complete -o default -F _calque_complete calque" in out
    code, out, _ = run_cli(capsys, "completion", "zsh")
    assert out.startswith("#compdef calque")


def _shells(*names: str) -> list[object]:
    return [
        pytest.param(n, marks=pytest.mark.skipif(shell_missing(n) is not None, reason=str(shell_missing(n))))
        for n in names
    ]


@pytest.mark.parametrize("shell", _shells("bash", "zsh"))
def test_the_shell_completes_commands_flags_choices_and_catalog_values_on_tab(shell, tmp_path):
    """The shell itself, on a terminal, loads the script as documented and completes on TAB."""
    env = calque_on_path(tmp_path, dict(os.environ))
    with CompletingShell(shell, env) as sh:
        if shell == "zsh":
            assert sh.registered == "ready _calque"  # compinit's table names the script's function
        assert sh.complete("calque session ch").offered == ["checkin", "checkout"]
        assert sh.complete("calque session checkout --b").offered == ["--backend"]
        assert sh.complete("calque --output j").offered == ["json"]
        types = sh.complete("calque host acquire --instance-type g7e.").offered
        assert "g7e.2xlarge" in types
        assert all(t.startswith("g7e.") for t in types)
        assert sh.complete("calque nosuchcommand ").offered == []
        if shell == "zsh":  # the one candidate is put on the line
            assert sh.complete("calque session checkout --ba").line == "calque session checkout --backend "


@pytest.mark.parametrize("shell", _shells("zsh"))
def test_zsh_autoloads_the_script_saved_in_its_fpath(shell, tmp_path):
    load = (
        'mkdir -p "$HOME/functions" && calque completion zsh > "$HOME/functions/_calque" && '
        'fpath=("$HOME/functions" $fpath) && unfunction _calque 2>/dev/null; compinit -u -D'
    )
    env = calque_on_path(tmp_path, dict(os.environ))
    with CompletingShell(shell, env, load=load) as sh:
        assert sh.registered == "ready _calque"
        assert sh.complete("calque session ch").offered == ["checkin", "checkout"]
        assert sh.complete("calque session ch").offered == ["checkin", "checkout"]  # loaded once, kept


def test_output_json_answers_the_script_in_one_json_document(capsys):
    """--output json prints one JSON document on stdout, nothing else, for this command too."""
    code, out, _ = run_cli(capsys, "completion", "bash", "--output", "json")
    assert code == 0
    doc = json.loads(out)
    assert doc["shell"] == "bash"
    assert "complete -o default -F _calque_complete calque" in doc["script"]

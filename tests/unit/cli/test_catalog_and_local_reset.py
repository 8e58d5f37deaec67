"""`calque catalog` prints the GPU catalog without the control plane; `calque local reset`
removes a stopped plane's state directory only when confirmed, and only a state directory."""

from __future__ import annotations

import json

import pytest

from calque import catalog
from tests.unit.cli_support import run_cli, stopped_plane

pytestmark = pytest.mark.unit


def test_catalog_types_lists_every_type_with_its_rate(capsys):
    code, out, _ = run_cli(capsys, "catalog", "types", "--output", "json")
    assert code == 0
    rows = {r["instance_type"]: r for r in json.loads(out)}
    assert set(rows) == {t.name for t in catalog.instance_types()}
    g7e = catalog.instance_type("g7e.2xlarge")
    assert rows["g7e.2xlarge"]["on_demand_usd_per_hour"] == g7e.hourly_usd
    assert rows["g7e.2xlarge"]["card"] == g7e.card.name


def test_catalog_profiles_of_an_instance_type_give_memory_and_counts(capsys):
    code, out, _ = run_cli(
        capsys, "catalog", "profiles", "--instance-type", "g7e.2xlarge", "--output", "json"
    )
    assert code == 0
    profiles = {r["profile"]: r for r in json.loads(out)}
    assert profiles["1g.24gb"]["memory_gib"] == 24
    assert profiles["1g.24gb"]["max_per_gpu"] == 4
    code, out, _ = run_cli(capsys, "catalog", "profiles", "--instance-type", "g7e.2xlarge")
    assert "1g.24gb" in out
    assert "MAX/GPU" in out


def test_catalog_cards_give_mps_limits(capsys):
    code, out, _ = run_cli(capsys, "catalog", "cards", "--output", "json", "--query", "[?card=='T4'] | [0]")
    assert code == 0
    t4 = json.loads(out)
    assert t4["mig"] is False
    assert t4["max_mps_clients"] == 48


def test_catalog_alone_lists_every_type_as_the_contract_says(capsys):
    # CONTRACT.md: `calque catalog [TYPE]`; alone it printed its help and exited 2
    code, out, _ = run_cli(capsys, "catalog", "--output", "json")
    assert code == 0
    assert {r["instance_type"] for r in json.loads(out)} == {t.name for t in catalog.instance_types()}


def test_catalog_type_gives_that_type_in_full(capsys):
    # `calque catalog g7e.2xlarge` was an invalid choice (exit 2)
    code, out, _ = run_cli(capsys, "catalog", "g7e.2xlarge", "--output", "json")
    assert code == 0
    doc = json.loads(out)
    g7e = catalog.instance_type("g7e.2xlarge")
    assert doc["instance_type"] == "g7e.2xlarge"
    assert doc["card"] == g7e.card.name
    assert doc["gpus"] == g7e.gpu_count
    assert doc["on_demand_usd_per_hour"] == g7e.hourly_usd
    assert doc["max_mps_clients"] == g7e.card.max_mps_clients
    assert {p["profile"]: p["max_per_gpu"] for p in doc["mig_profiles"]}["1g.24gb"] == 4
    code, out, _ = run_cli(capsys, "catalog", "g6e.xlarge")
    assert code == 0
    assert "L40S" in out
    assert "PROFILE" not in out  # no MIG on an L40S: no profile table


def test_a_word_that_is_neither_a_verb_nor_a_type_is_a_usage_error(capsys):
    code, _, err = run_cli(capsys, "catalog", "tyeps")
    assert code == 2
    assert "did you mean 'types'?" in err
    code, _, err = run_cli(capsys, "catalog", "g7e.2xl")
    assert code == 2
    assert "g7e.2xlarge" in err
    assert len(err.strip().splitlines()) == 1


def test_the_hidden_verb_is_not_listed(capsys):
    _, out, err = run_cli(capsys, "catalog", "--help")
    assert "_type" not in out + err
    assert "SUPPRESS" not in out + err


def test_an_unknown_card_is_refused_naming_the_valid_ones(capsys):
    code, _, err = run_cli(capsys, "catalog", "types", "--card", "L40")
    assert code == 1
    assert "L40S" in err


@pytest.fixture
def stopped(tmp_path, monkeypatch):
    return stopped_plane(tmp_path / "state", monkeypatch)


def test_reset_without_confirmation_changes_nothing(stopped, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    code, _, err = run_cli(capsys, "local", "reset")
    assert code == 2
    assert "--yes" in err
    assert stopped.users_file.exists()

    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda _q: "n")
    code, _, err = run_cli(capsys, "local", "reset")
    assert code == 1
    assert stopped.users_file.exists()


def test_reset_confirmed_removes_the_state_directory(stopped, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda _q: "y")
    code, out, _ = run_cli(capsys, "local", "reset")
    assert code == 0
    assert not stopped.path.exists()
    assert "local up" in out


def test_reset_refuses_while_the_plane_runs(stopped, capsys):
    held = stopped.acquire_plane_lock()
    try:
        code, _, err = run_cli(capsys, "local", "reset", "--yes")
    finally:
        held.close()
    assert code == 1
    assert "local down" in err
    assert stopped.users_file.exists()


def test_reset_refuses_a_directory_that_is_not_a_state_directory(tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("keep me")
    code, _, err = run_cli(capsys, "local", "reset", "--yes", "--state-dir", str(tmp_path / "mine"))
    assert code == 1
    assert "does not look like" in err
    assert (tmp_path / "mine" / "thesis.tex").exists()

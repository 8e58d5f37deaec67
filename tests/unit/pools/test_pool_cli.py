"""`calque pool ...` and `calque claim ...` against a recording fake of the API: what is sent,
what is refused before anything is sent, and what people and scripts see."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.cli_support import FakeApi, cli_runner, install_fake_api


class PoolsApi(FakeApi):
    """The fake API, answering a GET of a pool it was given no answer for as the API does for
    a pool that does not exist (404), so pool create finds its name free."""

    def request(self, method, path, body=None, query=None):
        if method == "GET" and path.startswith("/v1/pools/") and (method, path) not in self.responses:
            from calque.cli.errors import ApiError

            self.requests.append((method, path, body, query))
            raise ApiError(
                404, {"error": {"code": "not_found", "message": f"no pool at {path}", "details": {}}}
            )
        return super().request(method, path, body, query)

    def sent(self) -> list:
        """What the CLI sent, without its reads."""
        return [r for r in self.requests if r[0] != "GET"]


pytestmark = pytest.mark.unit

CLAIM = {
    "claim_id": "c-0000000000000001", "pool": "textstats", "user": "alice", "state": "queued", "items": 2,
    "submitted_at": "2026-12-02T00:00:00Z", "attempts": 0,
}  # fmt: skip


@pytest.fixture
def api(monkeypatch, tmp_path):
    from calque.cli.context import Context

    fake = install_fake_api(monkeypatch, PoolsApi(), ["pool", "claim"])
    # the local plane's endpoint: pool create sends a local package directory
    monkeypatch.setattr(Context, "_resolve", lambda ctx: ("http://127.0.0.1:1", tmp_path, {"endpoint": "x"}))
    return fake


@pytest.fixture
def cli(api, capsys):
    return cli_runner(capsys)


def test_submit_sends_the_items_of_a_jsonl_file(api, cli, tmp_path):
    items = tmp_path / "items.jsonl"
    items.write_text('{"text": "a"}\n\n[1, 2]\n')
    api.responses[("POST", "/v1/pools/textstats/claims")] = CLAIM
    code, out, err = cli("--output", "json", "pool", "submit", "textstats", "--items", str(items))
    assert code == 0, err
    assert api.requests == [("POST", "/v1/pools/textstats/claims", {"items": [{"text": "a"}, [1, 2]]}, None)]
    assert json.loads(out)["claim_id"] == "c-0000000000000001"


def test_a_bad_items_line_is_refused_by_number_and_nothing_is_sent(api, cli, tmp_path):
    items = tmp_path / "items.jsonl"
    items.write_text('{"text": "a"}\n{nope\n')
    code, _, err = cli("pool", "submit", "textstats", "--items", str(items))
    assert code == 1
    assert "line 2" in err
    assert api.requests == []


def test_nan_infinity_and_an_overflowing_number_are_refused_by_line_however_large_the_file(
    api, cli, tmp_path
):
    """Python's json reads NaN, Infinity and 1e999 (as inf), but they are not JSON: a line
    holding one is refused by its number (exit 1), in a small file and in one that goes by
    upload, not as a flag's usage error nor an unexpected ValueError."""
    items = tmp_path / "items.jsonl"
    refused = [
        ("NaN", "NaN is not a JSON value"),
        ('{"x": -Infinity}', "-Infinity is not a JSON value"),
        ("[1e999]", "1e999 is too large for a number"),
    ]
    for line, why in refused:
        for size in (1, 30_000):
            # Given an items file whose last line holds it, small or past the upload size
            items.write_text('"x"\n' * size + line + "\n")
            api.requests.clear()
            # When a member submits it
            code, out, err = cli("pool", "submit", "textstats", "--items", str(items))
            # Then it is refused by its line, and nothing is sent
            assert (code, out) == (1, "")
            assert err == f"calque: error: {items} line {size + 1}: not JSON ({why})\n"
            assert api.requests == []
    # numbers JSON has, large and small, and the text "NaN", are items as before
    items.write_text('[1.5, -0.0, 1e300, "NaN"]\n')
    api.responses[("POST", "/v1/pools/textstats/claims")] = CLAIM
    assert cli("pool", "submit", "textstats", "--items", str(items))[0] == 0
    assert api.requests[-1][2] == {"items": [[1.5, -0.0, 1e300, "NaN"]]}


def test_an_items_file_with_a_byte_order_mark_is_read_and_one_not_utf8_refused_by_line(api, cli, tmp_path):
    items = tmp_path / "items.jsonl"
    items.write_bytes(b'\xef\xbb\xbf{"text": "a"}\r\n[1, 2]\r\n')
    api.responses[("POST", "/v1/pools/textstats/claims")] = CLAIM
    code, _, err = cli("pool", "submit", "textstats", "--items", str(items))
    assert code == 0, err
    assert api.requests[-1][2] == {"items": [{"text": "a"}, [1, 2]]}
    # bytes that are not text, in a small file and past the size that goes by upload
    for size in (1, 30_000):
        items.write_bytes(b'"x"\n' * size + b"\xff\n")
        api.requests.clear()
        code, _, err = cli("pool", "submit", "textstats", "--items", str(items))
        assert code == 1
        assert err == f"calque: error: {items} line {size + 1}: not UTF-8 text (invalid start byte)\n"
        assert api.requests == []


def test_submit_wait_shows_progress_on_stderr_and_refuses_a_failed_claim(api, cli, tmp_path, monkeypatch):
    monkeypatch.setattr("time.sleep", lambda s: None)
    items = tmp_path / "items.jsonl"
    items.write_text("1\n")
    api.responses[("POST", "/v1/pools/textstats/claims")] = CLAIM
    states = iter(
        [{**CLAIM, "state": "running", "worker": "w-1"}, {**CLAIM, "state": "failed", "reason": "boom"}]
    )
    api.responses[("GET", "/v1/claims/c-0000000000000001")] = lambda body: next(states)
    code, out, err = cli("--output", "json", "pool", "submit", "textstats", "--items", str(items), "--wait")
    assert code == 1
    assert "c-0000000000000001: running, attempt 0 on w-1" in err
    assert "claim c-0000000000000001 failed: boom" in err
    doc = json.loads(out)  # exactly one document: the error, carrying the claim
    assert doc["error"]["code"] == "claim_failed"
    assert doc["error"]["details"]["claim"]["state"] == "failed"


def test_create_needs_the_spend_flag_and_a_package_directory_before_sending(api, cli, tmp_path):
    base = ["pool", "create", "pool1", "--model", "m", "--instance-type", "g6e.xlarge", "--runner", "a:B"]
    code, _, err = cli(*base, "--package", str(tmp_path))
    assert code == 1
    assert "--i-understand-this-spends-money" in err
    code, _, err = cli(*base, "--package", str(tmp_path / "missing"), "--i-understand-this-spends-money")
    assert code == 1
    assert "not a directory" in err
    assert api.requests == []
    (tmp_path / "a.py").write_text("class B: ...\n")  # the runner's module, in the package
    api.responses[("POST", "/v1/pools")] = {"name": "pool1"}
    key = "pools/pool1/package/" + "a" * 64 + ".zip"
    api.responses[("POST", "/v1/pools/pool1/package")] = {"key": key, "url": "http://unused", "exists": True}
    code, _, err = cli(
        *base, "--package", str(tmp_path), "--idle-timeout", "90s", "--i-understand-this-spends-money"
    )
    assert code == 0, err
    staged = api.sent()[0][2]
    assert len(staged["sha256"]) == 64
    sent = api.sent()[1][2]
    assert sent["package_key"] == key  # staged in the artifact bucket, on any plane
    assert "package_path" not in sent
    assert sent["idle_timeout_s"] == 90
    assert sent["i_understand_this_spends_money"] is True


@pytest.mark.parametrize(
    ("verb", "flag", "value", "said"),
    [
        ("create", "--idle-timeout", "5s", "--idle-timeout: must be between 10s and 7d (got 5s)"),
        ("update", "--idle-timeout", "8d", "--idle-timeout: must be between 10s and 7d (got 8d)"),
        ("create", "--max-wait", "5s", "--max-wait: must be between 10s and 1d (got 5s)"),
        ("update", "--max-wait", "2d", "--max-wait: must be between 10s and 1d (got 2d)"),
    ],
)
def test_a_duration_out_of_the_apis_bounds_is_a_usage_error_in_the_flags_units(
    api, cli, tmp_path, verb, flag, value, said
):
    # it said "invalid idle_timeout_s: Input should be greater than or equal to 10" (exit 1)
    create = ["--model", "m", "--instance-type", "g6e.xlarge", "--runner", "a:B", "--package", str(tmp_path)]
    code, _, err = cli("pool", verb, "pool1", *(create if verb == "create" else []), flag, value)
    assert code == 2
    assert said in err
    assert api.requests == []


def test_the_flags_bounds_are_the_apis():
    from calque.cli.commands.pool import IDLE_TIMEOUT_S, MAX_WAIT_S
    from calque.contracts.pools import MAX_WAIT_CEILING_S, PoolCreate

    def bounds(field: str) -> tuple[int, int]:
        meta = PoolCreate.model_fields[field].metadata
        return next(m.ge for m in meta if hasattr(m, "ge")), next(m.le for m in meta if hasattr(m, "le"))

    assert bounds("idle_timeout_s") == IDLE_TIMEOUT_S
    assert MAX_WAIT_S == (10, MAX_WAIT_CEILING_S)


def test_delete_needs_the_terminate_flag(api, cli):
    code, _, err = cli("pool", "delete", "p1")
    assert code == 1
    assert "--i-understand-this-terminates-instances" in err
    assert api.requests == []
    api.responses[("DELETE", "/v1/pools/p1")] = {"pool": "p1", "state": "deleted", "cancelled": 2}
    code, _, err = cli("pool", "delete", "p1", "--i-understand-this-terminates-instances", "--now")
    assert (code, err) == (0, "")
    assert api.requests[-1][2] == {"i_understand_this_terminates_instances": True, "now": True}


def test_a_pool_delete_that_waits_for_its_claims_says_so_and_how_not_to_wait(api, cli):
    """Without --now a pool with waiting claims is only marked deleting, and stays so while they
    wait (for ever, when the budget has no room for a worker): before, the answer said
    'state deleting, backlog 1' and nothing of why nothing happened or what ends it."""
    api.responses[("DELETE", "/v1/pools/p1")] = {"pool": "p1", "state": "deleting", "backlog": 1}
    consent = "--i-understand-this-terminates-instances"
    code, out, err = cli("--output", "json", "pool", "delete", "p1", consent)
    assert code == 0
    assert json.loads(out) == {"pool": "p1", "state": "deleting", "backlog": 1}
    assert err == (
        "note: pool p1 takes no more claims and is deleted once its 1 waiting claim(s) and its busy "
        "workers are done (`calque pool status p1`); `calque pool delete p1 --now "
        "--i-understand-this-terminates-instances` cancels them and deletes it at once\n"
    )


def test_claim_result_prints_each_item_and_writes_the_document(api, cli, tmp_path):
    api.responses[("GET", "/v1/claims/c-0000000000000001/result")] = {
        "claim_id": "c-0000000000000001",
        "summary": {"items_ok": 1, "items_failed": 1},
        "results": [
            {"ok": True, "output": {"n": 1}},
            {"ok": False, "error": {"type": "ValueError", "message": "x"}},
        ],
    }
    code, out, _ = cli("claim", "result", "c-0000000000000001")
    assert code == 0
    assert json.loads(out)["results"][1]["error"]["type"] == "ValueError"
    target = tmp_path / "r.json"
    code, _, _ = cli("claim", "result", "c-0000000000000001", "-o", str(target))
    assert code == 0
    # the same document on stdout and in the file, byte for byte, whatever the output asked
    assert target.read_text() == out
    assert json.loads(target.read_text())["summary"]["items_failed"] == 1
    code, as_json, _ = cli("--output", "json", "claim", "result", "c-0000000000000001")
    assert as_json == out


def test_claim_result_to_a_file_says_the_files_own_size_and_sha256(api, cli, tmp_path):
    """`claim result ID -o FILE` of a result answered inline writes the API's answer; the
    size and SHA-256 it prints are the file's (what `sha256sum FILE` says), not those of the
    stored result document the answer's download names."""
    import hashlib

    api.responses[("GET", "/v1/claims/c-0000000000000001/result")] = {
        "claim_id": "c-0000000000000001",
        "summary": {"items_ok": 1, "items_failed": 0},
        "results": [{"ok": True, "output": {"n": 1}}],
        "download": {"url": "http://127.0.0.1:1/r", "bytes": 40, "sha256": "ab" * 32},
    }
    target = tmp_path / "r.json"
    code, out, _ = cli("--output", "json", "claim", "result", "c-0000000000000001", "-o", str(target))
    assert code == 0
    said = json.loads(out)
    data = target.read_bytes()
    assert said["bytes"] == len(data)
    assert said["sha256"] == hashlib.sha256(data).hexdigest()


def test_claim_list_passes_the_pool_filter(api, cli):
    api.responses[("GET", "/v1/claims")] = [CLAIM]
    code, out, _ = cli("claim", "list", "--pool", "textstats")
    assert code == 0
    assert api.requests == [("GET", "/v1/claims", None, {"pool": "textstats"})]
    assert "c-0000000000000001" in out


def test_an_admins_claim_list_says_whose_each_claim_is(api, cli):
    api.responses[("GET", "/v1/claims")] = [CLAIM, {**CLAIM, "claim_id": "c-2", "user": "bob"}]
    code, out, _ = cli("claim", "list", "--pool", "textstats")
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split()[:3] == ["CLAIM_ID", "USER", "POOL"]
    assert [r.split()[:2] for r in rows] == [["c-0000000000000001", "alice"], ["c-2", "bob"]]


def test_pool_list_shows_the_workers_now_beside_min_and_max(api, cli):
    api.responses[("GET", "/v1/pools")] = [
        {
            "name": "textstats", "model": "m", "instance_type": "g6e.xlarge", "state": "active",
            "min_workers": 1, "max_workers": 4, "target_backlog_per_worker": 1, "idle_timeout_s": 60,
            "current_workers": {"starting": 1, "idle": 2, "busy": 3}, "version": 1,
            "rollout": {"version": 2, "state": "rolling"},
        }
    ]  # fmt: skip
    code, out, _ = cli("pool", "list")
    assert code == 0
    header, row = out.splitlines()
    cells = dict(zip(header.split(), row.split(), strict=False))  # up to VERSION ("1 -> 2")
    assert (cells["WORKERS"], cells["STARTING"], cells["IDLE"], cells["BUSY"]) == ("1..4", "1", "2", "3")
    assert "1 -> 2" in row  # a roll-out under way: from version 1 to 2


def test_pool_update_with_a_package_uploads_it_and_sends_a_runner_update(api, cli, tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "textstats.py").write_text("class TextStats: ...\n")
    api.responses[("GET", "/v1/pools/textstats")] = {"name": "textstats", "runner": "textstats:TextStats"}
    key = f"pools/textstats/package/{'a' * 64}.zip"
    # staged already: the API answers the key, nothing is uploaded again
    api.responses[("POST", "/v1/pools/textstats/package")] = {"key": key, "url": "https://x", "exists": True}
    api.responses[("PATCH", "/v1/pools/textstats")] = {"name": "textstats", "rollout": {"state": "rolling"}}
    code, _, err = cli("pool", "update", "textstats", "--package", str(pkg))
    assert code == 0, err
    ((_, _, _, _), patch) = api.sent()
    assert patch == ("PATCH", "/v1/pools/textstats", {"package_key": key}, None)
    # a runner the new package does not hold is refused before anything is uploaded or sent
    code, _, err = cli("pool", "update", "textstats", "--package", str(pkg), "--runner", "other:Runner")
    assert code == 1
    assert "has no module other" in err
    assert len(api.sent()) == 2
    # a pool being deleted takes no runner update: nothing is staged for one (before, the
    # package was uploaded under the pool's prefix and then the update refused)
    api.responses[("GET", "/v1/pools/textstats")] = {
        "name": "textstats", "runner": "textstats:TextStats", "state": "deleting",
    }  # fmt: skip
    code, out, err = cli("pool", "update", "textstats", "--package", str(pkg))
    assert (code, out) == (1, "")
    said = "pool 'textstats' is being deleted: its runner is no longer changed (nothing uploaded)"
    assert err == f"calque: error: {said}\n"
    assert len(api.sent()) == 2


def test_pool_status_shows_each_workers_version_and_a_stopped_roll_out_with_why():
    from calque.cli.commands.pool import render_status

    text = render_status(
        {
            "name": "textstats", "model": "m", "instance_type": "g6e.xlarge", "state": "active",
            "min_workers": 1, "max_workers": 2, "version": 1, "runner": "textstats:TextStats",
            "rollout": {"version": 2, "runner": "broken:Runner", "state": "stopped",
                        "reason": "worker w-2 of version 2 could not start (ImportError)"},
            "status": {"workers": [
                {"worker_id": "w-1", "instance_id": "i-1", "state": "idle", "version": 1},
                {"worker_id": "w-3", "instance_id": "i-3", "state": "busy", "version": 2, "draining": True},
            ]},
        }
    )  # fmt: skip
    assert "version: 1 (textstats:TextStats)" in text
    assert "rollout: version 2 (broken:Runner) stopped: worker w-2 of version 2 could not start" in text
    assert "busy (draining)" in text


def test_pool_status_shows_workers_backlog_warm_hits_and_the_reasons_of_decisions(api, cli):
    api.responses[("GET", "/v1/pools/textstats")] = {
        "name": "textstats", "model": "m", "instance_type": "g6e.xlarge", "state": "active",
        "min_workers": 0, "max_workers": 2,
        "status": {
            "backlog": {"visible": 3, "in_flight": 1}, "oldest_claim_age_s": 42,
            "claims": {"queued": 3, "running": 1, "succeeded": 5}, "warm_hits": 4, "completed": 5,
            "workers": [{"worker_id": "w-1", "instance_id": "i-1", "state": "busy", "claim_id": "c-9"}],
            "decisions": [{"at": "2027-01-15T08:00:00Z", "action": "scale_out", "desired": 2, "current": 1,
                           "reason": "backlog 4 wants 2 workers"}],
            "last_decision": {"action": "hold", "reason": "cooldown"},
        },
    }  # fmt: skip
    code, out, err = cli("pool", "status", "textstats")
    assert code == 0, err
    assert "3 visible, 1 in flight" in out
    assert "42s" in out
    assert "4 of 5 completed" in out
    assert "w-1" in out
    assert "backlog 4 wants 2 workers" in out
    assert "2027-01-15T08:00:00Z" in out  # the decision's time, as the API answers it
    assert "Latest check: hold: cooldown" in out


def test_create_uploads_the_package_zip_to_the_url_the_api_answers(api, cli, tmp_path, monkeypatch):
    import hashlib
    import io
    import urllib.request
    import zipfile

    from calque.cli.commands.pool_runner import zip_package

    got: list[urllib.request.Request] = []

    class Answer(io.BytesIO):
        def __enter__(self) -> Answer:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    monkeypatch.setattr(urllib.request, "urlopen", lambda req, timeout=0: got.append(req) or Answer(b""))
    pkg = tmp_path / "pkg"
    (pkg / "__pycache__").mkdir(parents=True)
    (pkg / "runner.py").write_text("class R: pass\n")
    (pkg / "__pycache__" / "runner.cpython-311.pyc").write_bytes(b"cache")
    url = "https://art.s3.amazonaws.com/pools/pool1/package/x.zip?X-Amz-Signature=s"
    api.responses[("POST", "/v1/pools/pool1/package")] = {
        "key": "pools/pool1/package/x.zip", "url": url,
        "headers": {"Content-Type": "application/zip"}, "exists": False,
    }  # fmt: skip
    api.responses[("POST", "/v1/pools")] = {"name": "pool1"}
    code, _, err = cli(
        "pool", "create", "pool1", "--model", "m", "--instance-type", "g6e.xlarge", "--runner", "runner:R",
        "--package", str(pkg), "--i-understand-this-spends-money",
    )  # fmt: skip
    assert code == 0, err
    (put,) = got
    assert (put.get_method(), put.full_url) == ("PUT", url)
    assert put.get_header("Content-type") == "application/zip"
    body = put.data
    assert isinstance(body, bytes)
    assert zipfile.ZipFile(io.BytesIO(body)).namelist() == ["runner.py"]  # no caches
    assert api.sent()[0][2] == {"sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}
    assert api.sent()[1][2]["package_key"] == "pools/pool1/package/x.zip"
    assert zip_package(pkg) == body  # the same files, the same bytes: the hash names the content


FOUR_MIG = {"version": "v1", "gpus": [{"devices": "all", "mig": {"1g.24gb": 4}}]}


def test_update_notes_the_idle_slices_of_the_last_instance_when_max_workers_is_not_a_multiple(api, cli):
    # Given a pool of four MIG slices per instance
    pool = {"name": "p1", "instance_type": "g7e.2xlarge", "layout": FOUR_MIG, "min_workers": 0}
    # When an admin sets --max-workers 3, Then one line on stderr says one slice stays idle
    api.responses[("PATCH", "/v1/pools/p1")] = {**pool, "max_workers": 3}
    code, out, err = cli("--output", "json", "pool", "update", "p1", "--max-workers", "3")
    assert code == 0, err
    assert json.loads(out)["max_workers"] == 3  # stdout stays one JSON document
    assert err.strip() == (
        "note: p1 runs at most 3 workers on 4 slices per instance: at 3 workers 1 slice(s) of its "
        "last instance stay idle, paid for; --max-workers 4 would use them"
    )
    # When it is a multiple of the slices, Then there is no note
    api.responses[("PATCH", "/v1/pools/p1")] = {**pool, "max_workers": 8}
    code, _, err = cli("pool", "update", "p1", "--max-workers", "8")
    assert code == 0
    assert err == ""


@pytest.mark.parametrize(
    ("instance_type", "layout", "max_workers", "idle"),
    [
        ("g7e.2xlarge", FOUR_MIG, 5, 3),
        ("g6e.12xlarge", None, 6, 2),  # no layout: one worker per GPU, four L40S
        ("g6e.xlarge", None, 3, 0),  # one GPU: never a note
    ],
)
def test_the_note_counts_slices_per_instance_from_the_layout_else_the_gpus(
    instance_type, layout, max_workers, idle
):
    from calque.cli.commands.pool import idle_slices_note

    note = idle_slices_note(
        {"name": "p1", "instance_type": instance_type, "layout": layout, "max_workers": max_workers}
    )
    if idle:
        assert note is not None
        assert f"{idle} slice(s) of its last instance stay idle" in note
    else:
        assert note is None


def test_a_wait_that_times_out_says_the_claim_goes_on_and_how_to_follow_or_stop_it(api, cli, tmp_path):
    # Given a claim that stays queued longer than the member waits for it
    items = tmp_path / "items.jsonl"
    items.write_text("1\n")
    api.responses[("POST", "/v1/pools/textstats/claims")] = CLAIM
    api.responses[("GET", "/v1/claims/c-0000000000000001")] = CLAIM
    # When the wait times out
    code, out, err = cli(
        "--output", "json", "pool", "submit", "textstats", "--items", str(items), "--wait", "--timeout", "1s"
    )  # fmt: skip
    # Then it is a refusal (exit 1) that says the claim was not stopped and what to run next
    assert code == 1
    last = err.splitlines()[-1]
    assert "still queued after 1s" in last
    assert "calque claim show c-0000000000000001" in last
    assert "calque claim cancel c-0000000000000001" in last
    assert json.loads(out)["error"]["code"] == "wait_timeout"


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--instance-type", "m5.large"], "m5.large"),
        (["--instance-type", "g6e.xlarge", "--min-workers", "3", "--max-workers", "2"], "must not exceed"),
        (["--instance-type", "g6e.xlarge", "--mig", "1g.24gb=4"], "does not support MIG"),
        (["--instance-type", "g6e.xlarge", "--runner", "textstats.TextStats"], "MODULE:CLASS"),
    ],
)
def test_a_pool_the_api_would_refuse_is_refused_before_its_package_is_uploaded(
    api, cli, tmp_path, flags, says
):
    # Given an admin's pool create with something the API refuses
    argv = ["pool", "create", "textstats", "--model", "m", "--runner", "textstats:TextStats"]
    # When they run it
    code, out, err = cli(
        "--output", "json", *argv, *flags, "--package", str(tmp_path), "--i-understand-this-spends-money"
    )
    # Then it is refused naming the problem, and nothing was sent: no package in the bucket
    assert code == 1
    assert says in err.splitlines()[-1]
    assert "error" in json.loads(out)
    assert api.requests == []


def _uploads(api, monkeypatch, claims) -> list[bytes]:
    """An API whose claims route answers ``claims(body)`` and whose input route hands out an
    upload; what the CLI uploads there is returned (as the list fills)."""
    from calque.sdk import transfer

    api.responses[("POST", "/v1/pools/textstats/claims")] = claims
    api.responses[("POST", "/v1/pools/textstats/claims/input")] = {
        "claim_id": "c-0123456789abcdef", "url": "https://bucket/k?sig", "headers": {},
    }  # fmt: skip
    put: list[bytes] = []
    monkeypatch.setattr(transfer, "put_file", lambda target, path: put.append(Path(path).read_bytes()))
    return put


def test_items_too_large_for_one_request_are_uploaded_and_submitted_by_their_upload(
    api, cli, tmp_path, monkeypatch
):
    import hashlib

    from calque.cli.errors import ApiError

    # Given an items file whose request is over the API's body limit
    items = tmp_path / "items.jsonl"
    items.write_text('{"text": "hello world"}\n' * 100)

    def claims(body):
        if "items" in body:
            raise ApiError(413, {"error": {"code": "body_too_large", "message": "over 1024 bytes"}})
        return CLAIM

    put = _uploads(api, monkeypatch, claims)
    # When a member submits it
    code, out, err = cli("--output", "json", "pool", "submit", "textstats", "--items", str(items))
    # Then the input document went to the URL the API gave, and the claim names that upload
    assert code == 0, err
    assert json.loads(put[0]) == {"items": [{"text": "hello world"}] * 100}
    sha = hashlib.sha256(put[0]).hexdigest()
    asked = api.requests[-2][2]
    assert asked == {"sha256": sha, "bytes": len(put[0])}
    assert api.requests[-1][2] == {
        "input": {"claim_id": "c-0123456789abcdef", "sha256": sha, "bytes": len(put[0]), "items": 100}
    }
    assert json.loads(out)["claim_id"] == "c-0000000000000001"


def test_more_items_than_one_request_may_carry_are_uploaded_however_small(api, cli, tmp_path, monkeypatch):
    """10,001 one-byte items are a small file and a small body, but more than a request may
    carry (MAX_ITEMS): they go by upload, as the docs say, not refused by the API."""
    from calque.cli.errors import ApiError
    from calque.contracts.pools import MAX_ITEMS

    items = tmp_path / "items.jsonl"
    items.write_text("0\n" * (MAX_ITEMS + 1))

    def claims(body):
        if "items" in body:
            raise ApiError(422, {"error": {"code": "validation_failed", "message": "at most 10000 items"}})
        return CLAIM

    put = _uploads(api, monkeypatch, claims)
    code, _, err = cli("--output", "json", "pool", "submit", "textstats", "--items", str(items))
    assert code == 0, err
    assert len(json.loads(put[0])["items"]) == MAX_ITEMS + 1
    assert api.requests[-1][2]["input"]["items"] == MAX_ITEMS + 1


def test_pool_status_says_why_a_worker_exited(api, cli):
    # Given a pool whose worker exited because its runner could not be imported
    why = "the runner's enter() failed: RunnerError: cannot import runner module 'textstats'"
    api.responses[("GET", "/v1/pools/textstats")] = {
        "name": "textstats", "model": "m", "instance_type": "g6e.xlarge", "state": "active",
        "min_workers": 0, "max_workers": 2,
        "status": {
            "backlog": {"visible": 1, "in_flight": 0}, "claims": {"queued": 1},
            "warm_hits": 0, "completed": 0,
            "workers": [
                {"worker_id": "w-1", "instance_id": "i-1", "state": "exited", "reason": why},
                {"worker_id": "w-2", "instance_id": "i-2", "state": "idle", "reason": "started by command x"},
            ],
            "decisions": [],
        },
    }  # fmt: skip
    # When an admin reads the pool's status as a table
    code, out, err = cli("pool", "status", "textstats")
    # Then the exited worker's reason is there, not only in the JSON (a live worker's is not news)
    assert code == 0, err
    assert f"w-1 exited: {why}" in out
    assert "started by command x" not in out
    # And only the live worker is counted as one
    assert "workers        1 (min 0, max 2)" in out


def _failing_pool(api, failures: int, why: str, **status: Any) -> None:
    """The API's answer for pool textstats after ``failures`` failed worker starts in a row."""
    api.responses[("GET", "/v1/pools/textstats")] = {
        "name": "textstats", "model": "m", "instance_type": "g6e.xlarge", "state": "active",
        "min_workers": 0, "max_workers": 2, "start_failures": failures, "start_failure": why,
        "status": {
            "backlog": {"visible": 1, "in_flight": 0}, "claims": {"queued": 1}, "workers": [],
            "decisions": [], **status,
        },
    }  # fmt: skip


def test_pool_status_says_a_failing_pool_starts_no_workers_and_what_to_do(api, cli):
    why = "the runner's enter() failed: RunnerError: cannot import runner module 'textstats'"
    _failing_pool(api, 3, why)
    code, out, err = cli("pool", "status", "textstats")
    assert code == 0, err
    assert f"failing: 3 worker starts in a row failed before serving (the last: {why})" in out
    assert "no more are started and submits are refused" in out
    assert "`calque pool update textstats ...` starts it again" in out


def test_pool_status_says_the_scaler_still_tries_below_the_limit(api, cli):
    why = "the host agent's worker start ended Failed: worker: cannot download the runner package"
    _failing_pool(api, 1, why, start_failure_limit=3)
    code, out, err = cli("pool", "status", "textstats")
    assert code == 0, err
    assert f"failing: 1 worker start in a row failed before serving (the last: {why})" in out
    assert "the scaler tries again, and stops after 3 in a row" in out
    assert "submits are refused" not in out


@pytest.mark.parametrize(("failures", "limit"), [(3, 3), (1, 3)])
def test_pool_status_of_a_failing_pool_being_deleted_does_not_advise_an_update(api, cli, failures, limit):
    # Given a failing pool an admin is deleting (an update of it is refused: pool_deleting)
    why = "the runner's enter() failed: RuntimeError: no model"
    _failing_pool(api, failures, why, start_failure_limit=limit)
    api.responses[("GET", "/v1/pools/textstats")]["state"] = "deleting"
    # When the admin reads its status
    code, out, err = cli("pool", "status", "textstats")
    # Then the failing line says what the delete does with the claims left, not to update it
    assert code == 0, err
    assert "failing: " in out
    assert "pool update" not in out
    assert "the scaler tries again" not in out
    assert "cancels them if none is left to run them" in out
    assert "`calque pool delete textstats --now --i-understand-this-terminates-instances`" in out


@pytest.mark.parametrize(
    ("files", "runner", "ok"),
    [
        (["other.py"], "textstats:TextStats", False),
        (["textstats.py"], "textstats:TextStats", True),
        (["models/__init__.py", "models/text.py"], "models.text:Runner", True),
        (["models/text.py"], "models.texts:Runner", False),
        (["models/__init__.py"], "models:Runner", True),
    ],
)
def test_create_refuses_a_package_without_the_runners_module_before_sending(
    api, cli, tmp_path, files, runner, ok
):
    # Given a package directory that holds some modules
    pkg = tmp_path / "pkg"
    for f in files:
        (pkg / f).parent.mkdir(parents=True, exist_ok=True)
        (pkg / f).write_text("x = 1\n")
    api.responses[("POST", "/v1/pools/textstats/package")] = {"key": "k", "url": "u", "exists": True}
    api.responses[("POST", "/v1/pools")] = {"name": "textstats"}
    # When an admin creates a pool with a runner
    code, _, err = cli(
        "pool", "create", "textstats", "--model", "m", "--instance-type", "g6e.xlarge", "--runner", runner,
        "--package", str(pkg), "--i-understand-this-spends-money",
    )  # fmt: skip
    # Then a runner whose module is not in the package is refused, naming it, and nothing is sent
    if ok:
        assert code == 0, err
    else:
        assert code == 1
        assert f"has no module {runner.split(':')[0]}" in err
        assert api.requests == []


def test_create_of_a_name_already_taken_is_refused_before_the_package_is_uploaded(api, cli, tmp_path):
    # Given a pool named textstats exists
    (tmp_path / "textstats.py").write_text("class TextStats: ...\n")
    api.responses[("GET", "/v1/pools/textstats")] = {"name": "textstats", "state": "active"}
    # When an admin creates another pool of that name
    code, _, err = cli(
        "pool", "create", "textstats", "--model", "m", "--instance-type", "g6e.xlarge",
        "--runner", "textstats:TextStats", "--package", str(tmp_path), "--i-understand-this-spends-money",
    )  # fmt: skip
    # Then it is refused naming the pool and what to do, and nothing was uploaded or created
    assert code == 1
    assert "a pool named 'textstats' exists" in err
    assert "calque pool update textstats" in err
    assert api.sent() == []


def test_claim_list_sends_an_empty_pool_filter_as_given_rather_than_listing_every_claim(api, cli):
    api.responses[("GET", "/v1/claims")] = []
    code, _, err = cli("--output", "json", "claim", "list", "--pool", "")
    assert code == 0, err
    assert api.requests == [("GET", "/v1/claims", None, {"pool": ""})]


@pytest.mark.parametrize("verb", ["show", "result", "logs", "cancel"])
def test_a_claim_id_that_is_not_one_is_a_usage_error_sent_nowhere(api, cli, verb):
    # `claim show c-zzz` was sent and refused by the API (exit 1), where `session show s-nope`
    # is a usage error (exit 2) naming what an id looks like
    code, _, err = cli("claim", verb, "c-zzz")
    assert code == 2
    assert "'c-zzz' is not a claim id: c- and 16 hex digits, as `calque claim list` shows them" in err
    assert api.requests == []

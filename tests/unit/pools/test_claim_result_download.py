"""A result too large for the API's answer, downloaded by its own URL: nothing of it is shown
or kept until its SHA-256 is checked (`claim result` to stdout or `-o FILE`, the SDK's
`Claim.download`), and `--query` selects from the same document an inline answer is. An
in-memory bucket stands behind urllib (the real download:
tests/integration/pools/test_sdk_large_local.py)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import urllib.request
from typing import Any

import pytest

from calque.cli.errors import CliError
from calque.sdk import transfer
from tests.unit.cli_support import FakeApi, cli_runner, install_fake_api

pytestmark = pytest.mark.unit

CID = "c-0000000000000001"

DOC = json.dumps({"results": [{"ok": True, "output": "x" * 1000}, {"ok": True, "output": 2}]}).encode()
SHA = hashlib.sha256(DOC).hexdigest()


class Bucket:
    """What the presigned GET answers: ``body`` (set it to another document to corrupt it)."""

    def __init__(self) -> None:
        self.body = DOC

    def urlopen(self, url: str, timeout: float) -> Any:
        return io.BytesIO(self.body)


@pytest.fixture
def bucket(monkeypatch) -> Bucket:
    b = Bucket()
    monkeypatch.setattr(urllib.request, "urlopen", b.urlopen)
    return b


@pytest.fixture
def api(monkeypatch, bucket):
    fake = install_fake_api(monkeypatch, FakeApi(), ["claim"])
    fake.responses[("GET", "/v1/claims/c-0000000000000001/result")] = {
        "claim_id": "c-0000000000000001",
        "summary": {"items_ok": 2, "items_failed": 0},
        "results": None,  # too large to answer inline
        "download": {"url": "https://bucket.example/r?sig", "bytes": len(DOC), "sha256": SHA},
    }
    return fake


@pytest.fixture
def cli(api, capsys):
    return cli_runner(capsys)


def test_a_large_result_is_printed_whole_and_query_selects_as_from_an_inline_answer(cli):
    code, out, _ = cli("claim", "result", "c-0000000000000001")
    assert code == 0
    assert out.encode() == DOC + b"\n"
    # --query reads the document an inline answer is: the claim, its summary, its results
    code, out, err = cli(
        "--output", "json", "claim", "result", "c-0000000000000001", "--query", "summary.items_ok"
    )
    assert (code, json.loads(out)) == (0, 2), err
    code, out, _ = cli("claim", "result", "c-0000000000000001", "--query", "results[1].output")
    assert (code, out.strip()) == (0, "2")


def test_a_corrupt_large_result_prints_nothing_but_the_refusal(cli, bucket):
    # Given a stored result whose bytes are not the ones its worker wrote
    bucket.body = DOC.replace(b'"x', b'"y', 1)
    for output in ("table", "json"):
        # When a member asks for it on stdout
        code, out, err = cli("--output", output, "claim", "result", "c-0000000000000001")
        # Then none of it is printed: stdout is empty, or the one error document
        assert code == 1
        assert "result_checksum_mismatch" in out if output == "json" else out == ""
        if output == "json":
            assert set(json.loads(out)) == {"error"}
        assert "not the " + SHA in err


def test_a_corrupt_large_result_leaves_the_file_as_it_was(cli, bucket, tmp_path):
    target = tmp_path / "result.json"
    target.write_text("an earlier result\n")
    bucket.body = DOC[:-5] + b"xx]}}"
    code, out, err = cli("claim", "result", "c-0000000000000001", "-o", str(target))
    assert code == 1
    assert "result_checksum_mismatch" not in out
    assert "not the " + SHA in err
    # the file holds what it held, and no partial download is left beside it
    assert target.read_text() == "an earlier result\n"
    assert sorted(os.listdir(tmp_path)) == ["result.json"]
    # a good one replaces it whole, at the mode a new file gets
    bucket.body = DOC
    code, out, _ = cli("--output", "json", "claim", "result", "c-0000000000000001", "-o", str(target))
    assert code == 0
    assert target.read_bytes() == DOC
    assert json.loads(out)["sha256"] == SHA
    assert sorted(os.listdir(tmp_path)) == ["result.json"]


def test_the_sdks_download_keeps_no_corrupt_file(bucket, tmp_path):
    target = tmp_path / "r.json"
    bucket.body = b"{}"
    with pytest.raises(CliError) as err:
        transfer.download_to({"url": "u", "sha256": SHA}, target)
    assert err.value.code == "result_checksum_mismatch"
    assert os.listdir(tmp_path) == []
    bucket.body = DOC
    assert transfer.download_to({"url": "u", "sha256": SHA}, target) == len(DOC)
    assert target.read_bytes() == DOC
    # a link to a file: the file gets the result, the link stays a link
    link = tmp_path / "link.json"
    link.symlink_to(target)
    bucket.body = DOC + b" "
    transfer.download_to({"url": "u"}, link)
    assert link.is_symlink()
    assert target.read_bytes() == DOC + b" "

"""The presigned PUT both uploads share (a claim's input, a pool's runner package): what the
bucket receives, and the one-line error, with each caller's own code and words, when the
bucket refuses the upload or cannot be reached. An in-memory bucket stands behind urllib
(the real PUTs: tests/integration/pools/test_sdk_large_local.py and the pools' tests)."""

from __future__ import annotations

import io
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from calque.cli.commands import pool_runner
from calque.cli.errors import CliError
from calque.sdk import transfer

pytestmark = pytest.mark.unit


class Bucket:
    """What a presigned URL's server does with a PUT: keeps what was sent and answers
    ``status``; ``reachable=False``: the connection is refused."""

    def __init__(self) -> None:
        self.status = 200
        self.reachable = True
        self.received: list[tuple[str, dict[str, str], bytes]] = []

    def urlopen(self, req: urllib.request.Request, timeout: float) -> Any:
        if not self.reachable:
            raise urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
        data = req.data
        body = data if isinstance(data, bytes) else b"".join(iter(lambda: data.read(65536), b""))  # type: ignore[union-attr]
        headers = {k.lower(): v for k, v in req.header_items()}
        assert int(headers["content-length"]) == len(body)  # what was said is what was sent
        self.received.append((req.full_url, headers, body))
        if self.status != 200:
            raise urllib.error.HTTPError(
                req.full_url, self.status, "Forbidden", None,  # type: ignore[arg-type]
                io.BytesIO(b"<Error><Code>AccessDenied</Code></Error>"),
            )  # fmt: skip
        return io.BytesIO(b"")


@pytest.fixture
def bucket(monkeypatch) -> Bucket:
    b = Bucket()
    monkeypatch.setattr(urllib.request, "urlopen", b.urlopen)
    return b


def test_a_claims_input_file_is_put_whole_with_the_urls_headers(bucket, tmp_path):
    doc = tmp_path / "input.json"
    doc.write_bytes(b'{"items": [' + b", ".join(b'"x"' for _ in range(100_000)) + b"]}")
    url = "https://bucket.example/claims/c-1/input.json?sig=1"
    target = {"url": url, "headers": {"x-amz-meta-sha256": "abc"}}
    transfer.put_file(target, str(doc))
    ((sent_to, headers, body),) = bucket.received
    assert sent_to == url
    assert body == doc.read_bytes()
    assert headers["x-amz-meta-sha256"] == "abc"


def test_a_refused_or_unreachable_input_upload_says_so_with_its_own_code(bucket, tmp_path):
    doc = tmp_path / "input.json"
    doc.write_text('{"items": [1]}')
    target = {"url": "https://bucket.example/in", "key": "claims/c-1/input.json"}
    bucket.status = 403
    with pytest.raises(CliError) as refused:
        transfer.put_file(target, str(doc))
    assert refused.value.code == "input_upload_failed"
    assert str(refused.value).startswith("uploading the claim's input was refused (403): <Error>")
    assert refused.value.details == {"key": "claims/c-1/input.json"}
    bucket.reachable = False
    with pytest.raises(CliError) as failed:
        transfer.put_file(target, str(doc))
    assert failed.value.code == "input_upload_failed"
    assert str(failed.value).startswith("cannot upload the claim's input: ")
    assert failed.value.details == {"key": "claims/c-1/input.json"}


class _Client:
    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer

    def request(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        assert (method, path) == ("POST", "/v1/pools/textstats/package")
        return self.answer


class _Ctx:
    def __init__(self, answer: dict[str, Any]) -> None:
        self._client = _Client(answer)

    def client(self) -> _Client:
        return self._client


def _package(tmp_path: Path) -> Path:
    pkg = tmp_path / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "textstats.py").write_text("class TextStats: ...\n")
    return pkg


def test_a_runner_package_is_put_by_the_same_upload(bucket, tmp_path):
    key = "pools/textstats/package/x.zip"
    url = "https://bucket.example/" + key
    ctx = _Ctx({"key": key, "url": url, "headers": {"x-amz-checksum-sha256": "c"}})
    assert pool_runner.upload_package(ctx, "textstats", _package(tmp_path)) == key
    ((sent_to, headers, body),) = bucket.received
    assert sent_to == url
    assert body == pool_runner.zip_package(_package(tmp_path / "again"))
    assert headers["x-amz-checksum-sha256"] == "c"


def test_a_refused_or_unreachable_package_upload_says_so_with_its_own_code(bucket, tmp_path):
    bucket.status = 403
    key = "pools/textstats/package/x.zip"
    refusing = _Ctx({"key": key, "url": "https://bucket.example/p"})
    with pytest.raises(CliError) as refused:
        pool_runner.upload_package(refusing, "textstats", _package(tmp_path))
    assert refused.value.code == "package_upload_failed"
    assert str(refused.value).startswith("uploading the runner package was refused (403): <Error>")
    assert refused.value.details == {"key": key}
    bucket.reachable = False
    unreachable = _Ctx({"key": key, "url": "https://bucket.example/p"})
    with pytest.raises(CliError) as failed:
        pool_runner.upload_package(unreachable, "textstats", _package(tmp_path / "b"))
    assert failed.value.code == "package_upload_failed"
    assert str(failed.value).startswith("cannot upload the runner package: ")
    assert failed.value.details == {"key": key}

"""A pool worker's own credentials: fetched from the control plane's credentials route (signed
with the instance role, as reports are), renewed before they expire, and the only ones its SQS
and S3 clients sign with, where its document says the control plane vends them."""

from __future__ import annotations

import io
import json
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import botocore.session
import pytest

from host_agent import pool_workers as pw
from host_agent.cli import main
from host_agent.worker import credentials as wc
from host_agent.worker.__main__ import build_parser
from host_agent.worker.control import ControlPlaneError, HttpControlPlane

pytestmark = pytest.mark.unit


def _in(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeControlPlane:
    """Answers the credentials route from a list of (key id, expires in seconds); remembers asks."""

    def __init__(self, *answers: tuple[str, float]) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, str, dict[str, Any]]] = []

    def credentials(self, pool: str, worker_id: str, body: dict[str, Any]) -> dict[str, Any]:
        self.asked.append((pool, worker_id, body))
        if not self.answers:
            raise ControlPlaneError("the control plane refused (503)")
        key, expires_in = self.answers.pop(0)
        return {
            "access_key_id": key,
            "secret_access_key": f"secret-of-{key}",
            "session_token": f"token-of-{key}",
            "expiration": _in(expires_in),
        }


def test_credentials_are_fetched_for_the_worker_and_kept_while_fresh():
    plane = FakeControlPlane(("ASIAPOOLONE", 3600))
    creds = wc.pool_credentials(plane, "textstats", "w-1a-0", "i-0abc")
    for _ in range(3):
        frozen = creds.get_frozen_credentials()
        assert (frozen.access_key, frozen.secret_key, frozen.token) == (
            "ASIAPOOLONE",
            "secret-of-ASIAPOOLONE",
            "token-of-ASIAPOOLONE",
        )
    # asked once, in the worker's own name, naming its instance
    assert plane.asked == [("textstats", "w-1a-0", {"instance_id": "i-0abc"})]


def test_credentials_close_to_expiry_are_renewed_before_they_expire():
    # Given credentials that expire in 10 minutes (inside the renewal window, still valid)
    plane = FakeControlPlane(("ASIAPOOLONE", 600), ("ASIAPOOLTWO", 3600))
    creds = wc.pool_credentials(plane, "textstats", "w-1a-0", "i-0abc")
    # When a call signs with them
    frozen = creds.get_frozen_credentials()
    # Then new ones were fetched first, and are what it signs with
    assert frozen.access_key == "ASIAPOOLTWO"
    assert len(plane.asked) == 2
    assert creds.get_frozen_credentials().access_key == "ASIAPOOLTWO"
    assert len(plane.asked) == 2  # and kept while fresh


def test_a_failed_renewal_keeps_valid_credentials_but_not_ones_about_to_expire():
    # 10 minutes left: a failed renewal is logged, the current ones still sign
    plane = FakeControlPlane(("ASIAPOOLONE", 600))
    creds = wc.pool_credentials(plane, "textstats", "w-1a-0", "i-0abc")
    assert creds.get_frozen_credentials().access_key == "ASIAPOOLONE"
    # 2 minutes left: a call must have new ones, and says why it cannot
    plane = FakeControlPlane(("ASIAPOOLONE", 120))
    creds = wc.pool_credentials(plane, "textstats", "w-1a-0", "i-0abc")
    with pytest.raises(ControlPlaneError):
        creds.get_frozen_credentials()


class _Sent(Exception):
    pass


def test_the_workers_clients_sign_with_the_pools_credentials_not_the_instance_role(monkeypatch):
    # Given an instance role in the default chain
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ASIAINSTANCEROLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "instance-secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "instance-token")
    creds = wc.pool_credentials(FakeControlPlane(("ASIAPOOLONE", 3600)), "p", "w-1-0", "i-0abc")
    session = wc.use_credentials(botocore.session.get_session(), creds)
    headers: dict[str, str] = {}

    def capture(request: Any, **_: Any) -> None:
        headers.update({k: v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()})
        raise _Sent

    for service, call in (
        ("sqs", lambda c: c.receive_message(QueueUrl="https://sqs.eu-west-1.amazonaws.com/1/calque-pool-p")),
        ("s3", lambda c: c.get_object(Bucket="art", Key="pools/p/claims/c1/manifest.json")),
    ):
        client = session.create_client(service, region_name="eu-west-1")
        client.meta.events.register("before-send", capture)
        headers.clear()
        # When the worker calls SQS or S3
        with pytest.raises(_Sent):
            call(client)
        # Then the request is signed with the pool's credentials
        assert "Credential=ASIAPOOLONE/" in headers["Authorization"]
        assert headers["X-Amz-Security-Token"] == "token-of-ASIAPOOLONE"


class Answer(io.BytesIO):
    status = 200

    def __enter__(self) -> Answer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def test_the_credentials_route_is_asked_signed_with_the_instance_role(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ASIAINSTANCEROLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "instance-secret")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    sent: list[urllib.request.Request] = []

    def urlopen(request: urllib.request.Request, timeout: float) -> Answer:
        sent.append(request)
        return Answer(
            json.dumps(
                {
                    "access_key_id": "ASIAPOOLONE",
                    "secret_access_key": "s",
                    "session_token": "t",
                    "expiration": _in(3600),
                }
            ).encode()
        )

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    creds = wc.pool_credentials(HttpControlPlane("https://api.example/prod/"), "p", "w-1-0", "i-0abc")
    assert creds.get_frozen_credentials().access_key == "ASIAPOOLONE"
    (request,) = sent
    assert request.full_url == "https://api.example/prod/v1/pools/p/workers/w-1-0/credentials"
    assert json.loads(request.data) == {"instance_id": "i-0abc"}
    assert "Credential=ASIAINSTANCEROLE/" in request.get_header("Authorization")


def test_the_worker_module_takes_where_its_credentials_come_from():
    base = ["--pool", "p", "--worker-id", "w", "--instance-id", "i", "--queue-url", "q"]
    base += ["--runner", "m:C", "--report-to", "u"]
    assert build_parser().parse_args(base).credentials == "instance"
    assert build_parser().parse_args([*base, "--credentials", "control-plane"]).credentials == "control-plane"


# ---- the worker document and the verb that starts workers ----------------------------------------


def _doc(**over: Any) -> dict[str, Any]:
    doc = {
        "pool": "small-models",
        "queue_url": "http://sqs/q",
        "runner": "my_runner:Runner",
        "package": {"bucket": "art", "key": "pools/small-models/package/abc.zip"},
        "worker_ids": ["w-0001-0"],
    }
    doc.update(over)
    return doc


def test_the_document_says_whether_the_control_plane_vends_credentials():
    assert pw.WorkerDoc.parse(json.dumps(_doc())).credentials is None
    assert pw.WorkerDoc.parse(json.dumps(_doc(credentials="control_plane"))).credentials == "control_plane"
    with pytest.raises(pw.InvalidInput):
        pw.WorkerDoc.parse(json.dumps(_doc(credentials="instance-role")))


def test_the_scalers_document_asks_for_vended_credentials_where_the_deployment_has_the_role():
    from calque.pools.aws import worker_document

    class P:
        name, queue_url, runner, visibility_s, idle_timeout_s = "small-models", "q", "m:C", 60, 600
        package_key, package_path = "pools/small-models/package/a.zip", None
        max_wait_s = None

        def worker_idle_exit_s(self) -> int:
            return self.idle_timeout_s

    assert "credentials" not in worker_document(P(), ["w-1-0"], bucket="art")
    vended = worker_document(P(), ["w-1-0"], bucket="art", vended_credentials=True)
    assert pw.WorkerDoc.parse(json.dumps(vended)).credentials == "control_plane"


class RecordingLauncher(pw.Launcher):
    def __init__(self) -> None:
        super().__init__(use_systemd=False)
        self.started: list[dict[str, Any]] = []

    def start(self, unit: str, argv: list[str], env: dict[str, str], log: Path, cwd: Path, jail: Any = None):
        self.started.append({"argv": argv})
        return {"pid": 1}


@pytest.mark.parametrize("vended", [False, True], ids=["host-credentials", "vended"])
def test_workers_and_the_package_download_use_vended_credentials_when_the_document_says(
    tmp_path, monkeypatch, capsys, vended
):
    launcher = RecordingLauncher()
    monkeypatch.setattr(pw, "Launcher", lambda use_systemd=None: launcher)
    staged: dict[str, Any] = {}

    def stage(doc: Any, pool_dir: Path, s3: Any = None, credentials: Any = None) -> str:
        staged["credentials"] = credentials
        (pool_dir / "pkg").mkdir(parents=True, exist_ok=True)
        return str(pool_dir / "pkg")

    monkeypatch.setattr(pw, "stage_package", stage)
    asked: list[tuple[Any, ...]] = []
    monkeypatch.setattr(wc, "pool_credentials", lambda control, *who: asked.append((control.endpoint, *who)))
    doc = _doc(credentials="control_plane") if vended else _doc()
    args = ["--simulate", "g6e.xlarge", "--state", str(tmp_path / "host.json"), "--instance-id", "i-0abc"]
    args += ["--report-to", "http://api", "worker", "start", "--worker", json.dumps(doc)]
    assert main(args) == 0, capsys.readouterr()
    argv = launcher.started[0]["argv"]
    if not vended:
        assert "--credentials" not in argv
        assert staged["credentials"] is None
        return
    # each worker fetches its own credentials
    assert argv[argv.index("--credentials") + 1] == "control-plane"
    # and the package comes with the pool's credentials, asked in the first worker's name
    staged["credentials"]()
    assert asked == [("http://api", "small-models", "w-0001-0", "i-0abc")]

"""moto in-process, behind a WSGI layer that makes DynamoDB honest under contention.

moto applies a conditional write as read-check-write without a lock, so two
concurrent conditional puts can both win; a transaction can interleave with
another write. Every DynamoDB operation therefore runs one at a time here, which
makes conditions and transactions atomic (and reads never see half a
transaction). The same layer observes SSM SendCommand (moto records it and runs
nothing) and hands each accepted command to the plane's SSM executor.
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Callable, Iterable
from typing import Any

SendCommandListener = Callable[[dict[str, Any], dict[str, Any]], None]


class LocalAwsApp:
    """WSGI middleware over moto's dispatcher."""

    def __init__(self, app: Any, on_send_command: SendCommandListener | None = None):
        self.app = app
        self.on_send_command = on_send_command
        self.dynamodb_lock = threading.Lock()
        # The fleet's stand-ins (calque/local/fleet.py): (environ, call) -> (status, headers, body) | None
        self.interceptor: Callable[[dict[str, Any], Callable[[dict[str, Any]], Any]], Any] | None = None

    def _buffered(self, environ: dict[str, Any], start_response: Any) -> tuple[list[bytes], list[Any]]:
        captured: list[Any] = []

        def _start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            captured[:] = [status, headers, exc_info]
            return lambda _data: None

        result = self.app(environ, _start)
        try:
            body = b"".join(result)
        finally:
            close = getattr(result, "close", None)
            if close:
                close()
        return [body], captured

    def _call(self, environ: dict[str, Any]) -> tuple[str, list[Any], bytes]:
        """moto's answer as (status, headers, body)."""
        body, (status, headers, _exc) = self._buffered(environ, None)
        return status, headers, body[0]

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        if target.startswith("DynamoDB_"):
            with self.dynamodb_lock:
                body, (status, headers, exc_info) = self._buffered(environ, start_response)
            start_response(status, headers, exc_info)
            return body
        if self.interceptor is not None:
            answered = self.interceptor(environ, self._call)
            if answered is not None:
                status, headers, body = answered
                start_response(status, headers)
                return [body]
        if target == "AmazonSSM.SendCommand" and self.on_send_command is not None:
            length = int(environ.get("CONTENT_LENGTH") or 0)
            raw = environ["wsgi.input"].read(length) if length else b""
            environ["wsgi.input"] = io.BytesIO(raw)
            body, (status, headers, exc_info) = self._buffered(environ, start_response)
            if status.startswith("200"):
                try:
                    self.on_send_command(json.loads(raw or b"{}"), json.loads(body[0] or b"{}"))
                except Exception:  # the executor's trouble must not fail the caller's SendCommand
                    import logging

                    logging.getLogger("calque.local").exception("SSM executor could not take a command")
            start_response(status, headers, exc_info)
            return body
        return self.app(environ, start_response)  # type: ignore[no-any-return, unused-ignore]


class MotoServer:
    """moto's server app on a free port (or ``port``), in a daemon thread."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, on_send_command: SendCommandListener | None = None
    ):
        self.host = host
        self.port = port
        self.on_send_command = on_send_command
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.app: LocalAwsApp | None = None

    def start(self) -> str:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        class _QuietHandler(MotoRequestHandler):  # type: ignore[misc, valid-type, unused-ignore]
            def log_request(self, *args: Any, **kwargs: Any) -> None:
                pass  # one line per AWS call would drown the plane's own output

        self.app = LocalAwsApp(DomainDispatcherApplication(create_backend_app), self.on_send_command)
        self._server = make_server(
            self.host, self.port, self.app, threaded=True, request_handler=_QuietHandler
        )
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="moto", daemon=True)
        self._thread.start()
        return self.endpoint

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def reset(self) -> None:
        """Forget every resource. moto's backends are per process: two servers in one
        process (tests) share them."""
        from moto.moto_api._internal import moto_api_backend

        moto_api_backend.reset()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)


class MotoClients:
    """boto3 clients pointed at the plane's moto server (moto accepts any keys)."""

    def __init__(self, endpoint: str, region: str):
        import boto3
        from botocore.config import Config

        self.endpoint = endpoint
        self.region = region
        self._session = boto3.session.Session(
            aws_access_key_id="testing",
            aws_secret_access_key="testing",  # noqa: S106 - moto accepts any key
            region_name=region,
        )
        self._config = Config(max_pool_connections=64, retries={"mode": "standard", "max_attempts": 3})
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    def client(self, service: str) -> Any:
        with self._lock:
            if service not in self._clients:
                self._clients[service] = self._session.client(  # type: ignore[call-overload, unused-ignore]
                    service, endpoint_url=self.endpoint, config=self._config
                )
            return self._clients[service]


class CommandRecords:
    """Keeps moto's record of an SSM command true to what the executor did.

    moto marks every command ``Success`` on every EC2 instance it knows of; the plane
    narrows a command to the instances it really targeted and writes each one's real
    status, exit code and output, so ``GetCommandInvocation`` tells what happened."""

    OUTPUT_LIMIT = 24000  # SSM keeps this much of each stream in the API answer

    def __init__(self, account: str, region: str):
        self.account = account
        self.region = region

    def _command(self, command_id: str) -> Any:
        from moto.ssm.models import ssm_backends

        return ssm_backends[self.account][self.region].get_command_by_id(command_id)

    def targeted(self, command_id: str, instance_ids: list[str]) -> None:
        command = self._command(command_id)
        by_id = {i["InstanceId"]: i for i in command.invocations}
        command.instance_ids = list(instance_ids)
        command.invocations = [
            {
                **by_id.get(i, command.invocation_response(i, "aws:runShellScript")),
                "Status": "Pending",
                "StatusDetails": "Pending",
                "ResponseCode": -1,
            }
            for i in instance_ids
        ]
        command.target_count = len(instance_ids)
        command.completed_count = 0
        command.status = command.status_details = "Pending" if instance_ids else "Success"

    def finished(
        self, command_id: str, instance_id: str, *, status: str, rc: int | None, stdout: str, stderr: str
    ) -> None:
        command = self._command(command_id)
        command.invocations = [
            {
                **i,
                "Status": status,
                "StatusDetails": status,
                "ResponseCode": -1 if rc is None else rc,
                "StandardOutputContent": stdout[: self.OUTPUT_LIMIT],
                "StandardErrorContent": stderr[: self.OUTPUT_LIMIT],
            }
            if i["InstanceId"] == instance_id
            else i
            for i in command.invocations
        ]
        done = [i for i in command.invocations if i["Status"] not in ("Pending", "InProgress")]
        command.completed_count = len(done)
        command.error_count = sum(1 for i in done if i["Status"] != "Success")
        if len(done) == len(command.invocations):
            command.status = command.status_details = "Failed" if command.error_count else "Success"
        else:
            command.status = command.status_details = "InProgress"

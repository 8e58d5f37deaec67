"""moto in-process, behind a WSGI layer that makes DynamoDB honest under contention,
lets only the plane's own processes in, and keeps what moto holds across restarts.

moto applies a conditional write as read-check-write without a lock, so two
concurrent conditional puts can both win; a transaction can interleave with
another write. Every DynamoDB operation therefore runs one at a time here, which
makes conditions and transactions atomic (and reads never see half a
transaction), and lets a transaction undo only the items it touched
(calque/local/moto_dynamodb.py) where moto would copy whole tables; moto keeps
no model it made once nothing uses it (calque/local/moto_models.py). The same
layer observes SSM SendCommand (moto records it and runs nothing) and hands each
accepted command to the plane's SSM executor.

moto accepts any keys. The plane's server binds to the loopback interface and,
given the plane's key pair, verifies every request's SigV4 signature against it
(as the AWS services would): a request signed with any other key, or unsigned, is
refused with 403 before moto sees it. Given a Persistence, every call that changed
something is recorded before its caller is answered (calque/local/persistence.py).
"""

from __future__ import annotations

import io
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs, quote

SendCommandListener = Callable[[dict[str, Any], dict[str, Any]], None]

log = logging.getLogger("calque.local")

PLANE_PROFILE = "calque-local-plane"
# the AWS services the plane's moto stands in for (the signing names of their scopes)
SERVICES = ("dynamodb", "sqs", "s3", "ec2", "ssm", "sts", "events")
_SCOPE = re.compile(r"Credential=[^/,\s]+/\d{8}/([^/]+)/([^/]+)/aws4_request")
_READ_ONLY = ("Describe", "Get", "List", "Receive", "Query", "Scan", "BatchGet", "TransactGet")


def _headers(environ: dict[str, Any]) -> list[tuple[str, str]]:
    out = [(k[5:].replace("_", "-").lower(), str(v)) for k, v in environ.items() if k.startswith("HTTP_")]
    for key, name in (("CONTENT_TYPE", "content-type"), ("CONTENT_LENGTH", "content-length")):
        if environ.get(key):
            out.append((name, str(environ[key])))
    return out


def _service(environ: dict[str, Any]) -> str:
    """The service a request is signed for: its Authorization header's scope, or a presigned
    URL's X-Amz-Credential (an upload through a URL the API answered has no header, and is a
    change to keep like any other)."""
    scope = _SCOPE.search(environ.get("HTTP_AUTHORIZATION", ""))
    if scope:
        return scope.group(2)
    credential = parse_qs(environ.get("QUERY_STRING", "")).get("X-Amz-Credential", [""])[0]
    parts = credential.split("/")
    return parts[3] if len(parts) == 5 and parts[4] == "aws4_request" else ""


def _raw_path(environ: dict[str, Any]) -> str:
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    if raw:
        return str(raw)
    path = quote(environ.get("PATH_INFO", "/"), safe="/~!$&'()*+,;=:@%")
    query = environ.get("QUERY_STRING")
    return path + (f"?{query}" if query else "")


def _refusal(
    environ: dict[str, Any], status: str, code: str, message: str
) -> tuple[str, list[tuple[str, str]], bytes]:
    """An AWS-shaped error botocore parses for the protocol the request spoke."""
    ctype = environ.get("CONTENT_TYPE", "")
    if "json" in ctype:
        body = json.dumps({"__type": code, "message": message}).encode()
        return status, [("Content-Type", ctype.split(";")[0]), ("x-amzn-ErrorType", code)], body
    xml = (
        f"<ErrorResponse><Error><Type>Sender</Type><Code>{code}</Code><Message>{message}</Message></Error>"
        f"<Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors>"
        "<RequestId>calque-local</RequestId></ErrorResponse>"
    )
    return status, [("Content-Type", "text/xml")], xml.encode()


def _late(environ: dict[str, Any], operation: str) -> bool:
    """A DynamoDB write sent with a deadline (calque.aws.DEADLINE_HEADER) that has passed."""
    from calque.local.persistence import DYNAMODB_WRITES

    raw = environ.get("HTTP_X_CALQUE_DEADLINE")
    if not raw or operation not in DYNAMODB_WRITES:
        return False
    try:
        return time.time() >= float(raw)
    except ValueError:
        return False


class LocalAwsApp:
    """WSGI middleware over moto's dispatcher."""

    def __init__(
        self,
        app: Any,
        on_send_command: SendCommandListener | None = None,
        *,
        credentials: tuple[str, str] | None = None,
        region: str = "us-east-1",
        persistence: Any = None,
        hosts: Callable[[str], Any] | None = None,
    ):
        self.app = app
        self.on_send_command = on_send_command
        self.dynamodb_lock = threading.Lock()
        self.credentials = credentials
        # The simulated hosts' instance-role keys (access key -> Principal): let in for what the
        # host role may use in a deployment (its pool's queue and objects), nothing else; what
        # that is, the plane says once its resources exist (calque/local/host_scope.py).
        self.hosts = hosts
        self.host_scope: Any = None
        self.region = region
        self.persistence = persistence
        self.refused = 0
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

    def internal_call(
        self,
        service: str,
        *,
        target: str | None = None,
        body: bytes = b"",
        method: str = "POST",
        path: str = "/",
        content_type: str = "application/x-amz-json-1.0",
    ) -> tuple[int, bytes]:
        """One call straight to moto (restores and snapshots): past the checks, no listeners."""
        from werkzeug.test import EnvironBuilder

        headers = {
            "Authorization": (
                f"AWS4-HMAC-SHA256 Credential=internal/20200101/{self.region}/{service}/aws4_request, "
                "SignedHeaders=host, Signature=0"
            ),
            "Content-Type": content_type,
        }
        if target:
            headers["X-Amz-Target"] = target
        environ = EnvironBuilder(
            path=path, method=method, data=body, headers=list(headers.items()), base_url="http://127.0.0.1"
        ).get_environ()
        out, (status, _headers, _exc) = self._buffered(environ, None)
        return int(status.split()[0]), out[0]

    def _refuse(
        self, environ: dict[str, Any], start_response: Any, code: str, message: str
    ) -> Iterable[bytes]:
        self.refused += 1
        status, headers, body = _refusal(environ, "403 Forbidden", code, message)
        start_response(status, [*headers, ("Content-Length", str(len(body)))])
        return [body]

    def _read_body(self, environ: dict[str, Any]) -> bytes:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        stream = environ["wsgi.input"]
        raw = (
            stream.read(length)
            if length
            else (stream.read() if environ.get("wsgi.input_terminated") else b"")
        )
        environ["wsgi.input"] = io.BytesIO(raw)
        environ["CONTENT_LENGTH"] = str(len(raw))
        return bytes(raw)

    def _check(self, environ: dict[str, Any], body: bytes) -> tuple[str, str] | None:
        """(code, message) when the request is not signed with the plane's key pair."""
        if self.credentials is None:
            return None
        from calque.local.sigv4 import (
            SignatureRejected,
            SignedRequest,
            is_presigned,
            verify,
            verify_presigned,
        )
        from calque.local.state import Principal

        key, secret = self.credentials
        plane = Principal(
            profile=PLANE_PROFILE, kind="plane", arn="", access_key=key, secret_key=secret, unique_id=""
        )
        hosts = self.hosts

        def lookup(k: str) -> Any:
            if k == key:
                return plane
            host = hosts(k) if hosts is not None else None
            return host if host is not None and host.kind == "instance" else None

        if is_presigned(_raw_path(environ)):  # a presigned S3 URL the plane handed out (pool packages)
            try:
                verify_presigned(
                    SignedRequest(
                        environ.get("REQUEST_METHOD", "GET"), _raw_path(environ), _headers(environ), body
                    ),
                    lambda k: plane if k == key else None,
                    self.region,
                )
            except SignatureRejected as exc:
                return (
                    "SignatureDoesNotMatch",
                    f"the plane's moto endpoint refused the request: {exc.message}",
                )
            return None
        try:
            who = verify(
                SignedRequest(
                    environ.get("REQUEST_METHOD", "GET"), _raw_path(environ), _headers(environ), body
                ),
                lookup,
                self.region,
                services=SERVICES,
            )
            if who is not plane:
                scope = _SCOPE.search(environ.get("HTTP_AUTHORIZATION", ""))
                service = scope.group(2) if scope else ""
                action = self._action(environ, environ.get("HTTP_X_AMZ_TARGET", ""), body)
                why = (
                    self.host_scope.refusal(who.pool, environ, service, action, body)
                    if self.host_scope is not None
                    else "the plane's moto endpoint lets no host in before its resources exist"
                )
                if why is not None:
                    return "AccessDenied", why
        except SignatureRejected as exc:
            code = {
                "unrecognized_access_key": "UnrecognizedClientException",
                "missing_authentication": "MissingAuthenticationToken",
                "signature_expired": "SignatureDoesNotMatch",
            }.get(exc.code, "SignatureDoesNotMatch")
            return code, f"the plane's moto endpoint refused the request: {exc.message}"
        return None

    @staticmethod
    def _action(environ: dict[str, Any], target: str, body: bytes) -> str:
        if target:
            return target.rpartition(".")[2]
        query = parse_qs(environ.get("QUERY_STRING", ""))
        if "Action" in query:
            return query["Action"][0]
        if "x-www-form-urlencoded" in environ.get("CONTENT_TYPE", ""):
            form = parse_qs(body.decode("utf-8", "replace"))
            if "Action" in form:
                return form["Action"][0]
        return ""

    def _call(self, environ: dict[str, Any]) -> tuple[str, list[Any], bytes]:
        """moto's answer as (status, headers, body)."""
        body, (status, headers, _exc) = self._buffered(environ, None)
        return status, headers, body[0]

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        body = self._read_body(environ)
        refused = self._check(environ, body)
        if refused is not None:
            return self._refuse(environ, start_response, *refused)
        service = _service(environ)
        if target.startswith("DynamoDB_"):
            operation = target.rpartition(".")[2]
            with self.dynamodb_lock:
                if _late(environ, operation):
                    # a request's first write that waited its turn past the request's deadline:
                    # its caller has gone, so it is not applied (calque.aws.request_deadline)
                    status, headers, late = _refusal(
                        environ,
                        "503 Service Unavailable",
                        "ServiceUnavailable",
                        "the request's deadline passed",
                    )
                    start_response(status, [*headers, ("Content-Length", str(len(late)))])
                    return [late]
                out, (status, headers, exc_info) = self._buffered(environ, start_response)
                if self.persistence is not None and status.startswith("200"):
                    from calque.local.persistence import DYNAMODB_WRITES

                    if operation in DYNAMODB_WRITES:
                        self.persistence.dynamodb_written(operation, body)
            start_response(status, headers, exc_info)
            return out
        if self.interceptor is not None:
            answered = self.interceptor(environ, self._call)
            if answered is not None:
                status, headers, answer = answered
                if (
                    self.persistence is not None
                    and service in ("sqs", "ec2", "ssm", "s3")
                    and status[:1] == "2"
                    and self._changed(environ, service, self._action(environ, target, body), answer)
                ):
                    getattr(self.persistence, f"{service}_changed")()
                start_response(status, headers)
                return [answer]
        if target == "AmazonSSM.SendCommand" and self.on_send_command is not None:
            out, (status, headers, exc_info) = self._buffered(environ, start_response)
            if status.startswith("200"):
                try:
                    self.on_send_command(json.loads(body or b"{}"), json.loads(out[0] or b"{}"))
                except Exception:  # the executor's trouble must not fail the caller's SendCommand
                    log.exception("SSM executor could not take a command")
                if self.persistence is not None:
                    self.persistence.ssm_changed()
            start_response(status, headers, exc_info)
            return out
        if self.persistence is None or service not in ("sqs", "ec2", "ssm", "s3"):
            return self.app(environ, start_response)  # type: ignore[no-any-return, unused-ignore]
        out, (status, headers, exc_info) = self._buffered(environ, start_response)
        if status[:1] == "2" and self._changed(environ, service, self._action(environ, target, body), out[0]):
            getattr(self.persistence, f"{service}_changed")()
        start_response(status, headers, exc_info)
        return out

    @staticmethod
    def _changed(environ: dict[str, Any], service: str, action: str, out: bytes) -> bool:
        if service == "s3":
            return environ.get("REQUEST_METHOD") in ("PUT", "POST", "DELETE")
        if action == "ReceiveMessage":  # receive counts move (and messages to a DLQ) only when some came
            return b"<Message>" in out or b'"Messages": [{' in out or b'"Messages":[{' in out
        return bool(action) and not action.startswith(_READ_ONLY)


_SERVED: dict[str, tuple[str, str]] = {}  # endpoint -> key pair, of the servers this process runs


def plane_methods(plane: bool = True) -> tuple[tuple[type, str, Any], ...]:
    """Where the local plane replaces moto's DynamoDB methods, as (class, attribute,
    function): the plane's (items held compactly, queries that read their candidates,
    answers written directly), or with ``plane`` false moto's own, for the tests and
    benches that hold the two side by side. Transactions (moto_dynamodb) are not among
    them: every caller runs the plane's."""
    from calque.local import moto_compact, moto_index, moto_serialize

    return (*moto_compact.methods(plane), *moto_index.methods(plane), *moto_serialize.methods(plane))


def swap(methods: Iterable[tuple[type, str, Any]]) -> None:
    """Put each (class, attribute, function) of ``methods`` in place (``plane_methods`` or one
    module's ``methods``: the plane's, or moto's own again)."""
    for owner, name, function in methods:
        setattr(owner, name, function)


class MotoServer:
    """moto's server app on a free port (or ``port``) of the loopback interface, in a daemon
    thread. Given ``credentials``, only requests signed with them get in."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        on_send_command: SendCommandListener | None = None,
        *,
        credentials: tuple[str, str] | None = None,
        region: str = "us-east-1",
        persistence: Any = None,
        hosts: Callable[[str], Any] | None = None,
    ):
        self.hosts = hosts
        self.host = host
        self.port = port
        self.on_send_command = on_send_command
        self.credentials = credentials
        self.region = region
        self.persistence = persistence
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

        from calque.local import moto_dynamodb, moto_models

        moto_dynamodb.install()  # transactions that copy what they touch, not whole tables
        moto_models.untrack()  # moto keeps no copy of an item once nothing uses it
        # items held as one blob each between requests (moto_compact), queries that read the
        # items they can return, not the whole table (moto_index), answers' items written
        # directly, not walked shape by shape (moto_serialize)
        swap(plane_methods())

        class _QuietHandler(MotoRequestHandler):  # type: ignore[misc, valid-type, unused-ignore]
            def log_request(self, *args: Any, **kwargs: Any) -> None:
                pass  # one line per AWS call would drown the plane's own output

        self.app = LocalAwsApp(
            DomainDispatcherApplication(create_backend_app),
            self.on_send_command,
            credentials=self.credentials,
            region=self.region,
            persistence=self.persistence,
            hosts=self.hosts,
        )
        if self.persistence is not None:
            self.persistence.attach(self.app.internal_call)
        self._server = make_server(
            self.host, self.port, self.app, threaded=True, request_handler=_QuietHandler
        )
        self.port = self._server.server_address[1]
        if self.credentials is not None:
            _SERVED[self.endpoint] = self.credentials
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
            _SERVED.pop(self.endpoint, None)
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)


def plane_credentials_for(endpoint: str) -> tuple[str, str] | None:
    """The key pair of the plane serving ``endpoint``: a server of this process, else the
    plane of the state directory this process would use (CALQUE_LOCAL_STATE_DIR)."""
    if endpoint in _SERVED:
        return _SERVED[endpoint]
    from calque.local.state import StateDir, state_dir_from

    state = StateDir(state_dir_from())
    plane = state.read_plane() or {}
    if str(plane.get("moto_endpoint", "")).rstrip("/") == endpoint.rstrip("/"):
        return state.plane_credentials()
    return None


class MotoClients:
    """boto3 clients pointed at a moto server, signing with ``credentials``: by default the
    key pair of the plane that serves ``endpoint`` (a test's own server takes any)."""

    def __init__(self, endpoint: str, region: str, credentials: tuple[str, str] | None = None):
        import boto3
        from botocore.config import Config

        self.endpoint = endpoint
        self.region = region
        key, secret = credentials or plane_credentials_for(endpoint) or ("testing", "testing")
        self._session = boto3.session.Session(
            aws_access_key_id=key, aws_secret_access_key=secret, region_name=region
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
    status, exit code and output, so ``GetCommandInvocation`` tells what happened. Each
    invocation is named by the document's step that runs the agent, as SSM names it (and
    as a reader of a document of several steps must ask for it)."""

    OUTPUT_LIMIT = 24000  # SSM keeps this much of each stream in the API answer

    def __init__(self, account: str, region: str, on_change: Callable[[], None] | None = None):
        self.account = account
        self.region = region
        self.on_change = on_change  # moto's record changed (the plane keeps it on disk)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _command(self, command_id: str) -> Any:
        from moto.ssm.models import ssm_backends

        return ssm_backends[self.account][self.region].get_command_by_id(command_id)

    def targeted(self, command_id: str, instance_ids: list[str]) -> None:
        from calque.resources import HOST_AGENT_STEP

        command = self._command(command_id)
        by_id = {i["InstanceId"]: i for i in command.invocations}
        command.instance_ids = list(instance_ids)
        command.invocations = [
            {
                # its step's name, as SSM names a step's invocation (not the plugin's action)
                **by_id.get(i, command.invocation_response(i, HOST_AGENT_STEP)),
                "PluginName": HOST_AGENT_STEP,
                "Status": "Pending",
                "StatusDetails": "Pending",
                "ResponseCode": -1,
            }
            for i in instance_ids
        ]
        command.target_count = len(instance_ids)
        command.completed_count = 0
        command.status = command.status_details = "Pending" if instance_ids else "Success"
        self._changed()

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
        self._changed()

"""What SSM Run Command does on an instance, for the local plane's simulated hosts.

moto's SendCommand records a command and runs nothing. The plane's moto layer hands
every accepted SendCommand of the host-agent document here; for each targeted
instance that is a simulated host this runs the host agent as a subprocess:

    python -m host_agent --simulate <instance type> --state <state>/hosts/<id>.json
        --instance-id <id> --report-to <endpoint> <verb> [--spec FILE] [--slice ID]
        [--user ACCOUNT] [--token-sha256 HEX] [--fence N]

with the document's parameters (names from calque.resources.SSM_DOCUMENT_PARAMETERS:
verb, spec (JSON text, written to a file), sliceId, fence, user, tokenSha256, reportTo),
mapped to arguments as the deployed document's run_host_agent.sh maps them and that instance's own
credentials profile, so its report is signed as the instance role. Commands run one
at a time per instance, in the order sent. What each did is kept in
``<state>/ssm/<command-id>/<instance-id>.json``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from calque import resources
from calque.local.state import StateDir

log = logging.getLogger("calque.local")

DEFAULT_AGENT = (sys.executable, "-m", "host_agent")
# Of the plane's environment, only what finds the installed host agent and its locale.
_CARRIED = ("PYTHONPATH", "VIRTUAL_ENV", "LANG", "LC_ALL", "TZ")
# Stand-ins a pool worker started on a simulated host needs: where AWS is (here moto) and the
# worker's and the example runner's own settings.
_CARRIED_FOR_WORKERS = ("CALQUE_AWS_ENDPOINT_URL", "CALQUE_WORKER_LOG_LEVEL")
_CARRIED_PREFIXES = ("CALQUE_EXAMPLE_",)


class SsmExecutor:
    def __init__(
        self,
        state: StateDir,
        *,
        document_name: str,
        report_to: str,
        region: str,
        agent_argv: Sequence[str] = DEFAULT_AGENT,
        timeout_s: float = 600,
        ec2: Any = None,
        records: Any = None,
    ):
        self.state = state
        self.document_name = document_name
        self.report_to = report_to
        self.region = region
        self.agent_argv = list(agent_argv)
        self.timeout_s = timeout_s
        self.ec2 = ec2
        self.records = records  # moto's own command records, kept true (CommandRecords), when in-process
        self._queues: dict[str, queue.Queue[tuple[str, dict[str, list[str]]] | None]] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._stopped = False

    # intake (called from the moto layer on each accepted SendCommand)
    def on_send_command(self, request: dict[str, Any], response: dict[str, Any]) -> None:
        if request.get("DocumentName") != self.document_name:
            return
        command_id = response.get("Command", {}).get("CommandId")
        if not command_id:
            return
        params = {k: list(v) for k, v in (request.get("Parameters") or {}).items()}
        targets = self._targets(request)
        if self.records is not None:
            self.records.targeted(command_id, targets)
        for instance_id in targets:
            self._queue_for(instance_id).put((command_id, params))

    def resume(self, command_id: str, instance_id: str, params: dict[str, list[str]]) -> None:
        """Run again a command the plane's last stop cut short on ``instance_id`` (the agent
        converges, so running it twice is running it once). It reports to this plane: the
        address the plane had when it sent the command may have changed with the restart
        (``--port 0``)."""
        params = {k: list(v) for k, v in params.items()}
        params[resources.SSM_DOCUMENT_PARAMETERS.report_to] = [self.report_to]
        self._queue_for(instance_id).put((command_id, params))

    def _targets(self, request: dict[str, Any]) -> list[str]:
        ids = list(request.get("InstanceIds") or [])
        for target in request.get("Targets") or []:
            key, values = target.get("Key", ""), list(target.get("Values") or [])
            if key == "InstanceIds":
                ids += values
            elif key.startswith("tag:") and self.ec2 is not None:
                found = self.ec2.describe_instances(Filters=[{"Name": key, "Values": values}])
                ids += [i["InstanceId"] for r in found["Reservations"] for i in r["Instances"]]
        return list(dict.fromkeys(ids))

    def _queue_for(self, instance_id: str) -> queue.Queue[tuple[str, dict[str, list[str]]] | None]:
        with self._lock:
            if instance_id not in self._queues:
                q: queue.Queue[tuple[str, dict[str, list[str]]] | None] = queue.Queue()
                self._queues[instance_id] = q
                t = threading.Thread(
                    target=self._worker, args=(instance_id, q), name=f"ssm-{instance_id}", daemon=True
                )
                self._threads.append(t)
                t.start()
            return self._queues[instance_id]

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            for q in self._queues.values():
                q.put(None)
        for t in self._threads:
            t.join(timeout=5)

    def _worker(self, instance_id: str, q: queue.Queue[tuple[str, dict[str, list[str]]] | None]) -> None:
        while (item := q.get()) is not None:
            command_id, params = item
            try:
                self.run(command_id, instance_id, params)
            except Exception:
                log.exception("SSM executor: command %s on %s failed to run", command_id, instance_id)

    # execution
    def argv(
        self, instance_id: str, instance_type: str, params: dict[str, list[str]], spec_file: Path | None
    ) -> list[str]:
        p = resources.SSM_DOCUMENT_PARAMETERS
        first = {k: (v[0] if v else "") for k, v in params.items()}
        argv = [
            *self.agent_argv,
            "--simulate",
            instance_type,
            "--state",
            str(self.state.host_state_file(instance_id)),
            "--instance-id",
            instance_id,
            "--report-to",
            first.get(p.report_to) or self.report_to,
            first.get(p.verb, ""),
        ]
        # As infra/components/run_host_agent.sh's `case "$verb"` builds them.
        verb = first.get(p.verb, "")
        if verb == "worker":  # a pool's workers: their records beside the plane's
            argv += [first.get(p.worker_action) or "status", "--workers-dir", str(self.state.path / "pools")]
            if first.get(p.worker):
                argv += ["--worker", first[p.worker]]
        if spec_file is not None:
            argv += ["--spec", str(spec_file)]
        if verb == "grant":
            argv += ["--slice", first.get(p.slice_id, ""), "--user", first.get(p.user, "")]
            if first.get(p.token_sha256):
                argv += ["--token-sha256", first[p.token_sha256]]
            if first.get(p.fence):
                argv += ["--fence", first[p.fence]]
        elif first.get(p.slice_id):
            argv += ["--slice", first[p.slice_id]]
            if first.get(p.fence):
                argv += ["--fence", first[p.fence]]
        return argv

    def env(self, instance_id: str, verb: str = "") -> dict[str, str]:
        """What the SSM agent gives an ``aws:runShellScript`` step, and no more: its own PATH
        (here the plane's), ``AWS_SSM_INSTANCE_ID`` and ``AWS_SSM_REGION_NAME``; no
        ``AWS_REGION``/``AWS_DEFAULT_REGION``, no HOME, nothing of the plane's own settings.
        Where the report goes comes from the document's parameters (``--report-to``).

        Two stand-ins for what a real instance has without any environment: the instance
        role's credentials (the instance metadata service there; here the instance's own
        profile of the plane's credentials file, through the standard credential chain),
        and the installed host agent (here the plane's own PYTHONPATH, when it has one)."""
        env = {
            "PATH": os.environ.get("PATH", os.defpath),
            "AWS_SSM_INSTANCE_ID": instance_id,
            "AWS_SSM_REGION_NAME": self.region,
            # the instance role's credentials: the stand-in for the instance metadata service
            "AWS_SHARED_CREDENTIALS_FILE": str(self.state.credentials_file),
            "AWS_PROFILE": instance_id,
            "AWS_CONFIG_FILE": os.devnull,
        }
        for name in _CARRIED:
            if os.environ.get(name):
                env[name] = os.environ[name]
        if verb == "worker":  # a pool's workers reach SQS and S3 (here: the plane's moto)
            for name in _CARRIED_FOR_WORKERS:
                if os.environ.get(name):
                    env[name] = os.environ[name]
            for name, value in os.environ.items():
                if name.startswith(_CARRIED_PREFIXES):
                    env[name] = value
        return env

    def run(self, command_id: str, instance_id: str, params: dict[str, list[str]]) -> dict[str, Any]:
        out_dir = self.state.ssm_dir / command_id
        out_dir.mkdir(parents=True, exist_ok=True)
        record: dict[str, Any] = {
            "command_id": command_id,
            "instance_id": instance_id,
            "parameters": params,
            "started_at": _now(),
        }
        host = self.state.principal(instance_id)
        if host is None or host.kind != "instance" or not host.instance_type:
            record.update(status="Undeliverable", reason="not a simulated host of this plane")
        else:
            spec_text = (params.get(resources.SSM_DOCUMENT_PARAMETERS.spec) or [""])[0]
            spec_file = None
            if spec_text:
                spec_file = out_dir / f"{instance_id}.spec.json"
                spec_file.write_text(spec_text)
            argv = self.argv(instance_id, host.instance_type, params, spec_file)
            record["argv"] = argv
            try:
                done = subprocess.run(
                    argv,
                    env=self.env(
                        instance_id, (params.get(resources.SSM_DOCUMENT_PARAMETERS.verb) or [""])[0]
                    ),
                    capture_output=True,
                    text=True,
                    timeout=self.timeout_s,
                    check=False,
                )
                record.update(
                    status="Success" if done.returncode == 0 else "Failed",
                    rc=done.returncode,
                    stdout=done.stdout,
                    stderr=done.stderr,
                )
            except subprocess.TimeoutExpired as exc:
                record.update(status="TimedOut", rc=None, stdout=_text(exc.stdout), stderr=_text(exc.stderr))
            except OSError as exc:
                record.update(status="Failed", rc=None, stdout="", stderr=str(exc))
        record["ended_at"] = _now()
        path = out_dir / f"{instance_id}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2))
        os.replace(tmp, path)
        if self.records is not None:
            try:
                self.records.finished(
                    command_id,
                    instance_id,
                    status=record["status"],
                    rc=record.get("rc"),
                    stdout=record.get("stdout", ""),
                    stderr=record.get("stderr") or record.get("reason", ""),
                )
            except Exception:
                log.exception("SSM %s: could not update moto's record", command_id)
        log.info("SSM %s on %s: %s", command_id, instance_id, record["status"])
        return record


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat()


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)

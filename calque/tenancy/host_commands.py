"""Host tasks -> SSM Run Command of the host-agent document, with its named parameters.

A grant carries the session's account and its token's SHA-256 (never the token): the
command's parameters are visible to whoever may read the instance's command history."""

from __future__ import annotations

import json
from typing import Any

from calque.contracts.hosts import ApplyTask
from calque.contracts.tenancy import GrantTask, ReclaimTask
from calque.resources import SSM_DOCUMENT_PARAMETERS

Task = ApplyTask | ReclaimTask | GrantTask

# How long SSM may try to deliver a command (SendCommand's TimeoutSeconds; 30 is its
# least). Without it a command waits up to an hour for an instance that is not answering
# and runs whenever it comes back. The agent refuses a grant or reclaim whose fence is
# older than the slice's anyway; this keeps a late apply from undoing a newer layout.
DELIVERY_TIMEOUT_S = 120


def command_parameters(task: Task, report_to: str, bundle_url: str | None = None) -> dict[str, list[str]]:
    p = SSM_DOCUMENT_PARAMETERS
    params: dict[str, list[str]] = {p.verb: [str(task.kind)], p.report_to: [report_to]}
    if bundle_url:
        params[p.bundle_url] = [bundle_url]
    if isinstance(task, ApplyTask):
        params[p.spec] = [json.dumps(task.spec, separators=(",", ":"))]
    else:
        params[p.slice_id] = [task.slice_id]
        params[p.fence] = [str(task.fence)]
    if isinstance(task, GrantTask):
        params[p.user] = [task.user]
        params[p.token_sha256] = [task.token_sha256]
    return params


def send_host_command(
    ssm: Any, task: Task, *, document_name: str, report_to: str, bundle_url: str | None = None
) -> str:
    """Send the task to its instance; returns the SSM command id. A failure raises, so the
    message is retried and, after its retries, lands in the queue's DLQ."""
    comment = f"calque {task.kind}" + (
        f" {task.slice_id} (fence {task.fence})" if isinstance(task, ReclaimTask | GrantTask) else ""
    )
    out = ssm.send_command(
        InstanceIds=[task.instance_id],
        DocumentName=document_name,
        Parameters=command_parameters(task, report_to, bundle_url),
        Comment=comment[:100],
        TimeoutSeconds=DELIVERY_TIMEOUT_S,
    )
    return str(out["Command"]["CommandId"])

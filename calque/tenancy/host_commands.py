"""Host tasks -> SSM Run Command of the host-agent document, with its named parameters."""

from __future__ import annotations

import json
from typing import Any

from calque.contracts.tenancy import ApplyTask, ReclaimTask
from calque.resources import SSM_DOCUMENT_PARAMETERS


def command_parameters(task: ApplyTask | ReclaimTask, report_to: str) -> dict[str, list[str]]:
    p = SSM_DOCUMENT_PARAMETERS
    params: dict[str, list[str]] = {p.verb: [str(task.kind)], p.report_to: [report_to]}
    if isinstance(task, ApplyTask):
        params[p.spec] = [json.dumps(task.spec, separators=(",", ":"))]
    else:
        params[p.slice_id] = [task.slice_id]
        params[p.fence] = [str(task.fence)]
    return params


def send_host_command(ssm: Any, task: ApplyTask | ReclaimTask, *, document_name: str, report_to: str) -> str:
    """Send the task to its instance; returns the SSM command id. A failure raises, so the
    message is retried and, after its retries, lands in the queue's DLQ."""
    comment = f"calque {task.kind}" + (
        f" {task.slice_id} (fence {task.fence})" if isinstance(task, ReclaimTask) else ""
    )
    out = ssm.send_command(
        InstanceIds=[task.instance_id],
        DocumentName=document_name,
        Parameters=command_parameters(task, report_to),
        Comment=comment[:100],
    )
    return str(out["Command"]["CommandId"])

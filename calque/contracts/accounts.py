"""The OS accounts a session runs as on its host, and the command that reaches it.

Plain functions, no models: the control plane names an account as the host agent does,
without importing the agent's report models (a check-out's cold start needs only these).
"""

from __future__ import annotations


def session_account(session_id: str) -> str:
    """The OS account a session gets on its host: derived from the session id, so the control
    plane and the agent name it alike without storing it."""
    import hashlib

    return "calque-" + hashlib.sha256(session_id.encode()).hexdigest()[:12]


def mps_account(gpu_index: int) -> str:
    """The one account every MPS slot of a GPU runs as (one MPS server serves one Unix user)."""
    return f"calque-mps-g{gpu_index}"


def connect_account(session_id: str, backend: str, slice_id: str) -> str:
    """The account a session's connect command lands in: its own, or for an MPS slot the
    GPU's shared MPS account (slice ids start with the GPU, ``g<N>-``)."""
    import re

    m = re.match(r"^g(\d+)-", slice_id)
    if backend == "mps" and m:
        return mps_account(int(m.group(1)))
    return session_account(session_id)


def session_connect_command(instance_id: str, document_name: str, account: str) -> str:
    """`aws ssm start-session` with the stack's session document, which asks for the
    session's token on the host and then runs the shell as the session's account."""
    return (
        f"aws ssm start-session --target {instance_id} --document-name {document_name} "
        f'--parameters "user={account}"'
    )


def command_b64(argv: list[str]) -> str:
    """A command for the session document's ``command`` parameter: the shell words quoted,
    then base64 (whose alphabet holds no shell metacharacter, so what root's document
    substitutes it into cannot be broken out of); the host's login decodes it and runs it
    as the session's account."""
    import base64
    import shlex

    return base64.b64encode(shlex.join(argv).encode()).decode()


def session_connect_argv(
    instance_id: str,
    document_name: str,
    account: str,
    *,
    region: str,
    profile: str | None = None,
    command: list[str] | None = None,
) -> list[str]:
    """``aws ssm start-session`` as an argv, with the region the hosts run in (and the AWS
    profile, when one was named); with ``command``, the document runs that one command
    instead of a shell."""
    params = f"user={account}"
    if command:
        params += f",command={command_b64(command)}"
    argv = ["aws", "ssm", "start-session", "--region", region]
    if profile:
        argv += ["--profile", profile]
    return [*argv, "--target", instance_id, "--document-name", document_name, "--parameters", params]


def read_token_line(fd: int = 0) -> str:
    """One line of ``fd`` (a session's token, where no terminal asks for it), read a byte at
    a time so that nothing after it is taken from the shell or command that reads on."""
    import os

    out = bytearray()
    while True:
        ch = os.read(fd, 1)
        if not ch or ch == b"\n":
            return out.decode(errors="replace")
        out += ch

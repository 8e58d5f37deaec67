"""A reader that stops reading stdout (`calque ... | head`) ends the command quietly, exit
141 as a shell reports a command its pipe's reader left: nothing is wrong and there is no one
to tell. Run as real processes, so stdout is a real pipe that closes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit


def test_a_reader_that_stops_reading_ends_the_command_quietly(tmp_path):
    """`calque claim result ID | head -c 10` of a large result: the download did not fail, and
    nothing is a bug; before, it said `cannot download the claim's result: [Errno 32] Broken
    pipe`, and with --output json a traceback."""
    script = tmp_path / "run.py"
    script.write_text(
        "import io, sys, urllib.request\n"
        "from tests.unit.cli_support import FakeApi\n"
        "doc = b'[' + b'1, ' * 2_000_000 + b'1]'  # 6 MB: more than a pipe holds\n"
        "urllib.request.urlopen = lambda url, timeout: io.BytesIO(doc)\n"
        "api = FakeApi()\n"
        "api.responses[('GET', '/v1/claims/c-0000000000000001/result')] = {\n"
        "    'claim_id': 'c-0000000000000001', 'results': None,\n"
        "    'download': {'url': 'u'}}\n"
        "from calque.cli.context import Context\n"
        "Context.client = lambda self: api\n"
        "from calque.cli.main import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    for output in ("table", "json"):
        reader = subprocess.Popen(
            f"{sys.executable} {script} --output {output} claim result c-0000000000000001"
            " | head -c 10 >/dev/null;"
            " echo ${PIPESTATUS[0]}",
            shell=True,
            executable="/bin/bash",
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": root},
        )
        out, err = reader.communicate(timeout=60)
        assert out.decode().strip() == "141", err.decode()
        assert err.decode() == ""


def test_a_broken_pipe_that_is_not_stdout_is_still_unexpected(monkeypatch, capsys):
    """A BrokenPipeError from somewhere else (a socket, a child's pipe) while stdout is open is
    a failure to report, not a reader gone."""
    from tests.unit.cli_support import FakeApi, install_fake_api, run_cli

    api = install_fake_api(monkeypatch, FakeApi(), ["claim"])
    api.responses[("GET", "/v1/claims/c-0000000000000001")] = BrokenPipeError(32, "Broken pipe")
    code, _, err = run_cli(capsys, "claim", "show", "c-0000000000000001")
    assert code == 3
    assert err.startswith("calque: error: unexpected BrokenPipeError")

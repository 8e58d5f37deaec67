from __future__ import annotations

import json

import pytest

from host_agent.cli import main


class Agent:
    """Runs `python -m host_agent` in-process against one simulated host's state file."""

    def __init__(self, tmp_path, capsys, instance_type: str, instance_id: str = "i-0123456789abcdef0"):
        self.tmp = tmp_path
        self.capsys = capsys
        self.instance_type = instance_type
        self.state = tmp_path / "host.json"
        self.instance_id = instance_id
        self.n = 0

    def spec_file(self, spec) -> str:
        self.n += 1
        f = self.tmp / f"spec{self.n}.json"
        f.write_text(spec if isinstance(spec, str) else json.dumps(spec))
        return str(f)

    def __call__(self, *argv: str) -> tuple[int, dict]:
        self.capsys.readouterr()
        rc = main(
            [
                "--simulate",
                self.instance_type,
                "--state",
                str(self.state),
                "--instance-id",
                self.instance_id,
                *argv,
            ]
        )
        out = self.capsys.readouterr().out
        return rc, json.loads(out) if out.strip() else {}

    def apply(self, spec) -> tuple[int, dict]:
        return self("apply", "--spec", self.spec_file(spec))

    def check(self, spec) -> tuple[int, dict]:
        return self("assert", "--spec", self.spec_file(spec))


@pytest.fixture
def agent(tmp_path, capsys):
    return lambda instance_type, **kw: Agent(tmp_path, capsys, instance_type, **kw)

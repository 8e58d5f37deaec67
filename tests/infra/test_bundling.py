"""Lambda bundles built on this machine, without Docker, for the Lambda platform."""

from __future__ import annotations

from pathlib import Path

import pytest

from calque import resources
from infra import constants
from infra.deployment import PROJECT_ROOT

from .conftest import synth_context

pytestmark = pytest.mark.infra


def _synth_packaging(outdir: Path, cache_dir: Path) -> list[Path]:
    from aws_cdk import App, Stack
    from aws_cdk import aws_lambda as lambda_

    from infra.components.python_packaging import PythonPackaging

    context = synth_context()
    context.pop("aws:cdk:bundling-stacks")  # this test really bundles
    app = App(context=context, outdir=str(outdir))
    stack = Stack(app, "Packaging")
    packaging = PythonPackaging(
        stack, "Python", project_root=PROJECT_ROOT, packages=("calque", "functions"), cache_dir=cache_dir
    )
    # A layer and code are only staged when something uses them.
    lambda_.Function(
        stack,
        "Fn",
        runtime=packaging.runtime,
        architecture=packaging.architecture,
        handler=resources.FUNCTIONS[0].handler,
        code=packaging.code,
        layers=[packaging.dependencies_layer],
    )
    app.synth()
    return sorted(p for p in outdir.iterdir() if p.name.startswith("asset.") and p.is_dir())


@pytest.mark.timeout(900)
def test_local_bundling_builds_the_layer_for_lambda_and_reuses_it(tmp_path, monkeypatch) -> None:
    # Given an empty bundle cache
    cache = tmp_path / "cache"
    # When the packaging is synthesized with bundling on
    assets = _synth_packaging(tmp_path / "out1", cache)
    layer = next(a for a in assets if (a / "python").is_dir())
    code = next(a for a in assets if (a / "calque").is_dir())
    site = layer / "python"
    # Then the layer holds the runtime dependencies as wheels for the Lambda platform
    arch = {"arm64": "aarch64", "x86_64": "x86_64"}[constants.LAMBDA_ARCHITECTURE]
    py = constants.LAMBDA_PYTHON_VERSION.replace(".", "")
    native = list((site / "pydantic_core").glob("_pydantic_core.*.so"))
    assert [n.name for n in native] == [f"_pydantic_core.cpython-{py}-{arch}-linux-gnu.so"]
    assert (site / "aws_lambda_powertools").is_dir()
    assert (site / "yaml").is_dir()
    # And leaves out what the Lambda runtime already provides
    for provided in constants.LAMBDA_RUNTIME_PROVIDED:
        assert not (site / provided).exists()
    # And the code holds our packages: every handler module that exists in the source tree
    modules = [f.handler.rsplit(".", 1)[0].replace(".", "/") + ".py" for f in resources.FUNCTIONS]
    present = [m for m in modules if (PROJECT_ROOT / m).is_file()]
    assert present
    assert all((code / m).is_file() for m in present)
    assert not list(code.rglob("__pycache__"))
    assert not (code / "tests").exists()
    # And every file is readable by the user Lambda runs code as
    assert all(p.stat().st_mode & 0o004 for p in layer.rglob("*"))

    # When it is synthesized again with pip unavailable
    def no_pip(*_args, **_kwargs):
        raise AssertionError("pip ran again although the inputs did not change")

    monkeypatch.setattr("infra.bundling.subprocess.run", no_pip)
    again = _synth_packaging(tmp_path / "out2", cache)
    # Then the cached bundles are reused, identical
    assert [a.name for a in again] == [a.name for a in assets]

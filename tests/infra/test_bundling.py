"""Lambda bundles built on this machine, without Docker, for the Lambda platform."""

from __future__ import annotations

from pathlib import Path

import pytest

from calque import resources
from infra import constants
from infra.deployment import PROJECT_ROOT

from .conftest import synth_context

pytestmark = [pytest.mark.infra, pytest.mark.long]


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
    # And its own boto3 and botocore, whose data holds only the services the functions call
    from calque import aws

    assert (site / "boto3").is_dir()
    data = site / "botocore" / "data"
    assert {p.name for p in data.iterdir() if p.is_dir()} == set(aws.SERVICES)
    # And the code holds our packages: every handler module that exists in the source tree
    modules = [f.handler.rsplit(".", 1)[0].replace(".", "/") + ".py" for f in resources.FUNCTIONS]
    present = [m for m in modules if (PROJECT_ROOT / m).is_file()]
    assert present
    assert all((code / m).is_file() for m in present)
    # with bytecode, if any, only for the Lambda's Python
    assert {p.name.split(".")[-2] for p in code.rglob("*.pyc")} <= {f"cpython-{py}"}
    assert not (code / "tests").exists()
    # And every file is readable by the user Lambda runs code as
    assert all(p.stat().st_mode & 0o004 for p in layer.rglob("*"))

    # When it is synthesized again with pip unavailable
    def no_pip(*_args, **_kwargs):
        raise AssertionError(f"pip ran again although the inputs did not change: {_args}")

    monkeypatch.setattr("infra.bundling.subprocess.run", no_pip)
    again = _synth_packaging(tmp_path / "out2", cache)
    # Then the cached bundles are reused, identical
    assert [a.name for a in again] == [a.name for a in assets]


def _this_python() -> str:
    import sys

    return f"{sys.version_info.major}.{sys.version_info.minor}"


def test_the_code_bundle_ships_bytecode_checked_by_hash_for_the_target_python(tmp_path) -> None:
    import importlib.util
    import subprocess
    import sys

    from infra.bundling import CopyPackages

    # Given our packages bundled for the Python this machine runs (a stand-in for the Lambda's)
    recipe = CopyPackages(root=PROJECT_ROOT, packages=("calque", "functions"), python_version=_this_python())
    recipe.build(tmp_path)
    # Then every module has bytecode beside it, for that version, that never checks the source's timestamp
    sources = list((tmp_path / "functions" / "api").glob("*.py"))
    assert sources
    for source in sources:
        pyc = Path(importlib.util.cache_from_source(str(source)))
        assert pyc.is_file(), pyc
        flags = int.from_bytes(pyc.read_bytes()[4:8], "little")
        assert flags == 0b01, (pyc, flags)  # hash-based, unchecked: the zip's timestamps do not matter
    # And the handler is imported from that bytecode, not from its sources: a source changed after
    # bundling (which a real bundle never sees) is not even read
    (tmp_path / "functions" / "api" / "errors.py").write_text("raise SystemExit('source was read')\n")
    done = subprocess.run(
        [sys.executable, "-B", "-c", "import functions.api.handler"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # a fingerprint that knows the bundle holds bytecode: a sources-only build is another bundle
    assert recipe.fingerprint != CopyPackages(root=PROJECT_ROOT, packages=("calque", "functions")).fingerprint


def test_without_an_interpreter_for_the_target_python_the_bundle_ships_sources_and_says_so(
    tmp_path, monkeypatch, capsys
) -> None:
    from infra import bundling

    monkeypatch.delenv(bundling.LAMBDA_PYTHON_ENV, raising=False)
    monkeypatch.setattr(bundling.shutil, "which", lambda name: None)
    assert bundling.compile_bytecode(tmp_path, "3.99") is False
    assert "no Python 3.99 interpreter" in capsys.readouterr().err


def test_a_named_interpreter_of_another_version_is_refused(monkeypatch) -> None:
    from infra import bundling

    monkeypatch.setenv(bundling.LAMBDA_PYTHON_ENV, "/usr/bin/python3.11")
    with pytest.raises(bundling.BundlingError, match=r"not a Python 3\.99 interpreter"):
        bundling.bytecode_interpreter("3.99")

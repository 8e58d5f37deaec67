"""How our Python reaches Lambda: a dependency layer and one code asset, built without Docker."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from calque import aws
from infra import constants
from infra.bundling import CopyPackages, PipInstall, local_asset, project_dependencies


def lambda_architecture() -> lambda_.Architecture:
    return {"arm64": lambda_.Architecture.ARM_64, "x86_64": lambda_.Architecture.X86_64}[
        constants.LAMBDA_ARCHITECTURE
    ]


def lambda_runtime() -> lambda_.Runtime:
    return lambda_.Runtime(f"python{constants.LAMBDA_PYTHON_VERSION}", lambda_.RuntimeFamily.PYTHON)


class PythonPackaging(Construct):
    """``[project].dependencies`` as a layer of manylinux wheels, and ``packages`` as the code.

    The layer is rebuilt only when the dependencies or the platform change; the code
    only when a file of those packages changes.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        project_root: Path,
        packages: tuple[str, ...],
        cache_dir: Path,
    ) -> None:
        super().__init__(scope, construct_id)
        dependencies = PipInstall(
            requirements=project_dependencies(project_root / "pyproject.toml"),
            platform=constants.LAMBDA_PIP_PLATFORM,
            python_version=constants.LAMBDA_PYTHON_VERSION,
            botocore_services=tuple(sorted(aws.SERVICES)),
        )
        self.runtime = lambda_runtime()
        self.architecture = lambda_architecture()
        self.dependencies_layer = lambda_.LayerVersion(
            self,
            "Dependencies",
            code=lambda_.Code.from_asset(
                **local_asset(
                    name="layer", recipe=dependencies, source=project_root, cache_dir=cache_dir
                ).as_kwargs()
            ),
            compatible_runtimes=[self.runtime],
            compatible_architectures=[self.architecture],
            description="calque runtime dependencies (pyproject [project].dependencies, "
            f"{constants.LAMBDA_PIP_PLATFORM}, Python {constants.LAMBDA_PYTHON_VERSION})",
        )
        self.code = lambda_.Code.from_asset(
            **local_asset(
                name="code",
                recipe=CopyPackages(
                    root=project_root, packages=packages, python_version=constants.LAMBDA_PYTHON_VERSION
                ),
                source=project_root,
                cache_dir=cache_dir,
            ).as_kwargs()
        )

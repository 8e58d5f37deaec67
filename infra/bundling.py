"""Lambda and host-agent bundles built locally, without Docker, cached by their inputs.

Two kinds of bundle:

- ``PipInstall``: runtime dependencies installed as manylinux wheels for the Lambda
  platform (``pip install --platform ... --only-binary=:all:``), so the result runs on
  Lambda whatever machine synthesizes it; botocore's data is cut down to the services
  the functions call (``prune_botocore``).
- ``CopyPackages``: our own pure-Python packages copied as they are.

Both ship compiled bytecode for the Lambda's Python version beside the sources
(``__pycache__/*.cpython-312.pyc``), checked by hash never by timestamp: the code
is read-only on Lambda and unzipped with whatever timestamps the zip holds, so
without it every cold start compiles every module again. Only an interpreter of
that version writes its bytecode: ``python3.12`` on PATH, or the one named by
``CALQUE_LAMBDA_PYTHON``; without one the bundle ships sources only and the synth
says so on stderr.

Each is keyed by a fingerprint of its inputs; a bundle already built for that
fingerprint is copied from the cache instead of being rebuilt, so repeated synths
are fast. Docker is never used: a bundle that cannot be built fails the synth with
the reason.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsii
from aws_cdk import AssetHashType, BundlingOptions, DockerImage, ILocalBundling

# Bumped when the way a bundle is built changes, so old cache entries stop matching.
_BUNDLER_VERSION = "3"  # 2: compiled bytecode beside the sources; 3: botocore's data pruned
LAMBDA_PYTHON_ENV = "CALQUE_LAMBDA_PYTHON"
_CACHE_KEEP = 3  # bundles of each kind kept in the cache
_IGNORED_DIRS = frozenset({"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"})
_IGNORED_SUFFIXES = (".pyc", ".pyo")


class BundlingError(RuntimeError):
    """A bundle could not be built locally; the message says why."""


def project_dependencies(pyproject: Path, *, extras: Sequence[str] = ()) -> tuple[str, ...]:
    """The requirement strings of ``[project].dependencies`` plus the named extras."""
    project = tomllib.loads(pyproject.read_text())["project"]
    requirements = list(project.get("dependencies", []))
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        requirements += optional[extra]
    return tuple(requirements)


def _fingerprint(parts: Iterable[str | bytes]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


def bytecode_interpreter(python_version: str) -> str | None:
    """An interpreter that writes bytecode for ``python_version`` (e.g. "3.12"), or None."""
    return _bytecode_interpreter(python_version, os.environ.get(LAMBDA_PYTHON_ENV))


@functools.cache
def _bytecode_interpreter(python_version: str, named: str | None) -> str | None:
    # Asked once per synth: every bundle's fingerprint depends on the answer.
    candidates = [named] if named else []
    if f"{sys.version_info.major}.{sys.version_info.minor}" == python_version:
        candidates.append(sys.executable)
    candidates.append(shutil.which(f"python{python_version}") or "")
    for candidate in filter(None, candidates):
        probe = subprocess.run(
            [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode == 0 and probe.stdout.strip() == python_version:
            return candidate
        if candidate == named:
            raise BundlingError(f"{LAMBDA_PYTHON_ENV}={named} is not a Python {python_version} interpreter")
    return None


def _bytecode_marker(python_version: str) -> str:
    """Part of a fingerprint: a bundle built without bytecode is not the one built with it."""
    return f"bytecode-{python_version}" if bytecode_interpreter(python_version) else "sources"


def compile_bytecode(directory: Path, python_version: str, *, interpreter: str | None = None) -> bool:
    """Write ``__pycache__`` bytecode for every module under ``directory``; False when no
    interpreter of that version is available (the bundle then runs from sources)."""
    python = interpreter or bytecode_interpreter(python_version)
    if python is None:
        sys.stderr.write(
            f"calque bundling: no Python {python_version} interpreter (python{python_version} on PATH "
            f"or {LAMBDA_PYTHON_ENV}); {directory.name} ships without bytecode, so each cold start "
            "compiles it\n"
        )
        return False
    command = [
        python,
        "-m",
        "compileall",
        "-q",
        "-j",
        "0",
        "--invalidation-mode",
        "unchecked-hash",
        str(directory),
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise BundlingError(
            f"compiling {directory} for Python {python_version} failed:\n{result.stdout[-4000:]}"
        )
    return True


def _package_files(root: Path, package: str) -> list[Path]:
    files = []
    for dirpath, dirnames, filenames in os.walk(root / package):
        dirnames[:] = sorted(d for d in dirnames if d not in _IGNORED_DIRS)
        files += [Path(dirpath, f) for f in sorted(filenames) if not f.endswith(_IGNORED_SUFFIXES)]
    return files


@jsii.implements(ILocalBundling)
class _CachedLocalBundling:
    """Builds a bundle once per fingerprint under ``cache_dir``, then copies it to CDK's output."""

    def __init__(self, *, name: str, fingerprint: str, cache_dir: Path, build: Any) -> None:
        self._name = name
        self._fingerprint = fingerprint
        self._cache_dir = cache_dir
        self._build = build

    def try_bundle(self, output_dir: str, *_options: Any, **_kw: Any) -> bool:
        cached = self._cache_dir / f"{self._name}-{self._fingerprint[:32]}"
        if not cached.is_dir():
            self._cache_dir.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{self._name}-", dir=self._cache_dir))
            # Lambda and the host read the unpacked bundle as another user: keep it world-readable.
            staging.chmod(0o755)
            try:
                self._build(staging)
                # A concurrent synth may have won the race: either result is the same bundle.
                if not cached.exists():
                    staging.rename(cached)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            self._prune(keep=cached)
        shutil.copytree(cached, output_dir, dirs_exist_ok=True, symlinks=True)
        return True

    def _prune(self, *, keep: Path) -> None:
        """Keep the few newest bundles of this kind: every code change makes a new one."""
        entries = sorted(
            (p for p in self._cache_dir.glob(f"{self._name}-*") if p.is_dir() and p != keep),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
        for stale in entries[_CACHE_KEEP - 1 :]:
            shutil.rmtree(stale, ignore_errors=True)


def prune_botocore(site: Path, services: Iterable[str]) -> None:
    """Keep, of botocore's data under ``site``, only the models of ``services``.

    botocore ships the models of every AWS service (~450 directories) and, the first time
    a process loads a client's model, lists all of them to learn which exist (a directory
    listing each) and parses ``endpoints.json`` (1.2 MB, every service in every partition):
    about 45 ms of each cold start, for services no function calls. The shared files stay
    (partitions, retry and default configuration); ``endpoints.json`` keeps every partition
    and region, with only those services' entries. A client of any other service then fails
    with botocore's UnknownServiceError, which ``calque.aws`` refuses earlier, by name.
    """
    data = site / "botocore" / "data"
    if not data.is_dir():
        raise BundlingError(f"no botocore data under {site}: botocore is not installed there")
    wanted = set(services)
    present = {p.name for p in data.iterdir() if p.is_dir()}
    if missing := sorted(wanted - present):
        raise BundlingError(f"botocore under {site} has no model for {', '.join(missing)}")
    for name in sorted(present - wanted):
        shutil.rmtree(data / name)
    endpoints = json.loads((data / "endpoints.json").read_text())
    for partition in endpoints["partitions"]:
        partition["services"] = {k: v for k, v in partition["services"].items() if k in wanted}
    (data / "endpoints.json").write_text(json.dumps(endpoints, separators=(",", ":"), sort_keys=True))


@dataclass(frozen=True, kw_only=True)
class PipInstall:
    """Runtime dependencies installed for a Lambda platform from wheels only.

    boto3, botocore and s3transfer are installed too, as the requirements pin them, not
    taken from the Lambda runtime: the layer's botocore carries only ``botocore_services``'
    models (``prune_botocore``), and a layer's packages come before the runtime's.
    """

    requirements: tuple[str, ...]
    platform: str  # e.g. manylinux2014_aarch64
    python_version: str  # e.g. 3.12
    botocore_services: tuple[str, ...] = ()  # the botocore models kept; empty: botocore as it ships
    target_subdir: str = "python"  # a Lambda layer's packages live under python/

    @property
    def fingerprint(self) -> str:
        return _fingerprint(
            [
                "pip",
                _BUNDLER_VERSION,
                self.platform,
                self.python_version,
                self.target_subdir,
                _bytecode_marker(self.python_version),
                *sorted(self.requirements),
                "--",
                *sorted(self.botocore_services),
            ]
        )

    def build(self, out: Path) -> None:
        target = out / self.target_subdir
        command = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-compile",
            "--no-input",
            "--target",
            str(target),
            "--platform",
            self.platform,
            "--implementation",
            "cp",
            "--python-version",
            self.python_version,
            "--only-binary=:all:",
            *self.requirements,
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise BundlingError(
                f"pip could not install {', '.join(self.requirements)} for {self.platform} / Python "
                f"{self.python_version} (Docker is not used; wheels must exist for that platform):\n"
                f"{result.stderr.strip()[-4000:]}"
            )
        # Console scripts are of no use in a layer.
        shutil.rmtree(target / "bin", ignore_errors=True)
        if self.botocore_services:
            prune_botocore(target, self.botocore_services)
        compile_bytecode(target, self.python_version)


@dataclass(frozen=True, kw_only=True)
class CopyPackages:
    """Our own packages copied as they are, with optional extra files written beside them."""

    root: Path
    packages: tuple[str, ...]
    extra_files: tuple[tuple[str, str], ...] = ()  # (relative path, text)
    python_version: str | None = None  # compile bytecode for it (the Lambda's); None: sources only

    @property
    def fingerprint(self) -> str:
        marker = _bytecode_marker(self.python_version) if self.python_version else "sources"
        parts: list[str | bytes] = ["copy", _BUNDLER_VERSION, self.python_version or "-", marker]
        for package in self.packages:
            for path in _package_files(self.root, package):
                parts += [path.relative_to(self.root).as_posix(), path.read_bytes()]
        for name, text in self.extra_files:
            parts += [name, text]
        return _fingerprint(parts)

    def build(self, out: Path) -> None:
        for package in self.packages:
            if not (self.root / package / "__init__.py").is_file():
                raise BundlingError(f"package {package!r} not found under {self.root}")
            for path in _package_files(self.root, package):
                dest = out / path.relative_to(self.root)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, dest)
        for name, text in self.extra_files:
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_text(text)
        if self.python_version is not None:
            for package in self.packages:
                compile_bytecode(out / package, self.python_version)


@dataclass(frozen=True, kw_only=True)
class AssetSource:
    """Keyword arguments for ``Code.from_asset`` / ``s3_assets.Asset`` that bundle locally."""

    path: str
    asset_hash: str
    asset_hash_type: AssetHashType
    bundling: BundlingOptions

    def as_kwargs(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "asset_hash": self.asset_hash,
            "asset_hash_type": self.asset_hash_type,
            "bundling": self.bundling,
        }


def local_asset(
    *, name: str, recipe: PipInstall | CopyPackages, source: Path, cache_dir: Path
) -> AssetSource:
    """An asset built by ``recipe`` on this machine, hashed by the recipe's inputs.

    ``source`` is only where the asset nominally comes from; with a custom hash CDK
    never fingerprints it, and when bundling is skipped (tests) nothing is copied.
    """
    fingerprint = recipe.fingerprint
    local = _CachedLocalBundling(name=name, fingerprint=fingerprint, cache_dir=cache_dir, build=recipe.build)
    return AssetSource(
        path=str(source),
        asset_hash=fingerprint,
        asset_hash_type=AssetHashType.CUSTOM,
        # The image is required by the API but never pulled: local bundling always answers.
        bundling=BundlingOptions(image=DockerImage.from_registry("local-bundling-only"), local=local),
    )

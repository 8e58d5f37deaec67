"""A pool's runner package: zipped byte for byte the same for the same files, uploaded through
the presigned URL the API answers, and checked to hold the runner's module; and what
``pool update --package/--runner`` sends (a runner update the scaler rolls out)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

from calque.cli.errors import CliError


def check_runner_module(runner: str, package: Path) -> None:
    """The runner's module must be in the package (a worker imports it from there alone): a
    pool whose workers cannot import it would only relaunch them while its claims wait."""
    module = runner.split(":", 1)[0]
    rel = Path(*module.split("."))
    candidates = [package / rel.with_suffix(".py"), package / rel / "__init__.py"]
    if not any(c.is_file() for c in candidates):
        raise CliError(
            f"--runner {runner}: --package {package} has no module {module} "
            f"({rel.with_suffix('.py').as_posix()} or {(rel / '__init__.py').as_posix()}); "
            "the package must hold the runner's module",
            code="invalid_input",
            details={"field": "runner"},
        )


def zip_package(path: Path) -> bytes:
    """The directory as a zip, byte for byte the same for the same files (sorted, fixed
    timestamps, no caches), so its SHA-256 names its content."""
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in sorted(p for p in path.rglob("*") if p.is_file()):
            rel = f.relative_to(path)
            if (
                "__pycache__" in rel.parts
                or rel.suffix == ".pyc"
                or any(x.startswith(".") for x in rel.parts)
            ):
                continue
            info = zipfile.ZipInfo(rel.as_posix(), date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, f.read_bytes())
    return buf.getvalue()


def upload_package(ctx: Any, name: str, path: Path) -> str:
    """Stage the runner package in the artifact bucket: the API answers a presigned PUT URL
    under the pool's prefix (named by the zip's SHA-256), this uploads the zip to it, and the
    pool is created with that key. The caller needs no S3 permissions of its own."""
    import hashlib

    from calque.contracts.pools import PACKAGE_MAX_BYTES
    from calque.sdk import transfer

    data = zip_package(path)
    if len(data) > PACKAGE_MAX_BYTES:
        raise CliError(
            f"--package {path}: {len(data)} bytes zipped, over the {PACKAGE_MAX_BYTES} bytes a runner "
            "package may have (keep model weights in their own storage)",
            code="invalid_input",
            details={"field": "package"},
        )
    sha = hashlib.sha256(data).hexdigest()
    target = ctx.client().request(
        "POST", f"/v1/pools/{quote(name, safe='')}/package", {"sha256": sha, "size": len(data)}
    )
    if not target.get("exists"):
        transfer.put_presigned(
            target, data, len(data), what="the runner package", code="package_upload_failed"
        )
    return str(target["key"])


def runner_update(ctx: Any, name: str, *, package: str | None, runner: str | None) -> dict[str, Any]:
    """The body of a runner update: the new runner (checked as the API does, before anything is
    uploaded) and the new package, uploaded (it must hold the runner's module: the new one, or
    the pool's own)."""
    from pydantic import ValidationError

    from calque.contracts.pools import PoolUpdate

    body: dict[str, Any] = {}
    if runner is not None:
        try:
            PoolUpdate(runner=runner)
        except ValidationError as exc:
            raise CliError(
                f"--runner {runner}: the runner is MODULE:CLASS, a module of the package and its "
                "runner class",
                code="validation_failed",
                details={"field": "runner", "problem": exc.errors()[0]["msg"]},
            ) from None
        body["runner"] = runner
    if package is not None:
        path = Path(package).expanduser()
        if not path.is_dir():
            raise CliError(
                f"--package {package}: not a directory", code="invalid_input", details={"field": "package"}
            )
        current = ctx.client().request("GET", f"/v1/pools/{quote(name, safe='')}")  # 404: no such pool
        if current.get("state") == "deleting":  # the update would be refused: upload nothing for it
            raise CliError(
                f"pool {name!r} is being deleted: its runner is no longer changed (nothing uploaded)",
                code="pool_deleting",
                details={"pool": name},
            )
        check_runner_module(runner or str(current["runner"]), path)
        body["package_key"] = upload_package(ctx, name, path)
    return body

"""Old agent versions on the host: removed once nothing runs from them.

A new version is unpacked beside the old ones; pool workers started by an older one still
import from its directory, so a version goes only when no live process names it (in its
command line, its PYTHONPATH or its working directory). Run by the SSM step after an
install: `python3 -m host_agent.versions ROOT CURRENT`.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def in_use(version_dir: Path, proc: str = "/proc") -> bool:
    needle = str(version_dir).encode()
    for entry in Path(proc).iterdir():
        if not entry.name.isdigit():
            continue
        for name in ("cmdline", "environ"):
            try:
                if needle in (entry / name).read_bytes():
                    return True
            except OSError:
                continue
        try:
            if os.readlink(entry / "cwd").startswith(str(version_dir)):
                return True
        except OSError:
            continue
    return False


def prune(root: str | Path, current: str | Path, proc: str = "/proc") -> tuple[list[str], list[str]]:
    """(removed, kept in use): every version directory under root but current."""
    removed, kept = [], []
    current = Path(current).resolve()
    for d in sorted(Path(root).iterdir()):
        if not d.is_dir() or d.resolve() == current or d.name == "downloads" or d.name.endswith(".partial"):
            continue
        if not (d / "src").is_dir():
            continue
        if in_use(d, proc):
            kept.append(str(d))
        else:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(str(d))
    return removed, kept


if __name__ == "__main__":  # pragma: no cover - the SSM step's call
    gone, still = prune(sys.argv[1], sys.argv[2])
    for d in still:
        print(f"kept {d}: a running process still uses it", file=sys.stderr)

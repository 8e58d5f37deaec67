"""The trace ``calque simulate placement`` replays: the GPU jobs of a pod list (Alibaba GPU
cluster trace v2023), each refused line named."""

from __future__ import annotations

import csv
import functools
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

REQUIRED = ("name", "num_gpu", "gpu_milli", "creation_time", "deletion_time")
# The longest job the replay's sessions hold (their TTL bound, calque/simulate/placement.py),
# and the latest time it replays (the virtual clock's dates stay far inside the calendar).
MAX_DURATION_S = 10**9
MAX_TIME_S = 10**10


@dataclass(frozen=True)
class Job:
    line: int
    name: str
    num_gpu: int
    gpu_milli: int
    arrival: int
    duration: int
    group: str = "all"  # the trace's ``group`` column, when it has one

    @functools.cached_property  # a replay asks for it millions of times
    def fraction(self) -> Fraction:
        return Fraction(self.gpu_milli, 1000) if self.num_gpu == 1 else Fraction(1)


def _trace_error(path: str, line: int, message: str) -> Exception:
    from calque.errors import InvalidInput

    return InvalidInput(f"{path}, line {line}: {message}", code="invalid_trace", details={"line": line})


def read_trace(path: str | Path) -> tuple[list[Job], int]:
    """The GPU jobs of a pod-list trace, and how many CPU-only pods were skipped.

    Refuses (InvalidInput naming the line) missing columns, non-numeric values,
    negative times, a deletion before its creation, and gpu_milli outside 0..1000; and a
    trace with no GPU job at all (InvalidInput, no line)."""
    from calque.simulate.trace_file import read_csv

    return read_csv(path, _read_jobs)


def _read_jobs(p: str, fh: Any) -> tuple[list[Job], int]:
    """The GPU jobs of an open trace; InvalidInput naming the line of the first problem."""
    jobs: list[Job] = []
    skipped = 0
    reader = csv.reader(fh)
    header = next(reader, None)
    if header is None:
        raise _trace_error(p, 1, "the file is empty (expected a header line)")
    header = [h.strip() for h in header]
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise _trace_error(p, 1, f"missing column(s) {', '.join(missing)} in the header")
    twice = sorted({c for c in (*REQUIRED, "group") if header.count(c) > 1})
    if twice:  # a column read twice: which was meant? Neither is read in silence
        raise _trace_error(p, 1, f"column(s) {', '.join(twice)} given twice in the header")
    at = {c: header.index(c) for c in REQUIRED}
    group_at = header.index("group") if "group" in header else None
    for n, row in enumerate(reader, start=2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) < len(header):
            raise _trace_error(p, n, f"{len(row)} field(s), the header has {len(header)}")
        vals: dict[str, int] = {}
        for c in REQUIRED[1:]:
            raw = row[at[c]].strip()
            try:
                vals[c] = int(raw) if raw.lstrip("-").isdigit() else int(float(raw))
            except (ValueError, OverflowError):  # OverflowError: inf
                raise _trace_error(p, n, f"{c} {raw!r} is not a number") from None
            if vals[c] < 0:
                raise _trace_error(p, n, f"{c} {raw} is negative")
        if vals["deletion_time"] < vals["creation_time"]:
            raise _trace_error(
                p,
                n,
                f"deletion_time {vals['deletion_time']} is before creation_time {vals['creation_time']}",
            )
        if vals["deletion_time"] > MAX_TIME_S:
            raise _trace_error(
                p, n, f"deletion_time {vals['deletion_time']} is past the {MAX_TIME_S:,} s a replay runs"
            )
        if vals["deletion_time"] - vals["creation_time"] > MAX_DURATION_S:
            raise _trace_error(
                p,
                n,
                f"the pod runs {vals['deletion_time'] - vals['creation_time']:,} s "
                f"(deletion_time - creation_time), over the {MAX_DURATION_S:,} s a replayed job may",
            )
        if vals["gpu_milli"] > 1000:
            raise _trace_error(p, n, f"gpu_milli {vals['gpu_milli']} is more than one GPU (1000)")
        if vals["num_gpu"] == 0:
            skipped += 1
            continue
        jobs.append(
            Job(
                line=n,
                name=row[at["name"]].strip() or f"line-{n}",
                num_gpu=vals["num_gpu"],
                gpu_milli=vals["gpu_milli"] or 1000,
                arrival=vals["creation_time"],
                duration=max(1, vals["deletion_time"] - vals["creation_time"]),
                group=(row[group_at].strip() if group_at is not None else "") or "all",
            )
        )
    if not jobs:  # nothing to replay: a report of zeros would read as a fleet that waits for nothing
        from calque.errors import InvalidInput

        what = f"its {skipped:,} pod(s) are all CPU-only (num_gpu 0)" if skipped else "a header and no pods"
        raise InvalidInput(
            f"{p}: no GPU job to replay: {what}",
            code="invalid_trace",
            details={"field": "trace", "cpu_only_skipped": skipped},
        )
    return jobs, skipped

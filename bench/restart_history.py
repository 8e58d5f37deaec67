"""What a restart of the local plane reads, against how long a history led to the same
live state: SSM commands sent (each one a check-out's grant or a reclaim on a host) and
how long the saved state's SSM part takes to save once more and to restore.

The live state is the same in every row (a few commands still running); only the number
of finished commands before it grows. Printed as ratios to the smallest history, not as
timed assertions: a restart whose cost follows the live state stays near 1x however long
the history.

    PYTHONPATH=. python bench/restart_history.py [--histories 100,1000,10000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from moto.ssm.models import Command, ssm_backends

from calque.local.moto_ssm import SsmCommands
from calque.local.restored import Restored

REGION = "us-east-1"


def _fill(account: str, finished: int, running: int) -> None:
    backend = ssm_backends[account][REGION]
    for n in range(finished + running):
        c = Command(account, backend_region=REGION, instance_ids=[f"i-{n:08x}"])
        status = "Success" if n < finished else "InProgress"
        c.invocations = [{"InstanceId": f"i-{n:08x}", "Status": status, "StandardOutputContent": "ok " * 200}]
        c.status = status
        backend._commands.append(c)


def measure(history: int, account: str, restored_account: str) -> tuple[float, float, int, int]:
    """(seconds for one more save, seconds to restore, files on disk, commands restored)."""
    with tempfile.TemporaryDirectory() as tmp:
        store = SsmCommands(Path(tmp), account=account, region=REGION)
        for chunk in range(0, history, 1000):  # the plane saves after every change; here per 1,000
            _fill(account, min(1000, history - chunk), 0)
            store.save()
        _fill(account, 0, 4)
        store.save()
        ssm_backends[account][REGION]._commands[-1].invocations[0]["Status"] = "Success"
        started = time.perf_counter()
        store.save()  # one host finished one command
        save_s = time.perf_counter() - started
        files = len(list((Path(tmp) / "ssm").iterdir()))
        out = Restored()
        started = time.perf_counter()
        SsmCommands(Path(tmp), account=restored_account, region=REGION).restore(out)
        return save_s, time.perf_counter() - started, files, out.commands


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--histories", default="100,1000,10000")
    args = p.parse_args()
    histories = [int(h) for h in args.histories.split(",")]
    rows = []
    for n, history in enumerate(histories):
        rows.append((history, *measure(history, f"2000000000{n:02d}", f"3000000000{n:02d}")))
    base_save, base_restore = rows[0][1], rows[0][2]
    print(f"{'history':>8} {'files':>6} {'restored':>9} {'save x':>7} {'restore x':>10}")
    for history, save_s, restore_s, files, commands in rows:
        ratios = f"{save_s / base_save:>6.1f}x {restore_s / base_restore:>9.1f}x"
        print(f"{history:>8} {files:>6} {commands:>9} {ratios}")


if __name__ == "__main__":
    main()

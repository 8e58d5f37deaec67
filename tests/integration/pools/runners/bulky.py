"""A runner for the SDK tests: echoes items of any size, and talks slowly.

A string item comes back as ``{"sha256": ..., "echo": item}``; ``{"talk": n}`` prints
``line i`` on stdout (and every third on stderr) n times, a quarter second apart, so its
logs can be read while it runs and the claim cancelled meanwhile."""

from __future__ import annotations

import hashlib
import sys
import time


class Bulky:
    def enter(self) -> None:
        print("bulky entered", flush=True)

    def run(self, items: list) -> list:
        out = []
        for item in items:
            if isinstance(item, dict) and "talk" in item:
                for i in range(int(item["talk"])):
                    print(f"line {i}", flush=True)
                    if i % 3 == 0:
                        print(f"note {i}", file=sys.stderr, flush=True)
                    time.sleep(0.25)
                out.append({"said": int(item["talk"])})
            else:
                out.append({"sha256": hashlib.sha256(str(item).encode()).hexdigest(), "echo": item})
        return out

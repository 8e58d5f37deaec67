"""Runners that misbehave on purpose, for the pool tests.

Items are objects: {"n": number} is squared; {"fail": true} raises for that item;
{"crash": true} ends the runner's process at once (as a segfault or an OOM kill would);
{"sleep": seconds} sleeps first (to be killed mid-claim).
"""

from __future__ import annotations

import os
import time


class Misbehaving:
    def enter(self) -> None:
        time.sleep(0.2)
        self.entered_pid = os.getpid()

    def run(self, items: list) -> list:
        out = []
        for item in items:
            if item.get("sleep"):
                time.sleep(float(item["sleep"]))
            if item.get("crash"):
                os._exit(9)
            if item.get("fail"):
                raise ValueError(f"item {item} asked to fail")
            print(f"item {item}", flush=True)
            out.append({"square": item.get("n", 0) ** 2, "pid": os.getpid()})
        return out

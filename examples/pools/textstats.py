"""An example pool runner: text statistics over each item, with a slow ``enter``.

``enter`` sleeps a few seconds (CALQUE_EXAMPLE_ENTER_SECONDS, default 3) as a stand-in
for loading a model's weights, then builds its "model": a stop-word set and a compiled
tokenizer. ``run`` does real work on each item ``{"text": "..."}``: word and sentence
counts, the most frequent words, and a SHA-256 of the text. An item without text raises
for that item alone (the worker records a per-item error; the claim still succeeds).
An item may ask for ``"pause": seconds`` (at most 60) first: a stand-in for a long inference,
so a demo can stop a worker in the middle of a claim.

    calque pool create textstats --model textstats --instance-type g6e.xlarge \\
        --runner textstats:TextStats --package examples/pools --i-understand-this-spends-money
"""

from __future__ import annotations

import collections
import hashlib
import os
import re
import time

STOP_WORDS = frozenset(
    "a an and are as at be by for from in is it of on or that the to was with".split()  # noqa: SIM905
)


class TextStats:
    enters = 0  # how many times enter() ran in this process

    def enter(self) -> None:
        time.sleep(float(os.environ.get("CALQUE_EXAMPLE_ENTER_SECONDS", "3")))
        self.words = re.compile(r"[a-z0-9']+")
        self.sentences = re.compile(r"[.!?]+(?:\s|$)")
        self.stop = STOP_WORDS
        TextStats.enters += 1
        print(f"entered (pid {os.getpid()})", flush=True)

    def run(self, items: list) -> list:
        out = []
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("text"), str):
                raise ValueError(f"an item must be an object with a text string, got {item!r}"[:200])
            if isinstance(item.get("pause"), (int, float)):  # a tuple, not int | float: Python 3.9
                time.sleep(min(float(item["pause"]), 60.0))
            text = item["text"]
            words = self.words.findall(text.lower())
            counts = collections.Counter(w for w in words if w not in self.stop)
            out.append(
                {
                    "words": len(words),
                    "sentences": len(self.sentences.findall(text)) or (1 if text.strip() else 0),
                    "top": [w for w, _ in counts.most_common(3)],
                    "sha256": hashlib.sha256(text.encode()).hexdigest(),
                    "enters": TextStats.enters,
                    "pid": os.getpid(),
                    # the GPU or MIG slice this worker is bound to (set by the host agent)
                    "device": os.environ.get("CUDA_VISIBLE_DEVICES"),
                }
            )
        return out

    def exit(self) -> None:
        print("exiting", flush=True)

"""An example pool runner: lexicon sentiment of short texts, its "model" loaded once.

``enter`` loads the artefact shipped beside it (``lexicon.json``: word weights and negations;
nothing is downloaded) and sleeps CALQUE_EXAMPLE_ENTER_SECONDS (default 3) as a stand-in for
moving weights to a GPU. Every claim after the first on a worker reuses what ``enter`` loaded:
a warm hit. ``run`` scores each item, a string: the sum of its words' weights (a weight right
after a negation counts against), normalised to -1..1, and a label.

    calque pool create sentiment --model lexicon --instance-type g6e.xlarge \\
        --runner sentiment:Sentiment --package examples/sdk/sentiment --i-understand-this-spends-money
    python examples/sdk/map_reviews.py --pool sentiment
"""

from __future__ import annotations

import json
import math
import os
import re
import time

HERE = os.path.dirname(os.path.abspath(__file__))


class Sentiment:
    def enter(self) -> None:
        with open(os.path.join(HERE, "lexicon.json"), encoding="utf-8") as f:
            lexicon = json.load(f)
        self.weights = {str(w): float(v) for w, v in lexicon["weights"].items()}
        self.negations = frozenset(lexicon["negations"])
        self.words = re.compile(r"[a-z']+")
        time.sleep(float(os.environ.get("CALQUE_EXAMPLE_ENTER_SECONDS", "3")))
        print(f"loaded {len(self.weights)} weights (pid {os.getpid()})", flush=True)

    def run(self, items: list) -> list:
        out = []
        for text in items:
            if not isinstance(text, str):
                out.append(ValueError(f"an item is a text, got {type(text).__name__}"))
                continue
            total, negate = 0.0, False
            for word in self.words.findall(text.lower()):
                weight = self.weights.get(word, 0.0)
                total += -weight if negate else weight
                negate = word in self.negations
            score = round(math.tanh(total / 3), 3)
            label = "positive" if score > 0.2 else "negative" if score < -0.2 else "neutral"
            out.append({"score": score, "label": label})
        return out

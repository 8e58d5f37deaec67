"""What an EventBridge schedule rule does, for the local plane: fire the target with
a scheduled event every rate. ``scale`` shortens the period for demos and tests
(CALQUE_LOCAL_SCHEDULE_SCALE); ``fire_now`` fires at once, between ticks."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from calque.local.events import scheduled_event

log = logging.getLogger("calque.local")


class ScheduleTimer:
    def __init__(
        self,
        *,
        name: str,
        rate_s: float,
        rule_arn: str,
        account: str,
        region: str,
        target: Callable[[dict[str, Any]], Any],
        scale: float = 1.0,
    ):
        self.name = name
        self.period_s = max(0.05, rate_s * scale)
        self.rule_arn = rule_arn
        self.account = account
        self.region = region
        self.target = target
        self.fired = 0
        self._stop = threading.Event()
        self._fire_lock = threading.Lock()  # one run of a schedule at a time, as a rule with one target
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"timer-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def fire_now(self) -> Any:
        with self._fire_lock:
            self.fired += 1
            return self.target(
                scheduled_event(rule_arn=self.rule_arn, account=self.account, region=self.region)
            )

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.fire_now()
            except Exception:
                log.exception("schedule %s: the target failed", self.name)

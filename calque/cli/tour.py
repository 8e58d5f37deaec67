"""A scripted tour on a running local plane (``calque local demo``, ``calque local demo pools``):
numbered steps, each person's client, and bounded waits that print their progress."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from calque.cli.errors import CliError
from calque.cli.polling import ask_again, goes_on


class Tour:
    """Per-profile clients, step headers, and bounded waits with progress."""

    def __init__(self, ctx: Any, timeout_s: float, *, steps: int):
        self.ctx = ctx
        self.steps = steps
        self.timeout_s = timeout_s
        self.step_no = 0
        self.clients: dict[str, Any] = {}
        # With --output json, stdout carries one document: the tour talks on stderr.
        self.out = sys.stderr if ctx.json else sys.stdout
        self.record: list[dict[str, Any]] = []

    def say(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def step(self, title: str, command: str | None = None) -> None:
        self.step_no += 1
        self.say()
        self.say(f"[{self.step_no}/{self.steps}] {title}")
        if command:
            self.say(f"      $ {command}")
        self.record.append({"step": self.step_no, "title": title, "command": command})

    def note(self, text: str) -> None:
        for line in text.splitlines():
            self.say("      " + line if line else "")

    def as_(self, profile: str) -> Any:
        """What ``profile`` signs its requests with: a client of the plane as it runs now, also
        when kept from before a restart that moved the plane to another port."""
        return _Signed(self, profile)

    def client_of(self, profile: str) -> Any:
        if profile not in self.clients:
            from calque.cli.context import Context

            c = Context(
                output="json",
                endpoint_arg=self.ctx.endpoint,
                profile_arg=profile,
                state_dir_arg=self.ctx.state_dir_arg,
            )
            self.clients[profile] = c.client()
        return self.clients[profile]

    def wait(
        self,
        what: str,
        check: Callable[[], tuple[bool, str]],
        *,
        timeout_s: float | None = None,
        interval_s: float = 0.5,
        quiet_s: float = 0.0,
        follow: str = "calque local status",
    ) -> str:
        """Poll ``check`` (-> done, status) until done; print the status when it changes
        (at most every ``quiet_s`` seconds, and always the final one). A plane restart is
        ridden out (found anew on its new port); given up on, the error says that ``what``
        goes on there and the command that ``follow``s it."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        start = time.monotonic()
        last, printed_at = None, -quiet_s
        while True:
            done, status = ask_again(
                self.ctx,
                check,
                gave_up=lambda exc: goes_on(exc, f"what the tour waited for ({what})", follow=follow),
                refound=self.clients.clear,  # each person's client, made again for the new port
            )
            elapsed = time.monotonic() - start
            if status != last and (done or elapsed - printed_at >= quiet_s):
                self.note(f"... {status} ({elapsed:.1f}s)")
                last, printed_at = status, elapsed
            if done:
                return status
            if elapsed > limit:
                raise CliError(
                    f"timed out after {limit:g}s waiting for {what} (last seen: {status}); "
                    "the local plane's log may say why",
                    code="demo_timeout",
                    details={"waiting_for": what, "last_status": status, "timeout_s": limit},
                )
            time.sleep(interval_s)


class _Signed:
    """One person's requests on the tour, each sent with the tour's client of that person now."""

    def __init__(self, tour: Tour, profile: str) -> None:
        self.tour, self.profile = tour, profile

    def request(self, *args: Any, **kwargs: Any) -> Any:
        return self.tour.client_of(self.profile).request(*args, **kwargs)

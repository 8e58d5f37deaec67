"""The CLI's long waits through a control plane restart: a poll that cannot reach the plane
is asked again rather than ending the wait, since what it waits for goes on there.

Used by every wait that polls the API: ``session checkout --wait``, ``pool submit --wait``,
``claim logs --follow``, ``host acquire --wait``, ``host register --wait`` and the waits of
``local demo``. A plane that cannot be reached (``kill -9``, then ``calque local up``; a
deployment briefly down) is asked again for up to ``RECONNECT_S``; a local plane found from
its state directory is found anew each time, as it listens on another port once restarted.
Given up on, the wait ends with one line that says what goes on without it and the command
that follows it (``gave_up``). Any other refusal (404, 403, ...) ends the wait at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from calque.cli.errors import CliError

# How long a wait keeps asking a plane it cannot reach (restarting, briefly down) before it
# gives up, saying that what it waited for goes on.
RECONNECT_S = 60.0
# How often it asks meanwhile.
RETRY_S = 2.0
# What a plane being restarted answers: nothing listens, or no plane runs on its state dir yet.
UNREACHABLE = frozenset({"endpoint_unreachable", "no_endpoint", "local_plane_not_running"})

T = TypeVar("T")


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the plane could not be reached at all (not a refusal of its own)."""
    return getattr(exc, "code", "") in UNREACHABLE


def ask_again(
    ctx: Any,
    ask: Callable[[], T],
    *,
    gave_up: Callable[[CliError], CliError],
    refound: Callable[[], None] | None = None,
) -> T:
    """``ask()`` (which reaches the plane through ``ctx.client()``), asked again for up to
    ``RECONNECT_S`` while the plane cannot be reached; meanwhile a local plane found from its
    state directory is found anew (``ctx.reconnect()``, then ``refound()``: clients of its
    own to drop). Given up on: ``gave_up(the last unreachable error)``, raised in one line."""
    refindable = _finds_local_plane(ctx)
    deadline: float | None = None  # from the first failure: a poll that is answered reads no clock
    while True:
        try:
            return ask()
        except CliError as exc:
            if not unreachable(exc):
                raise
            now = time.monotonic()
            deadline = now + RECONNECT_S if deadline is None else deadline
            if now >= deadline:  # the wait ends, what it waited for does not: say so
                raise gave_up(exc) from None
        time.sleep(RETRY_S)
        if refindable:
            try:
                ctx.reconnect()
            except CliError:
                continue  # no plane runs there yet
            if refound is not None:
                refound()


def goes_on(
    exc: CliError, what: str, *, follow: str, stop: str | None = None, many: bool = False, **details: Any
) -> CliError:
    """The one line a wait given up on ends with: why (``exc``'s words), that ``what`` goes on
    without it (``many``: they go on), the command that ``follow``s it and the one that
    ``stop``s it when there is one; ``details`` join the error's."""
    it = "them" if many else "it"
    said = (
        f"{exc.message}; {what} {'go' if many else 'goes'} on without the wait: follow {it} with `{follow}`"
    )
    if stop:
        said += f", or stop {it} with `{stop}`"
    return CliError(said, code=exc.code, details={**exc.details, **details})


def _finds_local_plane(ctx: Any) -> bool:
    try:
        return bool(ctx.finds_local_plane())
    except CliError:  # a configuration that cannot be read: the endpoint stays as it is
        return False

"""`calque local demo pools` against a stand-in plane: a wait that runs out says why the pool
could not start what it waits for, when the pool's own record knows (the fleet's refusal)."""

from __future__ import annotations

from typing import Any

import pytest

from calque.cli.commands import demo_pools
from calque.cli.errors import CliError

pytestmark = pytest.mark.unit

REFUSED = "the fleet refused: the budget has no room: 4 instance(s) at $13.44/h in use, limit 4 at $60/h"


class Plane:
    """Every route the tour asks, answered at once: claims succeed on w-1; the pool's last
    scale-out was refused by the budget."""

    def request(self, method: str, path: str, body: Any = None, query: Any = None) -> Any:
        if path == "/v1/budget":
            return {"set": True}
        if (method, path) == ("GET", "/v1/pools"):
            return []
        if path.endswith("/claims"):
            return {"claim_id": "c-1"}
        if path.startswith("/v1/claims/"):
            summary = {"warm_hit": False, "enter_seconds": 3.0, "run_seconds": 0.1}
            return {"claim_id": "c-1", "state": "succeeded", "worker": "w-1", "summary": summary}
        if (method, path) == ("GET", f"/v1/pools/{demo_pools.POOL}"):
            decision = {
                "action": "scale_out",
                "reason": f"start 1; waiting: {REFUSED}",
                "waiting_for": REFUSED,
            }
            return {
                "name": demo_pools.POOL,
                "status": {"workers": [{"state": "idle"}], "decisions": [decision]},
            }
        return {}


class Ctx:
    json = False
    endpoint = "http://127.0.0.1:1"
    state_dir_arg = None

    def running_plane(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint}

    def local_state(self) -> str:
        return "/nonexistent"

    def finds_local_plane(self) -> bool:
        return False


def test_a_second_worker_the_budget_refuses_is_said_when_the_wait_runs_out(monkeypatch, capsys):
    # Given a plane whose budget has no room for the demo pool's second instance
    from calque.cli.tour import Tour
    from calque.local import pool_hosts

    plane = Plane()
    monkeypatch.setattr(Tour, "as_", lambda self, profile: plane)
    monkeypatch.setattr(pool_hosts, "running_workers", lambda state: [{"pool": demo_pools.POOL, "pid": 1}])
    # When the tour waits for two workers (a wait that runs out at once)
    with pytest.raises(CliError) as err:
        demo_pools.do_demo_pools(Ctx(), timeout_s=0)
    # Then its error says the budget refused the instance, not only the count it saw
    assert err.value.code == "demo_timeout"
    assert err.value.message.startswith(
        "timed out after 0s waiting for two workers (last seen: 1 worker processes; "
    )
    assert REFUSED in err.value.message

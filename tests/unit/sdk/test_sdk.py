"""The SDK over a stand-in API: a write asked again (plane unreachable, 503) carries the same
Idempotency-Key; a map yields outputs in order with a bounded window of claims; errors carry
the API's code; ``import calque`` does not import the SDK."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from calque.cli.errors import ApiError, CliError, EndpointUnreachable
from calque.sdk import ClaimError, Pool, RemoteError
from calque.sdk.connection import Connection

pytestmark = pytest.mark.unit


class Client:
    """The signed client's stand-in: claims run at once; ``down`` requests fail first."""

    def __init__(self, down: list[Exception] | None = None) -> None:
        self.down = list(down or [])
        self.calls: list[tuple[str, str, Any, str | None]] = []
        self.claims: dict[str, dict[str, Any]] = {}
        self.live_max = 0

    def request(self, method: str, path: str, body: Any = None, query: Any = None, *, idempotency_key=None):
        self.calls.append((method, path, body, idempotency_key))
        if self.down:
            raise self.down.pop(0)
        if method == "POST" and path.endswith("/claims"):
            cid = f"c-{len(self.claims):016x}"
            items = body["items"]
            state = "failed" if items == ["doom"] else "queued"
            self.claims[cid] = {"claim_id": cid, "state": state, "items": items, "reason": "it broke"}
            self.live_max = max(self.live_max, sum(c["state"] == "queued" for c in self.claims.values()))
            return dict(self.claims[cid])
        cid = path.split("/")[3]
        claim = self.claims[cid]
        if path.endswith("/result"):
            return {"results": [_entry(i) for i in claim["items"]], "download": {}}
        if method == "DELETE":
            claim["state"] = "cancelled"
        elif claim["state"] == "queued":
            claim["state"] = "succeeded"
        return {k: v for k, v in claim.items() if k != "items"}


def _entry(item: Any) -> dict[str, Any]:
    if item == "bad":
        return {"ok": False, "error": {"type": "ValueError", "message": "no"}}
    return {"ok": True, "output": item * 2}


def pool(client: Client) -> Pool:
    p = Pool("embed", reconnect_s=30)
    p._conn = Connection(make_client=lambda: client)  # type: ignore[arg-type,return-value]
    return p


def test_a_submit_asked_again_carries_the_same_idempotency_key(monkeypatch):
    monkeypatch.setattr("time.sleep", lambda s: None)
    unreachable = EndpointUnreachable("http://127.0.0.1:1", "connection refused")
    busy = ApiError(503, {"error": {"code": "dependency_unavailable", "message": "later"}})
    client = Client(down=[])
    p = pool(client)
    p.submit([0])  # the plane answered once: from now on it is waited for
    client.down = [unreachable, busy]
    client.calls.clear()
    claim = p.submit([1, 2])
    keys = [key for method, _, _, key in client.calls if method == "POST"]
    assert len(keys) == 3
    assert len(set(keys)) == 1
    assert keys[0]
    assert claim.result() == [2, 4]


def test_a_plane_never_reached_is_refused_at_once():
    client = Client(down=[EndpointUnreachable("http://127.0.0.1:1", "connection refused")])
    with pytest.raises(EndpointUnreachable):
        pool(client).submit([1])
    assert len(client.calls) == 1


def test_a_refusal_is_not_asked_again_and_carries_the_apis_code():
    refused = ApiError(404, {"error": {"code": "not_found", "message": "no pool 'embed'"}})
    client = Client(down=[refused])
    with pytest.raises(ApiError) as raised:
        pool(client).submit([1])
    assert (raised.value.code, raised.value.status) == ("not_found", 404)
    assert len(client.calls) == 1


def test_map_yields_outputs_in_order_from_a_bounded_window_of_claims():
    client = Client()
    run = pool(client).map(range(25), batch_size=4, max_in_flight=2)
    assert list(run) == [i * 2 for i in range(25)]
    assert len(run.claims) == 7
    assert client.live_max <= 2


def test_a_map_that_ends_early_cancels_the_claims_still_in_flight():
    # Given a map whose second item raises, with room for four claims of one item in flight
    client = Client()
    run = pool(client).map([1, "bad", 3, 4, 5, 6, 7], batch_size=1, max_in_flight=4)
    assert next(run) == 2
    with pytest.raises(RemoteError):
        next(run)
    # Then the claims submitted behind it, still queued, are cancelled: nobody reads them
    states = {cid: c["state"] for cid, c in client.claims.items()}
    assert sorted(states.values()) == ["cancelled"] * 4 + ["succeeded"] * 2
    assert [c for c in run.claims[2:] if states[c.claim_id] != "cancelled"] == []
    # and a map the caller stops reading (close) cancels its own likewise
    client = Client()
    run = pool(client).map(range(10), batch_size=2, max_in_flight=3)
    assert next(run) == 0
    run.close()
    assert sorted(c["state"] for c in client.claims.values()) == ["cancelled"] * 3 + ["succeeded"]


def test_an_item_that_raised_and_a_claim_that_failed():
    client = Client()
    p = pool(client)
    with pytest.raises(RemoteError) as item:
        p.submit([1, "bad"]).result()
    assert (item.value.index, item.value.type) == (1, "ValueError")
    assert p.submit([1, "bad"]).result(return_exceptions=True)[0] == 2
    with pytest.raises(ClaimError) as claim:
        p.submit(["doom"]).result()
    assert claim.value.code == "claim_failed"


def test_an_item_that_is_not_json_is_refused_naming_it_before_anything_is_sent():
    client = Client()
    p = pool(client)
    for bad in ({1, 2}, float("nan"), b"bytes"):
        with pytest.raises(CliError) as err:
            p.submit(["fine", bad])
        assert err.value.code == "invalid_input"
        assert err.value.message.startswith("item 1 cannot be sent as JSON")
    assert client.calls == []


def test_a_map_names_an_item_that_is_not_json_by_its_index_in_the_maps_items():
    # Given a map whose seventh item cannot be sent, in its fourth batch of two
    client = Client()
    items = ["a", "b", "c", "d", "e", "f", {1, 2}, "h"]
    # When it runs
    with pytest.raises(CliError) as err:
        list(pool(client).map(items, batch_size=2))
    # Then the refusal names item 6, as the caller counts them, not its place in its batch
    assert err.value.code == "invalid_input"
    assert err.value.message.startswith("item 6 cannot be sent as JSON")
    assert err.value.details == {"item": 6}


def test_every_sdk_name_is_importable_from_calque_and_every_error_is_a_clierror():
    code = (
        "import sys, calque; from calque import ApiError, Claim, ClaimError, CliError, LogChunk, MapRun, "
        "Pool, RemoteError; import calque.sdk; "
        "assert set(calque.sdk.__all__) == calque._SDK, calque.sdk.__all__; "
        "assert issubclass(ApiError, CliError) and issubclass(ClaimError, CliError)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_more_items_than_one_request_may_carry_are_uploaded_however_small(monkeypatch):
    from calque.contracts.pools import MAX_ITEMS
    from calque.sdk import transfer

    client = Client()
    sent: list[Any] = []

    def upload(request, path, items):
        sent.append(list(items))
        return {"claim_id": "c-00000000000000ff", "sha256": "0" * 64, "bytes": 1, "items": len(sent[0])}

    monkeypatch.setattr(transfer, "upload_input", upload)
    claims: list[Any] = []
    monkeypatch.setattr(
        client,
        "request",
        lambda m, p, b=None, q=None, *, idempotency_key=None: claims.append(b) or {"claim_id": "c-1"},
    )
    pool(client).submit([0] * (MAX_ITEMS + 1))
    assert len(sent[0]) == MAX_ITEMS + 1
    assert claims == [
        {"input": {"claim_id": "c-00000000000000ff", "sha256": "0" * 64, "bytes": 1, "items": MAX_ITEMS + 1}}
    ]


def test_importing_calque_does_not_import_the_sdk():
    code = "import sys, calque; assert 'calque.sdk' not in sys.modules; from calque import Pool; print(Pool)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "calque.sdk.pools.Pool" in done.stdout


class QueuedClient(Client):
    """A claim that stays queued for ``polls`` reads while its pool's budget refuses its worker."""

    def __init__(self, polls: int) -> None:
        super().__init__()
        self.polls = polls
        self.pool_reads = 0

    def request(self, method: str, path: str, body: Any = None, query: Any = None, *, idempotency_key=None):
        if path == "/v1/pools/embed":
            self.pool_reads += 1
            out = {
                "action": "scale_out",
                "reason": "start 1",
                "waiting_for": "the fleet refused: no budget is set",
            }
            return {"name": "embed", "state": "active", "status": {"workers": [], "last_decision": out}}
        if method == "GET" and path.startswith("/v1/claims/") and not path.endswith("/result") and self.polls:
            self.polls -= 1
            self.calls.append((method, path, body, idempotency_key))
            return {
                **{k: v for k, v in self.claims[path.split("/")[3]].items() if k != "items"},
                "pool": "embed",
            }
        return super().request(method, path, body, query, idempotency_key=idempotency_key)


def test_a_wait_on_a_queued_claim_logs_why_it_waits(monkeypatch, caplog):
    clock = iter(range(0, 10_000, 4))  # each read of the clock 4 s on
    monkeypatch.setattr("time.monotonic", lambda: float(next(clock)))
    monkeypatch.setattr("time.sleep", lambda s: None)
    client = QueuedClient(polls=30)
    claim = pool(client).submit([1])
    with caplog.at_level("INFO", logger="calque.sdk"):
        assert claim.result() == [2]
    said = [r.getMessage() for r in caplog.records if r.name == "calque.sdk"]
    # said once (it did not change), after the first quiet seconds, with the pool's reason
    assert len(said) == 1, said
    assert said[0].startswith(f"claim {claim.claim_id} queued ")
    assert said[0].endswith(
        "no worker can start: the fleet refused: no budget is set (`calque pool status embed`)"
    )
    # the pool is read every half minute of the wait, not at every poll
    assert 1 < client.pool_reads < 10


@pytest.mark.parametrize(("field", "value"), [("batch_size", 0), ("batch_size", 2.5), ("batch_size", "10"),
                                              ("max_in_flight", -1), ("max_in_flight", True)])  # fmt: skip
def test_a_map_refuses_a_batch_size_or_window_that_is_not_a_whole_number(field, value):
    """Before, 2.5 passed the check and broke the map at its first item with islice's
    ValueError, and "10" raised a TypeError: neither a CliError with its code."""
    client = Client()
    with pytest.raises(CliError) as err:
        pool(client).map(["a", "b"], **{field: value})
    assert err.value.code == "invalid_input"
    assert err.value.message == f"{field} is a whole number, at least 1 (got {value!r})"
    assert client.calls == []


@pytest.mark.parametrize("one", ["the food was great", b"bytes", {"text": "hello"}])
def test_one_text_or_mapping_given_as_the_items_is_refused_not_split(one):
    """`submit("the food was great")` made a claim of 18 one-letter items, and a dict one of
    its keys: refused now, before anything is sent, saying to pass [item]."""
    client = Client()
    p = pool(client)
    for call in (lambda: p.submit(one), lambda: p.map(one)):
        with pytest.raises(CliError) as err:
            call()
        assert err.value.code == "invalid_input"
        assert err.value.message.endswith("for a single item, pass [item]")
    assert client.calls == []
    assert p.submit(["the food was great"]).result() == ["the food was great" * 2]  # one item

"""A claim's input of any size (uploaded first by a presigned PUT under the claim's own prefix,
checked when the claim is submitted), its result answered by a presigned GET, and its logs
read in pages of chunks after a point."""

from __future__ import annotations

import hashlib
import json

import pytest
from pydantic import ValidationError

from calque.contracts.pools import ClaimInput, ClaimInputUpload, ClaimSubmit
from calque.errors import Conflict, InvalidInput, NotFound
from calque.pools.claim_io import RESULT_INLINE_BYTES, owner_tag
from calque.pools.domain import claim_prefix
from tests.unit.pools.fakes import World
from tests.unit.pools.test_pools_service import ALICE, BOB, create, report, start_worker

pytestmark = pytest.mark.unit

DOC = json.dumps({"items": [{"n": i} for i in range(3)]}).encode()
SHA = hashlib.sha256(DOC).hexdigest()


@pytest.fixture
def world() -> World:
    w = World()
    create(w)
    return w


def _upload(world: World, who=ALICE, data: bytes = DOC, sha: str = SHA) -> str:
    """Ask for the URL, then PUT as S3 would store it (the metadata the URL signs)."""
    target = world.pools.input_upload(who, "textstats", ClaimInputUpload(sha256=sha, bytes=len(data)))
    assert target["key"] == f"{claim_prefix('textstats', target['claim_id'])}input.json"
    assert target["headers"]["x-amz-meta-sha256"] == sha
    world.objects.objects[target["key"]] = data
    world.objects.metadata[target["key"]] = {"sha256": sha, "owner": owner_tag(who.principal)}
    return str(target["claim_id"])


def _input(claim_id: str, data: bytes = DOC, sha: str = SHA) -> ClaimSubmit:
    return ClaimSubmit(input=ClaimInput(claim_id=claim_id, sha256=sha, bytes=len(data), items=3))


def test_an_uploaded_input_becomes_the_claims_manifest(world):
    cid = _upload(world)
    claim = world.pools.submit(ALICE, "textstats", _input(cid))
    assert (claim.claim_id, claim.items) == (cid, 3)
    pointer = world.queues.take(world.store.get_pool("textstats").queue_url)
    assert pointer["manifest"] == {
        "bucket": world.objects.bucket,
        "key": f"{claim_prefix('textstats', cid)}input.json",
        "sha256": SHA,
        "bytes": len(DOC),
    }


def test_an_input_not_uploaded_or_uploaded_by_another_is_refused(world):
    with pytest.raises(Conflict) as missing:
        world.pools.submit(ALICE, "textstats", _input("c-0123456789abcdef"))
    assert missing.value.code == "input_not_uploaded"
    cid = _upload(world, who=BOB)
    with pytest.raises(Conflict) as foreign:
        world.pools.submit(ALICE, "textstats", _input(cid))
    assert foreign.value.code == "input_not_uploaded"
    assert world.store.get_claim(cid) is None


def test_an_input_of_another_size_or_checksum_is_refused(world):
    cid = _upload(world)
    with pytest.raises(Conflict) as wrong:
        world.pools.submit(ALICE, "textstats", _input(cid, sha="0" * 64))
    assert wrong.value.code == "input_checksum_mismatch"
    with pytest.raises(Conflict):
        world.pools.submit(ALICE, "textstats", _input(cid, data=DOC + b" "))
    assert world.store.get_claim(cid) is None


def test_an_input_submits_one_claim_only(world):
    cid = _upload(world)
    world.pools.submit(ALICE, "textstats", _input(cid))
    with pytest.raises(Conflict) as again:
        world.pools.submit(ALICE, "textstats", _input(cid))
    assert again.value.code == "input_used"


def test_items_or_input_one_of_them():
    with pytest.raises(ValidationError):
        ClaimSubmit()
    with pytest.raises(ValidationError):
        ClaimSubmit(items=[1], input=ClaimInput(claim_id="c-0123456789abcdef", sha256=SHA, bytes=1, items=1))


def _succeeded(world: World, results: list, *, recorded: bool = True) -> str:
    wid, iid = start_worker(world)
    claim = world.pools.submit(ALICE, "textstats", ClaimSubmit(items=[1]))
    key = f"{claim_prefix('textstats', claim.claim_id)}attempt-1-{wid}/result.json"
    world.objects.objects[key] = data = json.dumps({"results": results}).encode()
    report(world, claim.claim_id, "started", wid, iid)
    summary = {"items_ok": 1, **({"result_sha256": hashlib.sha256(data).hexdigest()} if recorded else {})}
    report(world, claim.claim_id, "succeeded", wid, iid, result_key=key, summary=summary)
    return claim.claim_id


def test_a_small_result_is_inline_and_downloadable(world):
    cid = _succeeded(world, [{"ok": True, "output": 1}])
    out = world.pools.claim_result(ALICE, cid)
    assert out["results"] == [{"ok": True, "output": 1}]
    data = json.dumps({"results": [{"ok": True, "output": 1}]}).encode()
    assert out["download"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert "X-Amz-Signature" in out["download"]["url"]


@pytest.mark.parametrize(
    "stored", [b"not json", b"[1, 2, 3]", b'{"results": 5}', b'{"results": [{"ok": false}]}']
)
def test_a_small_result_changed_since_its_worker_wrote_it_is_refused_not_a_500(world, stored):
    """A stored result that is not JSON was a 500 internal_error; one that is JSON but not the
    document its worker wrote was passed on as the claim's entries ('results': 5, exit 0)."""
    # Given a claim whose stored result was replaced after its worker recorded its SHA-256
    cid = _succeeded(world, [{"ok": True, "output": 1}])
    key = world.store.get_claim(cid).result_key
    world.objects.objects[key] = stored
    # When its member asks for it
    with pytest.raises(Conflict) as err:
        world.pools.claim_result(ALICE, cid)
    # Then it is refused, saying the stored document is not the one written
    assert err.value.code == "result_checksum_mismatch"
    assert err.value.details["expected"] != err.value.details["sha256"]


def test_a_stored_result_that_is_no_result_document_is_refused_where_no_checksum_was_recorded(world):
    cid = _succeeded(world, [{"ok": True, "output": 1}], recorded=False)  # a worker that recorded none
    world.objects.objects[world.store.get_claim(cid).result_key] = b"[1, 2, 3]"
    with pytest.raises(Conflict) as err:
        world.pools.claim_result(ALICE, cid)
    assert err.value.code == "no_result"


def test_a_large_result_is_only_downloadable(world):
    cid = _succeeded(world, [{"ok": True, "output": "x" * (RESULT_INLINE_BYTES + 1)}])
    out = world.pools.claim_result(ALICE, cid)
    assert out["results"] is None
    assert out["download"]["bytes"] > RESULT_INLINE_BYTES
    with pytest.raises(NotFound):
        world.pools.claim_result(BOB, cid)


def test_logs_are_read_in_pages_after_a_point(world):
    claim = world.pools.submit(ALICE, "textstats", ClaimSubmit(items=[1]))
    logs = f"{claim_prefix('textstats', claim.claim_id)}logs/"
    world.objects.objects[f"{logs}0001-w-1/00000001-stdout.txt"] = b"hello\n"
    world.objects.objects[f"{logs}0001-w-1/00000002-stderr.txt"] = b"warn\n"
    world.objects.objects[f"{logs}junk"] = b"not a chunk"
    page = world.pools.claim_logs(ALICE, claim.claim_id)
    assert [(c["stream"], c["text"]) for c in page["chunks"]] == [("stdout", "hello\n"), ("stderr", "warn\n")]
    assert page["ended"] is False  # still queued: more may come
    world.objects.objects[f"{logs}0001-w-1/00000003-stdout.txt"] = b"more\n"
    nxt = world.pools.claim_logs(ALICE, claim.claim_id, after=page["next"])
    assert [c["text"] for c in nxt["chunks"]] == ["more\n"]
    world.pools.cancel_claim(ALICE, claim.claim_id)
    last = world.pools.claim_logs(ALICE, claim.claim_id, after=nxt["next"])
    assert (last["chunks"], last["ended"]) == ([], True)
    with pytest.raises(NotFound):
        world.pools.claim_logs(BOB, claim.claim_id)
    with pytest.raises(InvalidInput):
        world.pools.claim_logs(ALICE, claim.claim_id, after="../../x")
    # a point no page gave is refused too, not answered "ended, nothing more" (nor a page
    # from wherever it falls among the chunks' keys)
    for never_given in ("garbage", "0001-w-1", "9999-zzz", "0001-w-1/00000001-stdout.txt/x"):
        with pytest.raises(InvalidInput) as err:
            world.pools.claim_logs(ALICE, claim.claim_id, after=never_given)
        assert err.value.code == "invalid_next_token"

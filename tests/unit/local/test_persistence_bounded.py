"""What a restart reads and what the plane keeps follow the live state, not the history:
temporary files of a save a kill cut short are removed at start, SSM commands are kept
while running and for the latest few hundred once finished, each written when it changes,
and the DynamoDB journal is folded into the snapshot by size as well as by count."""

from __future__ import annotations

import json
from typing import Any

import pytest

from calque.local import moto_ssm, persistence
from calque.local.moto_ssm import SsmCommands
from calque.local.persistence import DynamoJournal, Persistence
from calque.local.restored import Restored
from calque.local.state import StateDir

pytestmark = pytest.mark.unit

REGION = "us-east-1"


def _backend(account: str):
    from moto.ssm.models import ssm_backends

    return ssm_backends[account][REGION]


def _send(account: str, n: int, *, status: str = "Success") -> list[str]:
    from moto.ssm.models import Command

    ids = []
    backend = _backend(account)
    for i in range(n):
        c = Command(account, backend_region=REGION, instance_ids=[f"i-{i:04x}"])
        c.invocations = [{"InstanceId": f"i-{i:04x}", "Status": status, "StandardOutputContent": "x" * 100}]
        c.status = "InProgress" if status in moto_ssm.RUNNING else status
        backend._commands.append(c)
        ids.append(c.command_id)
    return ids


def test_temporary_files_a_kill_left_mid_save_are_removed_at_start(tmp_path):
    aws = tmp_path / "aws"
    (aws / "s3" / "bucket").mkdir(parents=True)
    (aws / "sqs.json").write_text("{}")
    stale = [
        aws / ".sqs.json.140.tmp",
        aws / ".dynamodb.snapshot.json.77.tmp",
        aws / "s3" / "bucket" / ".ab.json.9.tmp",
    ]
    for f in stale:
        f.write_bytes(b"half a save")
    p = Persistence(aws, account="123456789012", region=REGION)
    p.attach(lambda *a, **k: (200, b"{}"))
    assert [f for f in stale if f.exists()] == []
    assert (aws / "sqs.json").exists()
    assert p.stale_temps == 3


def test_the_state_directorys_own_temporary_files_are_removed_at_start(tmp_path):
    state = StateDir(tmp_path / "state")
    state.ensure()
    state.initialize_people()
    (state.ssm_dir / "cmd-1").mkdir(parents=True)
    stale = [state.path / ".users.json.12.34.tmp", state.ssm_dir / "cmd-1" / "i-0abc.tmp"]
    for f in stale:
        f.write_text("half")
    kept = state.ssm_dir / "cmd-1" / "i-0abc.json"
    kept.write_text("{}")
    assert state.remove_stale_temps() == 2
    assert [f for f in stale if f.exists()] == []
    assert kept.exists()
    assert state.principal("alice") is not None


def test_ssm_keeps_running_commands_and_only_the_latest_finished_ones(tmp_path):
    account = "100000000001"
    old = _send(account, 30)
    recent = _send(account, 20)
    live = _send(account, 2, status="InProgress")
    store = SsmCommands(tmp_path, account=account, region=REGION, keep_finished=20)
    store.save()
    # moto itself forgets the old finished ones: memory follows what is live or recent
    assert [c.command_id for c in _backend(account)._commands] == recent + live
    assert {f.name for f in (tmp_path / "ssm").iterdir()} == {f"{c}.json" for c in recent + live}
    # and a restart brings back exactly those, in order, resuming the running ones
    again = "100000000002"
    out = Restored()
    SsmCommands(tmp_path, account=again, region=REGION, keep_finished=20).restore(out)
    assert [c.command_id for c in _backend(again)._commands] == recent + live
    assert sorted(cid for cid, _, _ in out.resumed_commands) == sorted(live)
    assert not set(old) & {c.command_id for c in _backend(again)._commands}


def test_one_changed_command_writes_one_file(tmp_path, monkeypatch):
    account = "100000000003"
    _send(account, 50)
    store = SsmCommands(tmp_path, account=account, region=REGION)
    store.save()
    written: list[str] = []
    real = moto_ssm.write_durably
    monkeypatch.setattr(
        moto_ssm, "write_durably", lambda path, data: (written.append(path.name), real(path, data))
    )
    # When one more command is sent, and then one host finishes one
    (new,) = _send(account, 1, status="Pending")
    store.save()
    cmd = _backend(account)._commands[-1]
    cmd.invocations = [{**cmd.invocations[0], "Status": "Success"}]
    store.save()
    # Then each save wrote that command's file only, not the 50 before it
    assert written == [f"{new}.json", f"{new}.json"]


def test_a_state_directory_with_every_command_ever_sent_is_cut_to_the_recent_ones(tmp_path):
    account = "100000000004"
    commands = [
        {
            "command_id": f"c-{n:05d}",
            "status": "Success",
            "invocations": [{"InstanceId": "i-1", "Status": "Success"}],
        }
        for n in range(1000)
    ]
    (tmp_path / "ssm.json").write_text(json.dumps({"format": 1, "commands": commands}))
    store = SsmCommands(tmp_path, account=account, region=REGION, keep_finished=100)
    out = Restored()
    store.restore(out)
    assert out.commands == 100
    assert _backend(account)._commands[-1].command_id == "c-00999"
    store.save()
    assert not (tmp_path / "ssm.json").exists()
    assert len(list((tmp_path / "ssm").iterdir())) == 100


def test_the_journal_is_compacted_by_size_as_well_as_by_count(tmp_path, monkeypatch):
    monkeypatch.setattr(persistence, "COMPACT_BYTES", 10_000)
    j = DynamoJournal(tmp_path)
    j.open()
    j.append("TransactWriteItems", json.dumps({"big": "x" * 4000}).encode())
    assert not j.due()
    j.append("TransactWriteItems", json.dumps({"big": "x" * 7000}).encode())
    assert j.due()
    j.write_snapshot({})
    assert not j.due()
    assert j.journal_file.read_bytes() == b""
    j.close()


def test_the_journal_is_read_a_record_at_a_time(tmp_path):
    j = DynamoJournal(tmp_path)
    j.open()
    for n in range(3):
        j.append("PutItem", json.dumps({"n": n}).encode())
    j.close()
    dropped: list[int] = []
    it = j.iter_records(dropped)
    assert json.loads(next(it)["body"]) == {"n": 0}  # a generator: nothing more is read yet
    assert [json.loads(r["body"])["n"] for r in it] == [1, 2]
    assert dropped == []


def test_only_the_latest_terminated_instances_are_kept(tmp_path, monkeypatch):
    import boto3
    from moto import mock_aws

    from calque.local import moto_state
    from calque.local.moto_state import ServiceSnapshots

    monkeypatch.setattr(moto_state, "KEEP_TERMINATED", 3)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        ec2 = boto3.client("ec2", region_name=REGION)
        image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        ids = [
            ec2.run_instances(ImageId=image, InstanceType="g6e.xlarge", MinCount=1, MaxCount=1)["Instances"][
                0
            ]["InstanceId"]
            for _ in range(8)
        ]
        ec2.terminate_instances(InstanceIds=ids[:6])  # six gone, two running
        ServiceSnapshots(tmp_path, account="123456789012", region=REGION).save_ec2()
    saved = [i["id"] for i in json.loads((tmp_path / "ec2.json").read_text())["instances"]]
    assert saved == ids[3:]  # the latest three terminated and both running


def test_the_journal_waits_for_as_many_writes_as_the_snapshot_holds_items(tmp_path, monkeypatch):
    """A compaction reads every table: with more items than COMPACT_EVERY it comes after as
    many writes as the last snapshot held items (and as many bytes as it had), not sooner."""
    monkeypatch.setattr(persistence, "COMPACT_EVERY", 3)
    j = DynamoJournal(tmp_path)
    j.open()
    j.write_snapshot({"t": [{"pk": {"S": str(n)}} for n in range(5)]})
    for _ in range(4):
        j.append("PutItem", b"{}")
    assert not j.due()
    j.append("PutItem", b"{}")
    assert j.due()
    j.write_snapshot({"t": [{"pk": {"S": "1"}}]})  # back to COMPACT_EVERY once the tables shrank
    for _ in range(2):
        j.append("PutItem", b"{}")
    assert not j.due()
    j.append("PutItem", b"{}")
    assert j.due()
    j.close()


def test_a_snapshot_is_written_as_its_items_come_and_whole_or_not_at_all(tmp_path):
    """The snapshot takes each table's items from an iterator (a compaction reads a page at
    a time), reads back as the tables were, and one cut short leaves the last snapshot."""
    j = DynamoJournal(tmp_path)
    j.open()
    tables = {
        "a": [{"pk": {"S": "ü"}}, {"pk": {"S": "2"}, "n": {"N": "1"}}],
        "b": [],
        "c": [{"pk": {"S": "3"}}],
    }
    j.seq = 7
    j.write_snapshot({name: iter(items) for name, items in tables.items()})
    assert json.loads(j.snapshot_file.read_bytes()) == {"format": 1, "seq": 7, "tables": tables}
    assert (j.snapshot_items, j.snapshot_bytes) == (3, j.snapshot_file.stat().st_size)

    def broken() -> Any:
        yield {"pk": {"S": "x"}}
        raise RuntimeError("the scan failed")

    j.append("PutItem", b"{}")
    with pytest.raises(RuntimeError):
        j.write_snapshot({"a": broken()})
    assert json.loads(j.snapshot_file.read_bytes())["tables"] == tables
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dynamodb.journal", "dynamodb.snapshot.json"]
    assert j.journal_file.read_bytes() != b""  # the journal still holds the write
    j.close()


def test_a_spot_instance_is_still_spot_after_a_restart(tmp_path, monkeypatch):
    # Given a spot and an on-demand instance, saved as a stopping plane saves them
    import boto3
    from moto import mock_aws

    from calque.local.moto_state import ServiceSnapshots

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    snapshots = ServiceSnapshots(tmp_path, account="123456789012", region=REGION)

    def launch(ec2: Any, **extra: Any) -> str:
        image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        run = ec2.run_instances(ImageId=image, InstanceType="g6.xlarge", MinCount=1, MaxCount=1, **extra)
        return str(run["Instances"][0]["InstanceId"])

    def lifecycles(ec2: Any) -> dict[str, str]:
        found = ec2.describe_instances()["Reservations"]
        return {
            i["InstanceId"]: i.get("InstanceLifecycle", "on-demand") for r in found for i in r["Instances"]
        }

    with mock_aws():
        ec2 = boto3.client("ec2", region_name=REGION)
        spot = launch(ec2, InstanceMarketOptions={"MarketType": "spot"})
        on_demand = launch(ec2)
        snapshots.save_ec2()
    # When the next plane restores them into a fresh EC2
    with mock_aws():
        ec2 = boto3.client("ec2", region_name=REGION)
        snapshots.restore_ec2(ec2, Restored())
        # Then the spot instance is spot still (EC2 interrupts it, the fleet charges its spot
        # rates), and the other on-demand
        assert lifecycles(ec2) == {spot: "spot", on_demand: "on-demand"}

"""`calque session ...`: consent, durations, and a check-out a person can act on."""

from __future__ import annotations

import json

import pytest

from calque.cli.errors import ApiError

pytestmark = pytest.mark.unit

GRANT = {
    "session_id": "s-0123456789abcdef",
    "user": "alice",
    "instance_id": "i-0abc",
    "slice_id": "g0-1g.24gb-0",
    "backend": "mig",
    "profile": "1g.24gb",
    "memory_gib": 24.0,
    "state": "live",
    "expires_at": "2099-01-01T00:00:00Z",
    "created_at": "2026-12-02T10:00:00Z",
    "env": {"CUDA_VISIBLE_DEVICES": "MIG-5e3f0000-aaaa"},
    "token": "tok-secret-123",
    "connect": {"ssm_command": "aws ssm start-session --target i-0abc"},
    "warnings": ["i-0abc runs on spot: a reclaim would end every session on it"],
}


def test_mps_without_consent_is_refused_before_any_request(api, cli):
    # Given a member asking for an MPS slot without the no-isolation consent
    # When they check out
    code, _, err = cli("session", "checkout", "--backend", "mps")
    # Then nothing is sent, the refusal names the flag, exit 1
    assert code == 1
    assert api.requests == []
    assert "--i-understand-shared-gpu-has-no-isolation" in err
    assert len(err.strip().splitlines()) == 1


def test_mps_refusal_with_json_output_is_the_error_document(api, cli):
    code, out, _ = cli("session", "checkout", "--backend", "mps", "--output", "json")
    assert code == 1
    assert json.loads(out)["error"]["code"] == "consent_required"


def test_mps_with_consent_is_sent_with_the_consent(api, cli):
    api.responses[("POST", "/v1/sessions")] = {**GRANT, "backend": "mps", "profile": "mps"}
    code, _, _ = cli("session", "checkout", "--backend", "mps", "--i-understand-shared-gpu-has-no-isolation")
    assert code == 0
    assert api.requests[0][2]["accept_shared_gpu_no_isolation"] is True
    assert api.requests[0][2]["backend"] == "mps"


@pytest.mark.parametrize(("ttl", "seconds"), [("90s", 90), ("15m", 900), ("2h", 7200), ("1h30m", 5400)])
def test_ttl_is_sent_in_seconds(api, cli, ttl, seconds):
    api.responses[("POST", "/v1/sessions")] = GRANT
    code, _, _ = cli(
        "session",
        "checkout",
        "--backend",
        "mig",
        "--profile",
        "1g.24gb",
        "--ttl",
        ttl,
        "--instance-id",
        "i-0abc",
    )
    assert code == 0
    assert api.requests[0][2] == {
        "instance_id": "i-0abc",
        "backend": "mig",
        "profile": "1g.24gb",
        "min_memory_gib": None,
        "ttl_seconds": seconds,
        "accept_shared_gpu_no_isolation": False,
    }


@pytest.mark.parametrize(
    "argv",
    [
        ["--backend", "mig", "--ttl", "2 hours"],
        ["--backend", "mig", "--ttl", "0s"],
        ["--backend", "mig", "--profile", "1g.24gb", "--min-memory-gib", "20"],
        ["--backend", "mig", "--min-memory-gib", "-1"],
        ["--backend", "exclusive"],
        ["--backend", "mig", "--instance-id", "bogus"],
        [],
    ],
)
def test_bad_checkout_flags_are_usage_errors(api, cli, argv):
    code, _, err = cli("session", "checkout", *argv)
    assert code == 2
    assert api.requests == []
    assert err


def test_checkout_shows_the_token_once_the_env_as_exports_and_how_to_connect(api, cli):
    api.responses[("POST", "/v1/sessions")] = GRANT
    code, out, _ = cli("session", "checkout", "--backend", "mig", "--min-memory-gib", "20")
    assert code == 0
    assert api.requests[0][2]["min_memory_gib"] == 20.0
    assert "Token: tok-secret-123" in out
    assert "shown once and never again" in out
    assert "export CUDA_VISIBLE_DEVICES=MIG-5e3f0000-aaaa" in out
    assert "aws ssm start-session --target i-0abc" in out
    assert "warning: i-0abc runs on spot" in out


def test_checkout_json_is_the_grant_with_the_contracts_fields(api, cli):
    api.responses[("POST", "/v1/sessions")] = GRANT
    code, out, _ = cli("session", "checkout", "--backend", "mig", "--output", "json")
    assert code == 0
    assert json.loads(out) == GRANT


def test_no_free_slice_is_a_one_line_refusal(api, cli):
    err_doc = {"error": {"code": "no_free_slice", "message": "no free mig slice fits", "details": {}}}
    api.responses[("POST", "/v1/sessions")] = ApiError(409, err_doc)
    code, out, err = cli("session", "checkout", "--backend", "mig", "--output", "json")
    assert code == 1
    assert json.loads(out) == err_doc
    assert err.strip() == "calque: error: no free mig slice fits"


def test_checkin_without_a_token_ends_the_members_own_session_by_their_identity(api, cli):
    api.responses[("DELETE", "/v1/sessions/s-0123456789abcdef")] = {**GRANT, "state": "ended"}
    code, out, _ = cli("session", "checkin", "s-0123456789abcdef")
    assert code == 0
    assert api.requests[0][:2] == ("DELETE", "/v1/sessions/s-0123456789abcdef")
    assert api.requests[0][2] == {"token": None, "force": False}
    assert "Checked in s-0123456789abcdef" in out


def test_extend_without_a_token_sends_none_and_says_the_time_left_as_the_api_counted_it(api, cli):
    api.responses[("GET", "/v1/sessions/s-0123456789abcdef")] = {
        **GRANT,
        "expires_at": "2098-01-01T00:00:00Z",
    }
    api.responses[("POST", "/v1/sessions/s-0123456789abcdef/extend")] = {**GRANT, "seconds_left": 5400}
    code, out, _ = cli("session", "extend", "s-0123456789abcdef", "--ttl", "1h")
    assert code == 0
    assert api.requests[-1][2] == {"ttl_seconds": 3600, "expected_expires_at": "2098-01-01T00:00:00Z"}
    assert "(in 1h30m)" in out


def test_show_tells_a_live_sessions_time_left(api, cli):
    api.responses[("GET", "/v1/sessions/s-0123456789abcdef")] = {
        **GRANT,
        "state": "live",
        "seconds_left": 3725,
    }
    code, out, _ = cli("session", "show", "s-0123456789abcdef")
    assert code == 0
    assert [line for line in out.splitlines() if line.startswith("time_left")] == ["time_left    1h2m5s"]


def test_checkin_sends_the_token(api, cli):
    api.responses[("DELETE", "/v1/sessions/s-0123456789abcdef")] = {**GRANT, "state": "ended"}
    code, out, _ = cli("session", "checkin", "s-0123456789abcdef", "--token", "tok-secret-123")
    assert code == 0
    assert api.requests[0][2] == {"token": "tok-secret-123", "force": False}
    assert "reclaimed" in out


def test_forced_checkin_sends_no_token(api, cli):
    api.responses[("DELETE", "/v1/sessions/s-0123456789abcdef")] = {**GRANT, "state": "ended"}
    code, _, _ = cli("session", "checkin", "s-0123456789abcdef", "--force", "--reason", "stuck job")
    assert code == 0
    assert api.requests[0][2] == {"token": None, "force": True, "reason": "stuck job"}


def test_extend_sends_the_added_seconds_and_the_expiry_it_extends_from(api, cli):
    # Given a session that expires at a known time
    api.responses[("GET", "/v1/sessions/s-0123456789abcdef")] = {
        **GRANT,
        "expires_at": "2098-01-01T00:00:00Z",
    }
    api.responses[("POST", "/v1/sessions/s-0123456789abcdef/extend")] = GRANT
    # When it is extended by an hour
    code, out, _ = cli("session", "extend", "s-0123456789abcdef", "--token", "t", "--ttl", "1h")
    # Then the extend names that expiry, so a replay cannot add the hour twice
    assert code == 0
    assert api.requests[-1][2] == {
        "token": "t",
        "ttl_seconds": 3600,
        "expected_expires_at": "2098-01-01T00:00:00Z",
    }
    assert "2099-01-01T00:00:00Z" in out


@pytest.mark.parametrize(
    ("args", "query"),
    [
        ((), None),
        (("--ended",), {"state": "ended"}),
        (("--state", "any"), {"state": "any"}),
        (("--user", "bob", "--ended"), {"state": "ended", "user": "bob"}),
    ],
)
def test_list_filters_are_sent_as_asked(api, cli, args, query):
    api.responses[("GET", "/v1/sessions")] = []
    code, _, _ = cli("session", "list", *args)
    assert code == 0
    assert api.requests[0][3] == query


def test_list_all_and_user_together_is_a_usage_error(api, cli):
    code, _, _ = cli("session", "list", "--all", "--user", "bob")
    assert code == 2
    assert api.requests == []


def test_list_all_asks_for_everyone(api, cli):
    api.responses[("GET", "/v1/sessions")] = [GRANT]
    code, out, _ = cli("session", "list", "--all")
    assert code == 0
    assert api.requests[0][3] == {"all": "true"}
    assert "s-0123456789abcdef" in out
    assert "alice" in out


def test_list_json_is_an_array(api, cli):
    api.responses[("GET", "/v1/sessions")] = []
    code, out, _ = cli("session", "list", "--output", "json")
    assert code == 0
    assert json.loads(out) == []
    assert api.requests[0][3] is None


def test_list_max_items_prints_at_most_that_many(api, cli):
    api.responses[("GET", "/v1/sessions")] = [{"session_id": f"s-{n:016x}"} for n in range(5)]
    code, out, _ = cli("session", "list", "--max-items", "2", "--output", "json")
    assert code == 0
    assert [s["session_id"] for s in json.loads(out)] == ["s-0000000000000000", "s-0000000000000001"]
    assert cli("session", "list", "--max-items", "0")[0] == 2


def test_checkout_profile_is_the_slice_profile_and_the_aws_profile_goes_first(api, cli):
    # Given the contract's two meanings of --profile (AWS profile globally, slice profile on checkout)
    api.responses[("POST", "/v1/sessions")] = GRANT
    # When a member names both
    code, _, _ = cli("--profile", "alice", "session", "checkout", "--backend", "mig", "--profile", "1g.24gb")
    # Then the request is signed as alice and asks for a 1g.24gb slice
    assert code == 0
    assert api.profile == "alice"
    assert api.requests[0][2]["profile"] == "1g.24gb"


def _catalog_mig_profiles() -> list[str]:
    from calque import catalog

    return sorted({p.name for card in catalog.cards() for p in card.mig_profiles})


@pytest.mark.parametrize("profile", _catalog_mig_profiles())
def test_checkout_takes_every_mig_profile_the_catalog_has(api, cli, profile):
    # Given a MIG profile the catalog lists (1g.24gb-me and 1g.24gb+me.all among them)
    api.responses[("POST", "/v1/sessions")] = GRANT
    # When a member checks out a slice of it
    code, _, err = cli("--profile", "alice", "session", "checkout", "--backend", "mig", "--profile", profile)
    # Then it is asked for, not refused as "not a slice profile"
    assert code == 0, err
    assert api.requests[0][2]["profile"] == profile


def test_other_session_commands_take_the_aws_profile_after_the_command(api, cli):
    api.responses[("GET", "/v1/sessions")] = []
    code, _, _ = cli("session", "list", "--profile", "bob")
    assert code == 0
    assert api.profile == "bob"


def test_an_aws_profile_given_after_checkout_is_caught_with_a_hint(api, cli):
    # Given someone who puts their AWS profile after the command, where --profile is the slice's
    code, _, err = cli("session", "checkout", "--backend", "mig", "--profile", "alice")
    # Then nothing is sent and the usage error says where the AWS profile goes
    assert code == 2
    assert api.requests == []
    assert "calque --profile NAME session checkout" in err


def test_session_show_says_whether_the_hosts_account_is_ready_and_why_not(api, cli):
    # Given a session whose grant on the host failed
    failed = {
        **{k: v for k, v in GRANT.items() if k not in ("token", "connect", "warnings")},
        "host_access": {
            "state": "failed",
            "account": "calque-0123456789ab",
            "reason": "host_busy: lock held",
        },
    }
    api.responses[("GET", "/v1/sessions/s-0123456789abcdef")] = failed
    # When the member shows it
    code, out, _ = cli("session", "show", "s-0123456789abcdef")
    # Then the account and the agent's reason are there
    assert code == 0
    line = next(x for x in out.splitlines() if x.startswith("host_access"))
    assert "failed (calque-0123456789ab): host_busy: lock held" in line


# ---- why a session ended: the admin's reason on the member's own view ----------------------------


def _forced_by_an_admin(reason: str) -> tuple[dict, dict]:
    """A session an admin forced the check-in of (with ``reason``) and one still live, as the real
    tenancy service answers them to their member."""
    from calque.contracts.tenancy import CheckinRequest, CheckoutRequest
    from tests.unit.tenancy.conftest import ADMIN, World, member

    world = World()
    world.ready_host()
    alice = member("alice")
    forced = world.tenancy.checkout(alice, CheckoutRequest(backend="mig"))
    live = world.tenancy.checkout(alice, CheckoutRequest(backend="mig"))
    world.tenancy.checkin(ADMIN, forced.session_id, CheckinRequest(force=True, reason=reason))
    return (
        world.tenancy.get_session(alice, forced.session_id).model_dump(mode="json"),
        world.tenancy.get_session(alice, live.session_id).model_dump(mode="json"),
    )


def test_session_show_tells_the_member_why_an_admin_ended_their_session(api, cli):
    # Given alice's session whose check-in an admin forced, for a runaway job
    ended, _ = _forced_by_an_admin("runaway job: 8 GPUs at 0% for 6h")
    api.responses[("GET", f"/v1/sessions/{ended['session_id']}")] = ended
    # When alice shows it
    code, out, _ = cli("session", "show", ended["session_id"])
    # Then she reads forced, and the admin's words
    assert code == 0
    fields = dict(x.split(None, 1) for x in out.splitlines() if len(x.split(None, 1)) == 2 and x[0] != " ")
    assert fields["end_reason"] == "forced"
    assert fields["end_note"] == "runaway job: 8 GPUs at 0% for 6h"
    # And with --output json, scripts read it under end_note
    code, out, _ = cli("--output", "json", "session", "show", ended["session_id"])
    assert (code, json.loads(out)["end_note"]) == (0, "runaway job: 8 GPUs at 0% for 6h")


def test_session_list_adds_the_note_column_when_a_session_listed_has_one(api, cli):
    # Given alice's ended sessions, one forced with a reason typed over two lines
    ended, live = _forced_by_an_admin("runaway job\nsee ticket 42")
    api.responses[("GET", "/v1/sessions")] = [ended]
    # When she lists them
    code, out, _ = cli("session", "list", "--ended")
    # Then the table has a NOTE column holding the reason, on the session's one row
    assert code == 0
    header, row = out.splitlines()
    assert header.split()[-3:] == ["LEFT", "END_REASON", "NOTE"]
    assert row.startswith(ended["session_id"])
    # nothing left of an ended session; why it ended under END_REASON, not under LEFT
    assert row.endswith("  -     forced      runaway job see ticket 42")
    # And her live sessions' table has neither column
    api.responses[("GET", "/v1/sessions")] = [live]
    code, out, _ = cli("session", "list")
    assert code == 0
    assert out.splitlines()[0].split()[-1] == "LEFT"
    assert "end_note" not in out


def test_a_note_with_terminal_control_characters_reaches_the_members_terminal_as_plain_text(api, cli):
    # Given a session ended with a reason holding escape sequences (clear the screen, retitle
    # the terminal) and a right-to-left override
    ended, _ = _forced_by_an_admin("runaway\x1b[2J\x1b]0;pwned\x07 job\u202e42")
    api.responses[("GET", "/v1/sessions")] = [ended]
    api.responses[("GET", f"/v1/sessions/{ended['session_id']}")] = ended
    # When its member lists and shows it
    _, listed, _ = cli("session", "list", "--ended")
    _, shown, _ = cli("session", "show", ended["session_id"])
    # Then no control character reaches the terminal: the words are kept, the controls are not
    for out in (listed, shown):
        assert not [c for c in out if not c.isprintable() and c != "\n"], repr(out)
    assert listed.splitlines()[1].endswith("runaway [2J ]0;pwned job 42")
    # And the JSON document keeps the note as recorded (escaped by JSON itself)
    _, out, _ = cli("--output", "json", "session", "show", ended["session_id"])
    assert json.loads(out)["end_note"] == "runaway\x1b[2J\x1b]0;pwned\x07 job\u202e42"


def test_gpus_n_asks_for_whole_cards_and_the_grant_names_every_card(api, cli):
    cards = ["g0-whole", "g1-whole"]
    api.responses[("POST", "/v1/sessions")] = {**GRANT, "backend": "exclusive", "slice_ids": cards}
    code, out, _ = cli("session", "checkout", "--backend", "gpu", "--gpus", "2", "--ttl", "1h")
    assert code == 0
    assert api.requests[0][2]["backend"] == "gpu"
    assert api.requests[0][2]["gpus"] == 2
    assert "slices g0-whole, g1-whole" in out


def test_one_card_sends_no_gpus_and_several_need_backend_gpu(api, cli):
    api.responses[("POST", "/v1/sessions")] = GRANT
    assert cli("session", "checkout", "--backend", "gpu")[0] == 0
    assert "gpus" not in api.requests[0][2]
    code, _, err = cli("session", "checkout", "--backend", "mig", "--gpus", "2")
    assert code == 2
    assert "--backend gpu" in err
    assert len(api.requests) == 1


def test_a_check_out_of_several_cards_speaks_of_the_cards():
    from calque.cli.commands.session import render_grant

    one = render_grant(GRANT)
    assert "the slice is reclaimed then, whatever still runs on it." in one
    assert "Bind a process to the slice:" in one
    several = render_grant(
        {**GRANT, "slice_ids": ["g0-whole", "g1-whole"], "backend": "exclusive", "profile": "whole"}
    )
    assert "slices g0-whole, g1-whole" in several
    assert "its cards are reclaimed then, whatever still runs on them." in several
    assert "Bind a process to the cards:" in several


@pytest.mark.parametrize("n", ["0", "-1", "-8"])
def test_gpus_below_one_is_refused_saying_one_or_more(api, cli, n):
    # --gpus -1 used to say "must be 0 or more", and 0 is refused too: the bound said is the flag's
    code, _, err = cli("session", "checkout", "--backend", "gpu", "--gpus", n)
    assert code == 2
    assert api.requests == []
    assert f"argument --gpus: '{n}' must be 1 or more" in err


def test_checkin_of_several_cards_names_every_card_reclaimed(api, cli):
    # it said "slice g0-whole ... is reclaimed" of a session holding three cards
    ended = {
        **GRANT,
        "state": "ended",
        "slice_id": "g0-whole",
        "slice_ids": ["g0-whole", "g1-whole", "g3-whole"],
    }
    api.responses[("DELETE", "/v1/sessions/s-0123456789abcdef")] = ended
    code, out, _ = cli("session", "checkin", "s-0123456789abcdef")
    assert code == 0
    assert "slices g0-whole, g1-whole, g3-whole on i-0abc are reclaimed on the host" in out
    api.responses[("DELETE", "/v1/sessions/s-0123456789abcdef")] = {**GRANT, "state": "ended"}
    code, out, _ = cli("session", "checkin", "s-0123456789abcdef")
    assert "slice g0-1g.24gb-0 on i-0abc is reclaimed on the host" in out


def test_show_of_several_cards_lists_every_card(api, cli):
    cards = ["g0-whole", "g1-whole", "g2-whole"]
    api.responses[("GET", "/v1/sessions/s-0123456789abcdef")] = {
        **GRANT,
        "slice_id": "g0-whole",
        "slice_ids": cards,
    }
    code, out, _ = cli("session", "show", "s-0123456789abcdef")
    assert code == 0
    assert "slice_ids    g0-whole, g1-whole, g2-whole" in out
    api.responses[("GET", "/v1/sessions/s-0123456789abcdef")] = {**GRANT, "slice_ids": ["g0-1g.24gb-0"]}
    code, out, _ = cli("session", "show", "s-0123456789abcdef")
    assert "slice_ids" not in out


def test_list_user_that_is_not_a_user_name_is_a_usage_error(api, cli):
    # it reached the API and came back as "String should match pattern '^(?:[0-9]{12}:)?...'"
    code, _, err = cli("session", "list", "--user", "bad user")
    assert code == 2
    assert api.requests == []
    assert "'bad user' is not a user name" in err
    assert "pattern" not in err


def test_a_grant_says_to_connect_with_calque_and_names_the_aws_cli_line_only_where_it_works():
    from calque.cli.commands.session import render_grant

    # On AWS: calque's own connect first, then the AWS CLI's command for those who use it
    aws = render_grant(GRANT).splitlines()
    at = aws.index("Connect:")
    assert aws[at + 1].split() == [
        "calque", "session", "connect", "s-0123456789abcdef", "(or", "run", "one", "command:",
        "calque", "session", "exec", "s-0123456789abcdef", "--", "CMD)",
    ]  # fmt: skip
    assert aws[at + 2] == "  or with the AWS CLI: aws ssm start-session --target i-0abc"
    # On the local plane there is no Session Manager: no `aws ssm` line that could not work
    local = render_grant(GRANT, local=True)
    assert "calque session connect s-0123456789abcdef" in local
    assert "aws ssm" not in local
    assert "simulated" in local

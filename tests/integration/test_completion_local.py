"""Live values on TAB: a real bash and zsh, with the completion script loaded as documented,
complete what the running local plane holds (groups, asked of its API) and the plane's own
profiles; a name the plane does not hold is not offered. (The shared plane gets no host
here: another file's check-out could land on it.)"""

from __future__ import annotations

import pytest

from tests.completion_shells import CompletingShell, calque_on_path, shell_missing

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def groups(local_plane):
    """Groups the plane holds for the shells to complete."""
    for name in ("tab-lab", "tab-course"):
        done = local_plane.cli("group", "create", name, profile="admin")
        assert done.returncode == 0, done.stderr
    return ["tab-course", "tab-lab"]


@pytest.mark.parametrize(
    "shell",
    [
        pytest.param(n, marks=pytest.mark.skipif(shell_missing(n) is not None, reason=str(shell_missing(n))))
        for n in ("bash", "zsh")
    ],
)
def test_the_shell_completes_what_the_plane_holds(shell, local_plane, groups, tmp_path):
    # Given a shell whose CLI finds the plane (its state directory named, as after `make run`)
    env = calque_on_path(tmp_path, local_plane.env())
    with CompletingShell(shell, env) as sh:
        # When TAB is pressed where a group or a profile stands
        offered = sh.complete("calque group show tab-").offered
        one = sh.complete("calque group limits tab-l").offered
        profiles = sh.complete("calque --profile ca").offered
        none = sh.complete("calque group show no-such-").offered
    # Then the shell is offered the plane's own, the groups asked of its API
    assert offered == groups
    assert one == ["tab-lab"]
    assert profiles == ["carol"]
    assert none == []

"""Shell completion: ``calque completion bash|zsh`` prints a script that asks the hidden
``calque __complete --cword N -- WORDS...`` for the candidates of word N: commands, flags,
an option's choices, and live values (session ids, host ids, pool and group names from the
API with a short timeout; instance types, cards and MIG profiles from the catalog). It prints
one candidate a line and never fails: anything that goes wrong completes nothing."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Sequence
from typing import Any

API_TIMEOUT_S = 2
# Global options whose value the live look-ups need.
_CONTEXT_OPTIONS = {
    "--endpoint": "endpoint",
    "--profile": "profile",
    "--region": "region",
    "--config-name": "config_name",
    "--state-dir": "state_dir",
}

BASH = """# calque completion for bash: eval "$(calque completion bash)" (e.g. in ~/.bashrc)
_calque_complete() {
    local IFS=$'\\n'
    local words=("${COMP_WORDS[@]}")
    COMPREPLY=($(compgen -W "$(calque __complete --cword "$COMP_CWORD" -- "${words[@]}" 2>/dev/null)" \\
        -- "${COMP_WORDS[COMP_CWORD]}"))
}
complete -o default -F _calque_complete calque
"""

ZSH = """#compdef calque
# calque completion for zsh: eval "$(calque completion zsh)" in ~/.zshrc, after compinit;
# or save it as _calque in a directory of $fpath (before compinit runs)
_calque() {
    local -a candidates
    candidates=(${(f)"$(calque __complete --cword $((CURRENT - 1)) -- "${words[@]}" 2>/dev/null)"})
    compadd -a candidates
}
if [[ $funcstack[1] == _calque ]]; then
    _calque "$@"
else
    compdef _calque calque
fi
"""

SCRIPTS = {"bash": BASH, "zsh": ZSH}


def complete_main(argv: Sequence[str], build_parser: Callable[[], argparse.ArgumentParser]) -> int:
    """``__complete --cword N -- calque WORD...``: candidates on stdout, exit 0 whatever happens."""
    import sys

    try:
        args = list(argv)
        cword = int(args[args.index("--cword") + 1])
        words = args[args.index("--") + 1 :]
        for candidate in candidates(words, cword, build_parser()):
            sys.stdout.write(candidate + "\n")
    except Exception:  # noqa: S110 - completion fails silently: the shell shows nothing
        pass
    return 0


def candidates(words: Sequence[str], cword: int, parser: argparse.ArgumentParser) -> list[str]:
    """What may stand at ``words[cword]`` (``words[0]`` is the program) among ``parser``'s
    commands, filtered by its prefix."""
    words = list(words) + [""] * max(0, cword + 1 - len(words))
    current = words[cword]
    before = words[1:cword]
    leaf, positionals_given, pending = _walk(parser, before)
    if pending is not None:  # the word is an option's value
        found = _values(pending, before)
    elif current.startswith("-"):
        found = _flags(leaf, parser)
    else:
        # a command's verbs stand only right after it: not after an unknown word, say
        verbs = _subcommands(leaf) if positionals_given == 0 else []
        found = verbs + _positional_values(leaf, positionals_given, before)
        subs = _subparsers(leaf)
        fallback = getattr(subs, "fallback", None) if subs is not None else None
        if subs is not None and fallback is not None and positionals_given == 0:
            found += _positional_values(subs.choices[fallback], 0, before)  # `calque catalog TYPE`
    return sorted({c for c in found if c.startswith(current)})


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:  # type: ignore[type-arg, unused-ignore]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def _option(
    parser: argparse.ArgumentParser, top: argparse.ArgumentParser, word: str
) -> argparse.Action | None:
    flag = word.split("=", 1)[0]
    for p in (parser, top):
        if flag in p._option_string_actions:
            return p._option_string_actions[flag]
    return None


def _walk(
    top: argparse.ArgumentParser, words: Sequence[str]
) -> tuple[argparse.ArgumentParser, int, argparse.Action | None]:
    """(the deepest command parser the words reach, positionals given to it, the option
    still waiting for its value or None)."""
    parser, positionals, pending = top, 0, None
    for word in words:
        if pending is not None:
            pending = None
            continue
        if word.startswith("-") and word != "-":
            action = _option(parser, top, word)
            if action is not None and action.nargs != 0 and "=" not in word:
                pending = action
            continue
        subs = _subparsers(parser)
        if subs is not None and word in subs.choices and positionals == 0:
            parser = subs.choices[word]
            continue
        positionals += 1
    return parser, positionals, pending


def _subcommands(parser: argparse.ArgumentParser) -> list[str]:
    subs = _subparsers(parser)
    return [n for n in subs.choices if not n.startswith("_")] if subs is not None else []


def _flags(parser: argparse.ArgumentParser, top: argparse.ArgumentParser) -> list[str]:
    out: list[str] = []
    for p in (parser, top):
        for action in p._actions:
            out.extend(s for s in action.option_strings if s.startswith("--"))
    return out


def _positional_values(parser: argparse.ArgumentParser, given: int, before: Sequence[str]) -> list[str]:
    positionals = [
        a for a in parser._actions if not a.option_strings and not isinstance(a, argparse._SubParsersAction)
    ]
    if not positionals:
        return []
    action = positionals[min(given, len(positionals) - 1)]
    if given >= len(positionals) and action.nargs not in ("+", "*"):
        return []
    return _values(action, before, command=parser.prog.split()[1:])


def _values(
    action: argparse.Action, before: Sequence[str], command: Sequence[str] | None = None
) -> list[str]:
    if action.choices:
        return [str(c) for c in action.choices if not str(c).startswith("_")]
    source = _source_for(
        action, list(command) if command is not None else [w for w in before if not w.startswith("-")]
    )
    return list(source(before)) if source is not None else []


def _source_for(
    action: argparse.Action, command: Sequence[str]
) -> Callable[[Sequence[str]], Iterable[str]] | None:
    flag = action.option_strings[0] if action.option_strings else None
    dest = action.dest
    if dest in ("instance_type",) or flag == "--instance-type":
        return lambda _b: _catalog("types")
    if flag == "--card":
        return lambda _b: _catalog("cards")
    if flag in ("--mig",) or dest == "slice_profile":
        return lambda _b: _catalog("profiles")
    if flag == "--config-name":
        return lambda _b: _configs()
    if flag == "--profile" and action.dest == "profile":
        return _aws_profiles
    if dest == "session_id":
        return lambda b: _live(b, "/v1/sessions", "session_id")
    if dest == "instance_id" or flag == "--instance-id":
        return lambda b: _live(b, "/v1/hosts", "instance_id")
    if flag == "--pool" or (dest == "name" and command[:1] == ["pool"]):
        return lambda b: _live(b, "/v1/pools", "name")
    if flag == "--group" or (dest == "name" and command[:1] == ["group"]):
        return lambda b: _live(b, "/v1/groups", "name")
    return None


def _catalog(what: str) -> list[str]:
    from calque import catalog

    if what == "types":
        return [t.name for t in catalog.instance_types()]
    if what == "cards":
        return [c.name for c in catalog.cards()]
    return sorted({p.name for c in catalog.cards() for p in c.mig_profiles})


def _configs() -> list[str]:
    from calque.cli import config

    return list(config.all_configs())


def _aws_profiles(before: Sequence[str]) -> list[str]:
    """The running local plane's people when there is one, else the AWS config's profiles."""
    ctx = _context(before)
    try:
        state = ctx.local_state()
        if state.running_pid() is not None:
            return [p.profile for p in state.people()]
    except Exception:  # noqa: S110 - fall back to the AWS profiles
        pass
    import botocore.session

    return list(botocore.session.Session().available_profiles)


def _context(before: Sequence[str]) -> Any:
    from calque.cli.context import Context

    given: dict[str, str] = {}
    words = list(before)
    for i, word in enumerate(words):
        flag, eq, value = word.partition("=")
        if flag in _CONTEXT_OPTIONS:
            if eq:
                given[_CONTEXT_OPTIONS[flag]] = value
            elif i + 1 < len(words):
                given[_CONTEXT_OPTIONS[flag]] = words[i + 1]
    if "session" in words and "checkout" in words:
        given.pop("profile", None)  # there --profile after the command is the slice's
    return Context.from_args(argparse.Namespace(**given))


def _live(before: Sequence[str], path: str, key: str) -> list[str]:
    """``key`` of each item the API lists at ``path``, asked with a short timeout and no retry."""
    from calque.cli.client import ApiClient

    ctx = _context(before)
    creds, region = ctx.credentials_and_region()
    client = ApiClient(ctx.endpoint, creds, region, timeout_s=API_TIMEOUT_S, retries=0)
    items = client.request("GET", path)
    return [str(i[key]) for i in items if isinstance(i, dict) and i.get(key)]

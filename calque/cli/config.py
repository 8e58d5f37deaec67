"""Named configurations, as the AWS CLI keeps them: ``~/.calque/config`` (INI), one section
per configuration name, each with ``endpoint``, ``region`` and ``profile``.

    [default]
    endpoint = https://abc123.execute-api.us-east-1.amazonaws.com/prod
    region = us-east-1
    profile = research

    [local]
    endpoint = http://127.0.0.1:8123

Which configuration: ``--config-name``, else ``CALQUE_CONFIG``, else ``default``. Where the
file is: ``CALQUE_CONFIG_FILE``, else ``~/.calque/config``. A value given by flag or
environment wins over the file's (calque.cli.context resolves the order).
"""

from __future__ import annotations

import configparser
import os
import re
from pathlib import Path

from calque.cli.errors import CliError, UsageError

CONFIG_FILE_ENV = "CALQUE_CONFIG_FILE"
CONFIG_NAME_ENV = "CALQUE_CONFIG"
DEFAULT_CONFIG_FILE = Path("~/.calque/config")
DEFAULT_NAME = "default"
KEYS = ("endpoint", "region", "profile")
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def config_file() -> Path:
    return Path(os.environ.get(CONFIG_FILE_ENV) or DEFAULT_CONFIG_FILE).expanduser()


def config_name(given: str | None) -> tuple[str, str]:
    """(the configuration's name, where the name came from)."""
    if given:
        return _checked_name(given, "--config-name"), "--config-name"
    env = os.environ.get(CONFIG_NAME_ENV)
    if env:
        return _checked_name(env, CONFIG_NAME_ENV), CONFIG_NAME_ENV
    return DEFAULT_NAME, "default"


def _checked_name(name: str, source: str) -> str:
    if not _NAME.fullmatch(name):
        raise UsageError(
            f"{source} {name!r} is not a configuration name: letters, digits, '.', '_' or '-', at most 64",
            code="invalid_config_name",
            details={"field": source, "name": name},
        )
    return name


def check_key(key: str) -> str:
    if key not in KEYS:
        from calque.cli.helptext import did_you_mean

        raise UsageError(
            f"no configuration key {key!r}{did_you_mean(key, KEYS)}: one of {', '.join(KEYS)}",
            code="invalid_config_key",
            details={"field": "key", "key": key, "valid": list(KEYS)},
        )
    return key


def _read(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, default_section="__none__")
    if path.exists():
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, UnicodeDecodeError) as exc:
            raise CliError(
                f"cannot read {path}: {str(exc).splitlines()[0]}; fix or remove it",
                code="invalid_config_file",
                details={"path": str(path)},
            ) from None
    return parser


def load(name: str, path: Path | None = None) -> dict[str, str]:
    """The values configuration ``name`` sets (only those it sets; empty for no such section)."""
    parser = _read(path or config_file())
    if not parser.has_section(name):
        return {}
    return {k: v for k, v in parser.items(name) if k in KEYS and v.strip()}


def all_configs(path: Path | None = None) -> dict[str, dict[str, str]]:
    parser = _read(path or config_file())
    return {s: {k: v for k, v in parser.items(s) if k in KEYS} for s in parser.sections()}


def save(name: str, values: dict[str, str | None], path: Path | None = None) -> dict[str, str]:
    """Set (a value) or clear (None or '') keys of configuration ``name``; returns what it holds
    now. The file is replaced atomically and readable by its owner only (it names accounts)."""
    path = path or config_file()
    parser = _read(path)
    if not parser.has_section(name):
        parser.add_section(name)
    for key, value in values.items():
        check_key(key)
        if value is None or value == "":
            parser.remove_option(name, key)
        else:
            parser.set(name, key, value)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        parser.write(out)
    os.replace(tmp, path)
    return {k: v for k, v in parser.items(name) if k in KEYS}

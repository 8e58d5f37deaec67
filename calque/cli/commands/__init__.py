"""The command modules, one per group: ``calque/cli/commands/<group>.py``.

The protocol a command module follows:

- It exposes ``register(subparsers)``, where ``subparsers`` is the top-level
  ``argparse`` sub-parsers action. It adds its parsers there (or under an existing
  group through ``calque.cli.main.command_group(subparsers, "local")``) and sets
  ``func`` on each leaf: ``parser.set_defaults(func=_checkout)``. The global
  options (--endpoint, --profile, --region, --output, --debug) are added to every
  parser automatically and may come before or after the command.
- A command function has the signature ``func(ctx, args) -> None`` (``ctx`` is a
  ``calque.cli.context.Context``). It only reads ``args`` and forwards to ONE
  ``do_<verb>(ctx, ...)`` function with plain keyword arguments; heavy imports
  (boto3, pydantic models, the local plane) happen inside ``do_<verb>``, so
  ``calque --help`` stays fast.
- ``do_<verb>`` calls the API through ``ctx.client().request(method, path, body,
  query)`` and prints through ``ctx.emit(data, columns=...)``: a table for people,
  exactly one JSON document with ``--output json``. An expected failure raises
  ``calque.cli.errors.CliError`` (or lets ``ApiError`` / ``calque.errors.CalqueError``
  propagate): exit 1 with one line on stderr, and with ``--output json`` the error
  document on stdout. Durations parse with ``calque.cli.durations.duration_arg``.

To add a group, add its module name to COMMAND_MODULES; order is the order of
``calque --help``, and a module that extends another's group comes after it.
"""

from __future__ import annotations

COMMAND_MODULES: list[str] = [
    "configure",
    "whoami",
    "local",
    "host",
    "session",
    "quota",
    "demo",
    "simulate",
    "pool",
    "claim",
    "usage",
    "group",
]

# The fleet: `host acquire | release | acquisitions` (after "host") and `budget`.
COMMAND_MODULES += ["fleet", "budget"]

# The catalog, the API's own document, and the local plane's terminate and reset.
COMMAND_MODULES += ["catalog", "api", "local_admin", "completion"]

# A live page of the fleet (calque/console/).
COMMAND_MODULES += ["console"]

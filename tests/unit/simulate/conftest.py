from tests.unit.economics_cli.conftest import api, cli  # noqa: F401  (the CLI against a fake API)

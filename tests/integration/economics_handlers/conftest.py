from tests.integration.tenancy_handlers.conftest import _moto, api  # noqa: F401  (fixtures)

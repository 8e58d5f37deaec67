"""Health, identity and the OpenAPI document."""

from __future__ import annotations

from aws_lambda_powertools.event_handler.api_gateway import Router

import calque
from calque.contracts.common import Health, WhoAmI
from functions.api.context import caller

router = Router()


@router.get("/health")
def health() -> Health:
    return Health(version=calque.__version__)


@router.get("/whoami")
def whoami() -> WhoAmI:
    who = caller(router)
    return WhoAmI(principal=who.principal, arn=who.arn, account=who.account, admin=who.admin)

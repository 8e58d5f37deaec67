"""Usage and chargeback: GET /v1/usage (members: their own lines; admins: everyone's)."""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Query
from pydantic import ValidationError

from calque.accounting.wiring import api_usage
from calque.contracts.economics import MONTH_PATTERN, WHEN_PATTERN, UsageBy, UsageQuery, UsageReport
from calque.errors import InvalidInput
from functions.api.context import caller

router = Router()


@router.get("/usage")
def usage(
    month: Annotated[str | None, Query(pattern=MONTH_PATTERN, description="YYYY-MM (UTC)")] = None,
    since: Annotated[
        str | None, Query(pattern=WHEN_PATTERN, description="inclusive: a date or ISO 8601 time (UTC)")
    ] = None,
    until: Annotated[
        str | None, Query(pattern=WHEN_PATTERN, description="exclusive: a date or ISO 8601 time (UTC)")
    ] = None,
    by: Annotated[UsageBy, Query(description="what to sum by")] = "user",
) -> UsageReport:
    raw = {"month": month, "since": since, "until": until, "by": by}
    try:
        query = UsageQuery.model_validate({k: v for k, v in raw.items() if v is not None})
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else "query"
        raise InvalidInput(
            f"{field}: {err['msg']} (got {raw.get(field)!r})",
            details={"field": field, "value": raw.get(field)},
        ) from None
    return api_usage().usage(caller(router), query)

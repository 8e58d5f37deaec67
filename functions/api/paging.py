"""A list that does not fit one page: the page's items as the body (a JSON array, as every
list), and where the next page is in a ``Link`` header (RFC 8288, ``rel="next"``): the
same request with ``next=TOKEN``. No Link header: this was the last page."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any
from urllib.parse import quote, urlencode

from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.event_handler.api_gateway import BaseRouter
from aws_lambda_powertools.event_handler.openapi.params import Query

NEXT_PATTERN = r"^[A-Za-z0-9_-]+$"
NEXT_PARAM = "next"

# A paged list's two query parameters, the same on every list
PageLimit = Annotated[
    int | None, Query(ge=1, le=100, description="at most this many items on the page (default 100)")
]
NextToken = Annotated[
    str | None,
    Query(
        alias=NEXT_PARAM,
        min_length=1,
        max_length=400,
        pattern=NEXT_PATTERN,
        description="the page after the one whose Link header (rel=next) gave this token",
    ),
]


def next_link(router: BaseRouter, token: str) -> str:
    event = router.current_event
    query = [(k, v) for k, vs in (event.multi_value_query_string_parameters or {}).items() for v in vs]
    query = [(k, v) for k, v in query if k != NEXT_PARAM] + [(NEXT_PARAM, token)]
    return f'<{event.path}?{urlencode(query, quote_via=quote, safe="-_.~")}>; rel="next"'


def paged(router: BaseRouter, items: Sequence[Any], token: str | None) -> Response[Any]:
    headers = {"Link": next_link(router, token)} if token else {}
    return Response(
        status_code=200, content_type=content_types.APPLICATION_JSON, body=list(items), headers=headers
    )

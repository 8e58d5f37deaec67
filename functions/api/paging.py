"""A list that does not fit one page: the page's items as the body (a JSON array, as every
list), and where the next page is in a ``Link`` header (RFC 8288, ``rel="next"``): the
same request with ``next=TOKEN``. No Link header: this was the last page."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, urlencode

from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.event_handler.api_gateway import BaseRouter

NEXT_PATTERN = r"^[A-Za-z0-9_-]+$"
NEXT_PARAM = "next"


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

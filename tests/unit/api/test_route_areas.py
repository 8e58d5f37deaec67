"""The API imports a capability's routes only when a request needs them (cold start), and
still answers every route, 405 and the OpenAPI document as if all were loaded."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from functions.api import routes

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]


def _rules(module: str) -> list[tuple[str, str]]:
    router = importlib.import_module(f"functions.api.routes.{module}").router
    return [(key[1], key[0]) for key in router._routes]  # (method, rule) as registered


@pytest.mark.parametrize("module", routes.MODULES)
def test_every_route_of_a_capability_is_reached_through_its_first_path_segment(module):
    # Given each route a capability's router declares
    for method, rule in _rules(module):
        # When a request comes for it (its path under /v1, parameters filled in)
        path = "/v1" + rule.replace("<", "").replace(">", "")
        # Then the handler includes that capability's router before resolving it
        assert module in routes.modules_for(path), f"{method} /v1{rule} is in no area"


def test_the_areas_name_only_known_modules_and_every_module_has_an_area():
    named = {m for modules in routes.AREAS.values() for m in modules}
    assert named == set(routes.MODULES)


@pytest.mark.parametrize(
    "path",
    ["", "/", "/v1", "/v1/", "/v2/sessions", "/v1/openapi.json", "/v1/nothing", "v1/sessions", "/v1/Hosts"],
)
def test_a_path_no_route_begins_with_needs_no_capability(path):
    assert routes.modules_for(path) == ()


def _fresh(script: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CALQUE_", "AWS_"))}
    env.update(
        PYTHONPATH=str(REPO),
        CALQUE_TABLE_NAME="calque-registry",
        CALQUE_HOST_TASKS_QUEUE_URL="https://sqs.us-east-1.amazonaws.com/1/host-tasks",
        CALQUE_HOST_ROLE_NAME="CalqueHostRole",
        CALQUE_SESSION_DOCUMENT_NAME="CalqueSessionDocument",
        CALQUE_ADMINS="admin",
        AWS_DEFAULT_REGION="us-east-1",
        POWERTOOLS_TRACE_DISABLED="1",
        POWERTOOLS_LOG_LEVEL="ERROR",
        PYTHONDONTWRITEBYTECODE="1",
    )
    head = (
        "import json, sys\n"
        "from tests.unit.api.events import LambdaContext, rest_event\n"
        "from functions.api.handler import lambda_handler\n"
        "def call(method, path, user='alice'):\n"
        "    out = lambda_handler(rest_event(method, path, user=user), LambdaContext())\n"
        "    return out['statusCode'], json.loads(out['body']), out.get('multiValueHeaders') or {}\n"
        "def loaded():\n"
        "    return sorted(m.rsplit('.', 1)[1] for m in sys.modules if m.startswith('functions.api.routes.')"
        " and m != 'functions.api.routes.meta')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", head + script], env=env, cwd=REPO, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_cold_start_imports_only_the_routes_its_request_needs():
    # Given a fresh execution environment
    # When its first request is a member's whoami, then a request for the sessions area
    out = _fresh(
        "before = loaded()\n"
        "call('GET', '/v1/whoami')\n"
        "after_meta = loaded()\n"
        "call('PATCH', '/v1/sessions')\n"
        "print(json.dumps({'before': before, 'after_meta': after_meta, 'after': loaded()}))\n"
    )
    # Then importing the entry point loads no capability, whoami none, and sessions only its own
    assert out["before"] == []
    assert out["after_meta"] == []
    assert out["after"] == ["sessions"]


def test_a_method_no_route_answers_is_405_with_every_method_of_the_path_whatever_came_first():
    # Given a fresh environment whose first request is a wrong method on a host's path
    out = _fresh(
        "status, body, headers = call('PATCH', '/v1/hosts/i-0123456789abcdef0')\n"
        "print(json.dumps({'status': status, 'code': body['error']['code'], 'headers': headers}))\n"
    )
    # Then the answer names the methods the host's routes answer on, though none was loaded before
    assert out["status"] == 405
    assert out["code"] == "method_not_allowed"
    allow = {k.lower(): v for k, v in out["headers"].items()}["allow"]
    assert sorted(m.strip() for m in ",".join(allow).split(",")) == ["DELETE", "GET"]


def test_the_openapi_document_is_the_same_whichever_routes_were_loaded_before():
    # Given one environment asked for the document first, and another after requests to two areas
    script = (
        "status, doc, _ = call('GET', '/v1/openapi.json')\n"
        "print(json.dumps({'status': status, 'doc': doc}))\n"
    )
    first = _fresh(script)
    later = _fresh("call('GET', '/v1/pools')\ncall('GET', '/v1/usage')\ncall('GET', '/v1/budget')\n" + script)
    # Then both are the whole document, identical
    assert first["status"] == later["status"] == 200
    assert json.dumps(first["doc"]) == json.dumps(later["doc"])
    paths = first["doc"]["paths"]
    areas = {"/v1/sessions", "/v1/pools/{name}/claims", "/v1/hosts/acquire", "/v1/usage", "/v1/budget"}
    assert areas <= set(paths)
    assert list(paths) == sorted(paths)


def test_what_a_check_out_runs_declares_none_of_the_models_only_other_requests_build():
    # Given a fresh environment that imports everything a check-out runs through (its routes,
    # the tenancy service with every mixin, the registry) and prices an instance type as a
    # check-out does (the catalog's on-demand rate)
    out = _fresh(
        "call('PATCH', '/v1/sessions')\n"
        "import calque.tenancy.service, calque.tenancy.wiring, calque.tenancy.store.dynamo\n"
        "from calque.fleet import rates\n"
        "priced = str(rates.rate_of('g7e.2xlarge', None)[0])\n"
        "wanted = ['calque.contracts.hosts', 'calque.contracts.quotas', 'calque.contracts.layout',\n"
        "          'calque.tenancy.store.retired', 'calque.settings.functions', 'calque.catalog.planner',\n"
        "          'calque.members.shares', 'calque.catalog.models']\n"
        "print(json.dumps({'loaded': [m for m in wanted if m in sys.modules], 'priced': priced}))\n"
    )
    # Then it was priced, and the hosts', quotas' and layouts' contracts, a deregistered host's
    # records, the other functions' settings, registration's planner and the catalog's models
    # were never imported (declaring a model costs a cold start even when it is never built)
    assert float(out["priced"]) > 0
    assert out["loaded"] == []

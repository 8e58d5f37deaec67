"""Warm pools and their claims: pools (admins create/change/delete; everyone lists and reads),
claims (members submit and see only their own), and the workers' reports (instance role)."""

from __future__ import annotations

from typing import Annotated, Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Query
from aws_lambda_powertools.metrics import MetricUnit

from calque.contracts.pools import (
    NAME_PATTERN,
    Claim,
    ClaimInputUpload,
    ClaimReport,
    ClaimReportAnswer,
    ClaimSubmit,
    PackageUpload,
    Pool,
    PoolCreate,
    PoolDelete,
    PoolUpdate,
    WorkerCredentials,
    WorkerCredentialsRequest,
    WorkerReport,
)
from calque.pools.claims import CLAIM_PAGE
from calque.pools.wiring import pools
from calque.settings import pool_settings
from functions import observability
from functions.api.context import (
    admin_only,
    caller,
    guarded,
    host_role_caller,
    idempotency_key,
    require_host_role,
)
from functions.api.paging import NextToken, PageLimit, paged

router = Router()
logger = observability.logger("api")
metrics = observability.metrics("api")


def _pool(record: Any) -> Pool:
    return Pool.model_validate(record.model_dump())


def _counted(service: Any, record: Any) -> Pool:
    """The pool as every answer about one gives it: with its workers now, by state."""
    return _pool(record).model_copy(update={"current_workers": service.worker_counts(record.name)})


def _claim(record: Any) -> Claim:
    return Claim.model_validate(record.model_dump())


@router.post("/pools", status_code=201)
@admin_only
def create_pool(body: PoolCreate) -> Pool:
    service = pools()
    pool = service.create_pool(caller(router), body, idempotency_key=idempotency_key(router))
    logger.info("pool created", extra={"pool": pool.name, "instance_type": pool.instance_type})
    return _counted(service, pool)


@router.post("/pools/<name>/package", status_code=201)
@admin_only
def package_upload(name: str, body: PackageUpload) -> dict[str, Any]:
    """Where to PUT the runner package (a presigned URL to the artifact bucket's pool prefix)."""
    return pools().package_upload(caller(router), name, body)


@router.get("/pools")
def list_pools() -> list[Pool]:
    service = pools()
    return [_counted(service, p) for p in service.list_pools(caller(router))]


@router.get("/pools/<name>")
def pool_status(name: str) -> dict[str, Any]:
    service = pools()
    who = caller(router)
    pool = _counted(service, service.get_pool(who, name))
    return {**pool.model_dump(), "status": service.status(who, name)}


@router.patch("/pools/<name>")
@admin_only
def update_pool(name: str, body: PoolUpdate) -> Pool:
    service = pools()
    return _counted(service, service.update_pool(caller(router), name, body))


@router.delete("/pools/<name>")
@admin_only
def delete_pool(name: str, body: Annotated[PoolDelete | None, Body()] = None) -> dict[str, Any]:
    out = pools().delete_pool(caller(router), name, body or PoolDelete())
    logger.info("pool delete", extra=out)
    return out


@router.post("/pools/<name>/claims", status_code=201)
def submit(name: str, body: ClaimSubmit) -> Claim:
    claim = pools().submit(caller(router), name, body, idempotency_key=idempotency_key(router))
    metrics.add_metric(name="ClaimsSubmitted", unit=MetricUnit.Count, value=1)
    logger.info("claim submitted", extra={"pool": name, "claim_id": claim.claim_id, "items": claim.items})
    return _claim(claim)


@router.post("/pools/<name>/claims/input", status_code=201)
def claim_input(name: str, body: ClaimInputUpload) -> dict[str, Any]:
    """Where to PUT a claim's input too large for a request body (a presigned URL under the
    claim's own prefix), and the claim id the submit naming it makes."""
    return pools().input_upload(caller(router), name, body)


@router.get("/claims")
def list_claims(
    pool: Annotated[str | None, Query(pattern=NAME_PATTERN, description="only this pool's claims")] = None,
    limit: PageLimit = None,
    next_token: NextToken = None,
) -> Response[list[Claim]]:
    items, token = pools().claim_page(caller(router), pool, limit=limit or CLAIM_PAGE, token=next_token)
    return paged(router, [_claim(c) for c in items], token)


@router.get("/claims/<claim_id>")
def show_claim(claim_id: str) -> Claim:
    return _claim(pools().get_claim(caller(router), claim_id))


@router.get("/claims/<claim_id>/result")
def claim_result(claim_id: str) -> dict[str, Any]:
    return pools().claim_result(caller(router), claim_id)


@router.get("/claims/<claim_id>/logs")
def claim_logs(
    claim_id: str,
    after: Annotated[
        str | None,
        Query(max_length=300, description="the next of the page before: only chunks written after it"),
    ] = None,
) -> dict[str, Any]:
    """The runner's stdout and stderr of a claim, as chunks written while it runs and after."""
    return pools().claim_logs(caller(router), claim_id, after=after)


@router.delete("/claims/<claim_id>")
def cancel_claim(claim_id: str) -> Claim:
    claim = pools().cancel_claim(caller(router), claim_id, idempotency_key=idempotency_key(router))
    logger.info("claim cancelled", extra={"claim_id": claim_id})
    return _claim(claim)


@router.post("/pools/<name>/claims/<claim_id>/report")
@guarded(require_host_role)
def claim_report(name: str, claim_id: str, body: ClaimReport) -> ClaimReportAnswer:
    who = host_role_caller(router)
    out = pools().claim_report(who, pool_settings().host_role_name, name, claim_id, body)
    if body.event != "started":
        logger.info("claim report", extra={"claim_id": claim_id, "event": body.event, "answer": out})
    return ClaimReportAnswer.model_validate(out)


@router.post("/pools/<name>/workers/<worker_id>/report")
@guarded(require_host_role)
def worker_report(name: str, worker_id: str, body: WorkerReport) -> dict[str, Any]:
    who = host_role_caller(router)
    return pools().worker_report(who, pool_settings().host_role_name, name, worker_id, body)


@router.post("/pools/<name>/workers/<worker_id>/credentials")
@guarded(require_host_role)
def worker_credentials(name: str, worker_id: str, body: WorkerCredentialsRequest) -> WorkerCredentials:
    """The worker's own credentials: they reach only its pool's queue and objects."""
    who = host_role_caller(router)
    out = pools().worker_credentials(who, pool_settings().host_role_name, name, worker_id, body)
    logger.info("worker credentials", extra={"pool": name, "worker_id": worker_id})
    return WorkerCredentials.model_validate(out)

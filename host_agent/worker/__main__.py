"""``python -m host_agent.worker``: run one pool worker until idle or stopped."""

from __future__ import annotations

import argparse
import logging
import os
import sys

CREDENTIALS = ("instance", "control-plane")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m host_agent.worker", description="run one warm-pool worker")
    p.add_argument("--pool", required=True)
    p.add_argument("--worker-id", required=True)
    p.add_argument("--instance-id", required=True)
    p.add_argument("--queue-url", required=True)
    p.add_argument("--runner", required=True, help="MODULE:CLASS")
    p.add_argument("--package", default=None, help="directory holding the runner's package")
    p.add_argument("--report-to", required=True, help="the control plane's API endpoint")
    p.add_argument("--visibility", type=int, default=60, help="seconds each heartbeat extends a claim to")
    p.add_argument(
        "--heartbeat", type=float, default=None, help="seconds between heartbeats (default: a third)"
    )
    p.add_argument("--idle-timeout", type=float, default=600.0)
    p.add_argument(
        "--log-every", type=float, default=2.0, help="seconds between shipments of a running claim's logs"
    )
    p.add_argument("--poll-wait", type=int, default=20)
    p.add_argument(
        "--credentials",
        choices=CREDENTIALS,
        default="instance",
        help="what SQS and S3 calls sign with: the instance role, or the pool's own credentials "
        "the control plane vends (reports always sign with the instance role)",
    )
    return p


def main(argv: list | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=os.environ.get("CALQUE_WORKER_LOG_LEVEL", "INFO"), stream=sys.stderr)
    import botocore.session

    from host_agent.worker.control import HttpControlPlane
    from host_agent.worker.loop import Worker, WorkerConfig, install_signal_handlers

    endpoint = os.environ.get("CALQUE_AWS_ENDPOINT_URL") or None
    # botocore alone (the host agent's bundle carries no boto3); the region as SSM Agent gives it
    session = botocore.session.get_session()
    region = (
        os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
        or os.environ.get("AWS_SSM_REGION_NAME")
        or session.get_config_variable("region")
    )
    try:
        config = WorkerConfig(
            pool=args.pool,
            worker_id=args.worker_id,
            instance_id=args.instance_id,
            queue_url=args.queue_url,
            runner=args.runner,
            package_path=args.package,
            visibility_s=args.visibility,
            heartbeat_s=args.heartbeat if args.heartbeat is not None else args.visibility / 3,
            idle_timeout_s=args.idle_timeout,
            poll_wait_s=min(20, max(1, args.poll_wait)),
            log_every_s=max(0.1, args.log_every),
        )
    except ValueError as exc:
        sys.stderr.write(f"worker: error: {exc}\n")
        return 2
    control = HttpControlPlane(args.report_to)
    if args.credentials == "control-plane":
        from host_agent.worker.control import ControlPlaneError
        from host_agent.worker.credentials import pool_credentials, use_credentials

        try:
            creds = pool_credentials(control, args.pool, args.worker_id, args.instance_id)
        except ControlPlaneError as exc:
            sys.stderr.write(f"worker: error: no credentials for pool {args.pool}: {exc}\n")
            return 3
        # a session of its own: the reports' (control) resolve the instance role apart
        session = use_credentials(botocore.session.get_session(), creds)
    worker = Worker(
        config,
        sqs=session.create_client("sqs", region_name=region, endpoint_url=endpoint),
        s3=session.create_client("s3", region_name=region, endpoint_url=endpoint),
        control=control,
    )
    install_signal_handlers(worker)
    return worker.run_forever()


if __name__ == "__main__":  # spawn re-imports this module as __mp_main__: run only when asked
    sys.exit(main())

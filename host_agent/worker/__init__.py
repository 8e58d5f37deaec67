"""The pool worker: runs on a pool instance, keeps a runner's model loaded across claims.

Runs on Python 3.9+ with botocore (SQS, S3, SigV4) and nothing else outside the
standard library. ``python -m host_agent.worker --help`` for its options.

The runner protocol (user code, staged as the pool's package)::

    class MyRunner:
        def enter(self) -> None: ...          # once per worker process: load the model
        def run(self, items: list) -> list: ...  # once per claim: one output per item
        def exit(self) -> None: ...           # optional, when the worker stops

The runner lives in a supervised child process (host_agent.worker.child): a runner
that crashes the process costs the claim one attempt, never the worker.
"""

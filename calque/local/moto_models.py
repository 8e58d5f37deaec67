"""What moto keeps of every object it ever made, and what the plane lets it keep.

moto's ``BaseModel.__new__`` appends every instance of every model to its class's
``instances_tracked`` list, for its dashboard (``/moto-api/``) and for S3 to close its
objects' files at a reset, and nothing but a reset empties those lists. A DynamoDB
``Item`` is such a model: each write makes one, each UpdateItem deep-copies the item
it changes (a second), each Query or Scan deep-copies every item it returns, and
every one of them stays referenced forever, so the plane's memory grows with the
number of writes and reads it ever served, not with what its tables hold (about two
items kept per write: the "copies of rewritten items"). SQS messages, EC2
instances and SSM commands are kept the same way.

``untrack()`` makes moto keep only S3's instances (which S3 itself needs); every other
model is forgotten when nothing else holds it, as it would be without the dashboard.
The plane serves nothing from moto's dashboard.
"""

from __future__ import annotations

from typing import Any

_KEPT = ("moto.s3.",)  # S3 closes its objects' temporary files through this list at a reset
_STATE: dict[str, Any] = {}


def _new(cls: Any, *args: Any, **kwargs: Any) -> Any:
    instance = object.__new__(cls)
    if cls.__module__.startswith(_KEPT):
        cls.instances_tracked.append(instance)
    return instance


def untrack() -> None:
    """From now on, moto keeps no instance of a model but S3's (once per process)."""
    from moto.core.common_models import BaseModel

    if "original" in _STATE:
        return
    _STATE["original"] = BaseModel.__dict__["__new__"]
    BaseModel.__new__ = staticmethod(_new)  # type: ignore[method-assign]
    # what was tracked before now goes with its last other reference
    from moto.core.model_instances import model_data

    for service, models in model_data.items():
        if service != "s3":
            for model in models.values():
                model.instances_tracked = []  # type: ignore[attr-defined]


def tracked(cls: Any) -> int:
    """How many instances of ``cls`` moto holds (tests)."""
    return len(getattr(cls, "instances_tracked", []))

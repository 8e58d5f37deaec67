"""calque.dynamo.attrs answers as boto3's TypeSerializer / TypeDeserializer do, value for
value and error for error: boto3's own classes are the oracle here (the tests may import
boto3; the functions do not)."""

from __future__ import annotations

import decimal
from collections import OrderedDict
from decimal import Decimal
from typing import Any

import pytest
from boto3.dynamodb.types import Binary, TypeDeserializer, TypeSerializer

from calque.dynamo import attrs

pytestmark = pytest.mark.unit

BOTO_SER, BOTO_DES = TypeSerializer(), TypeDeserializer()

VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    2**63,
    10**37,
    Decimal("0.000001"),
    Decimal("-12.5"),
    Decimal("1E+126"),
    Decimal("1E-128"),
    "",
    "slice 1g.24gb",
    "ünïcødé \x00",
    b"\x00\xff",
    bytearray(b"ab"),
    {"a", "b"},
    frozenset({"x"}),
    {1, Decimal("2.5")},
    {b"a", b"b"},
    [],
    [1, "a", None, [True], {"k": Decimal("1.5")}],
    (1, "a"),
    {},
    {"pk": "HOST#i-1", "n": 3, "env": {"CUDA_VISIBLE_DEVICES": "MIG-1"}, "tags": ["a", "b"]},
    OrderedDict(a=1),
    {"nested": {"deeper": [{"deepest": {"s": {"x"}}}]}},
]


def _sorted_sets(av: Any) -> Any:
    """Sets serialize in iteration order: compare their members, not their order."""
    if isinstance(av, dict):
        return {k: sorted(v) if k in ("SS", "NS", "BS") else _sorted_sets(v) for k, v in av.items()}
    if isinstance(av, list):
        return [_sorted_sets(v) for v in av]
    return av


def _id(value: Any) -> str:
    """A test id that is the same in every process (set order and object addresses are not):
    parallel workers must collect the same tests."""
    if isinstance(value, (set, frozenset)):
        inner = ", ".join(sorted(_id(v) for v in value))
        return f"{type(value).__name__}({{{inner}}})"
    if type(value) is object:
        return "object()"
    return repr(value)


@pytest.mark.parametrize("value", VALUES, ids=_id)
def test_serializes_as_boto3_does(value: Any) -> None:
    ours = attrs.serialize(value)
    assert _sorted_sets(ours) == _sorted_sets(BOTO_SER.serialize(value))


@pytest.mark.parametrize("value", VALUES, ids=_id)
def test_round_trips_as_boto3_does(value: Any) -> None:
    av = BOTO_SER.serialize(value)
    ours, theirs = attrs.deserialize(av), BOTO_DES.deserialize(av)
    assert ours == theirs
    assert type(ours) is (bytes if isinstance(theirs, Binary) else type(theirs))


def test_numbers_come_back_as_decimals_in_dynamodbs_context() -> None:
    assert attrs.deserialize({"N": "3"}) == Decimal(3)
    assert isinstance(attrs.deserialize({"N": "3"}), Decimal)
    assert attrs.deserialize({"NS": ["1", "2.5"]}) == {Decimal(1), Decimal("2.5")}
    assert attrs.deserialize({"M": {"L": {"L": [{"N": "1"}, {"NULL": True}]}}}) == {"L": [Decimal(1), None]}


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (1.5, TypeError),  # floats: boto3 asks for Decimal
        ({1.5}, TypeError),
        ([1.5], TypeError),
        (Decimal("1.23456789012345678901234567890123456789012"), decimal.Inexact),  # 39+ digits
        (Decimal("1E+127"), decimal.Overflow),
        (Decimal("1E-170"), decimal.DecimalException),  # below the smallest subnormal
        (Decimal("NaN"), TypeError),
        (Decimal("Infinity"), TypeError),
        ({"a", 1}, TypeError),  # a mixed set has no DynamoDB type
        (object(), TypeError),
    ],
    ids=_id,
)
def test_refuses_what_boto3_refuses(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        BOTO_SER.serialize(value)
    with pytest.raises(error):
        attrs.serialize(value)


def test_refuses_negative_infinity_which_boto3_leaves_to_dynamodb() -> None:
    assert BOTO_SER.serialize(Decimal("-Infinity")) == {"N": "-Infinity"}
    with pytest.raises(TypeError, match="Infinity and NaN"):
        attrs.serialize(Decimal("-Infinity"))


@pytest.mark.parametrize("av", [{}, {"X": "1"}, {"SSS": []}], ids=_id)
def test_refuses_what_boto3_cannot_read(av: dict[str, Any]) -> None:
    with pytest.raises(TypeError):
        BOTO_DES.deserialize(av)
    with pytest.raises(TypeError):
        attrs.deserialize(av)


def test_the_functions_path_imports_no_boto3() -> None:
    """The registry and the client factory must not pull the boto3 package (s3transfer,
    multiprocessing) back into a cold start: checked in a fresh interpreter."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import calque.aws, calque.tenancy.store.dynamo, calque.tenancy.wiring, calque.pools.wiring\n"
        "import functions.api.handler\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('boto3', 's3transfer'))\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_model_defaults_through_a_builtins_factory() -> None:
    """pydantic inspects a default factory's signature when it builds a model; a builtin's
    (``list``, ``dict``) is parsed from text through tokenize, whose regex is compiled on the
    spot: several ms of the first request's cold start. A pydantic model says ``default=[]``
    (pydantic copies a mutable default for each instance); dataclasses keep their factories."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    pattern = re.compile(
        r"Field\([^)]*default_factory=(list|dict|set|tuple)\b|^\s*default_factory=(list|dict)\b"
    )
    found = [
        f"{path.relative_to(root)}:{n}"
        for package in ("calque", "functions", "host_agent")
        for path in sorted((root / package).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []

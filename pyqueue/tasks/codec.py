"""Task arguments and results as JSON: the types that travel, symmetric on both sides.

Plain JSON types travel as themselves: ``None``, ``bool``, ``int``, ``float`` (finite),
``str``, ``list`` and ``dict`` with ``str`` keys. Tuples travel as lists (and arrive as
lists), as in every JSON-based queue. A few more types travel as *tagged* objects,
``{"$pq": <type>, "v": <value>}``, and arrive as the type they left as:

==========================  =========================================  ==============
type                        ``v``                                      tag
==========================  =========================================  ==============
``datetime.datetime``       ISO 8601 (an offset if it is aware)        ``datetime``
``datetime.date``           ISO 8601                                   ``date``
``datetime.time``           ISO 8601                                   ``time``
``datetime.timedelta``      seconds, a number                          ``timedelta``
``uuid.UUID``               canonical text                             ``uuid``
``decimal.Decimal``         text (no rounding)                         ``decimal``
``bytes``                   base64 text                                ``bytes``
``set`` / ``frozenset``     a list, sorted by each item's JSON text    ``set``
==========================  =========================================  ==============

A timedelta is exact to the microsecond up to about 136 years (2^32 s; a float's
precision beyond that). A set arrives as a ``set`` whose items are hashable again: an item that left as a
tuple arrives as a tuple, one that left as a frozenset as a frozenset.

Anything else (a dataclass, a model, a custom class) is refused *before* anything is
sent: pass ``dataclasses.asdict(x)`` or ``model.model_dump()`` and rebuild it in the
task; a queue that pickled it would run whatever code the payload names. A ``dict`` of
the caller's with a ``"$pq"`` key, a key that is not a ``str``, NaN or an infinity is
refused too (each would arrive as something else), and so is data nested more than
:data:`MAX_DEPTH` levels deep (a list that contains itself). Other languages read and write the
same tags (``lua/README.md``, the task envelope).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import math
import uuid
from collections.abc import Callable
from json import scanner as json_scanner
from typing import Any

from pyqueue.protocol.errors import InvalidArgument

TAG = "$pq"


#: How deeply values may nest (a list in a dict in a list...): deeper is refused, as a
#: cycle (a list that contains itself) would otherwise recurse until RecursionError.
MAX_DEPTH = 100


#: Values that travel as themselves with nothing to check (a float may be NaN).
_PLAIN = frozenset((str, int, bool, type(None)))


def to_json_args(args: list[Any] | tuple[Any, ...], where: str = "argument") -> list[Any]:
    """:func:`to_json` of a call's positional arguments, with a fast path for the common
    call of plain scalars (nothing to convert or check)."""
    if all(type(a) in _PLAIN for a in args):
        return list(args)
    return to_json(list(args), where)  # type: ignore[no-any-return]


def to_json(value: Any, where: str = "argument", _depth: int = 0) -> Any:
    """``value`` as plain JSON data, extra types tagged (see the module docstring).

    Raises:
        InvalidArgument: a value of a type that does not travel, or nested more than
            :data:`MAX_DEPTH` levels deep (a cycle); ``where`` names it.
    """
    kind = type(value)
    if _depth > MAX_DEPTH:
        raise InvalidArgument(f"{where}: nested more than {MAX_DEPTH} levels deep (a list or dict that contains itself?)")
    depth = _depth + 1
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is float:
        if math.isnan(value) or math.isinf(value):
            raise InvalidArgument(f"{where}: {value!r} is not JSON (NaN and infinities do not travel)")
        return value
    if kind is list or kind is tuple:
        return [to_json(v, where, depth) for v in value]
    if kind is dict:
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise InvalidArgument(f"{where}: dict keys must be str to travel as JSON, got {type(k).__name__} {k!r}")
            if k == TAG:
                raise InvalidArgument(f"{where}: a dict key {TAG!r} is reserved for pyqueue's tagged types")
            out[str.__str__(k)] = to_json(v, where, depth)  # a str subclass's own text
        return out
    if isinstance(value, datetime.datetime):
        return {TAG: "datetime", "v": value.isoformat()}
    if isinstance(value, datetime.date):
        return {TAG: "date", "v": value.isoformat()}
    if isinstance(value, datetime.time):
        return {TAG: "time", "v": value.isoformat()}
    if isinstance(value, datetime.timedelta):
        return {TAG: "timedelta", "v": value.total_seconds()}
    if isinstance(value, uuid.UUID):
        return {TAG: "uuid", "v": str(value)}
    if isinstance(value, decimal.Decimal):
        return {TAG: "decimal", "v": str(value)}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {TAG: "bytes", "v": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, (set, frozenset)):
        # In a canonical order: the same set is the same payload (and the same
        # ``unique=True`` job id) in every process, whatever its hash seed.
        return {TAG: "set", "v": sorted((to_json(v, where, depth) for v in value), key=canonical)}
    # Subclasses (an IntEnum, a str-mixin Enum, a named tuple, a defaultdict): their
    # plain value, read with the base type's method (str() of `class C(str, Enum)`
    # is "C.RED", not its value "red").
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return to_json(float.__float__(value), where, _depth)
    if isinstance(value, (list, tuple)):
        return [to_json(v, where, depth) for v in value]
    if isinstance(value, dict):
        return to_json(dict(value), where, _depth)
    raise InvalidArgument(
        f"{where}: {type(value).__name__} does not travel as JSON; pass plain data (dataclasses.asdict(x), "
        "model.model_dump()) or one of datetime, date, time, timedelta, UUID, Decimal, bytes, set"
    )


def _hashable(value: Any) -> Any:
    """A set's element as it left: tuples travel as lists and frozensets as sets, and a
    set's elements must be hashable again."""
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, set):
        return frozenset(value)
    return value


_DECODERS: dict[str, Any] = {
    "datetime": datetime.datetime.fromisoformat,
    "date": datetime.date.fromisoformat,
    "time": datetime.time.fromisoformat,
    "timedelta": lambda v: datetime.timedelta(seconds=v),
    "uuid": uuid.UUID,
    "decimal": decimal.Decimal,
    "bytes": lambda v: base64.b64decode(v, validate=True),
    "set": lambda v: {_hashable(item) for item in v},
}


def untag(obj: dict[str, Any]) -> Any:
    """``json.loads``'s ``object_hook``: a tagged object back to its type.

    Raises:
        InvalidArgument: an unknown tag, or a value that does not parse as its tag's type.
    """
    tag = obj.get(TAG)
    if tag is None:
        return obj
    decoder = _DECODERS.get(tag) if isinstance(tag, str) else None
    if decoder is None or len(obj) != 2 or "v" not in obj:
        raise InvalidArgument(f"unknown tagged value {obj!r} (known tags: {sorted(_DECODERS)})")
    try:
        return decoder(obj["v"])
    except (ValueError, TypeError, decimal.InvalidOperation) as exc:
        raise InvalidArgument(f"tagged value {obj!r} does not parse: {exc}") from None


def from_json(value: Any) -> Any:
    """Plain JSON data (already parsed) back to the values :func:`to_json` tagged."""
    if isinstance(value, list):
        return [from_json(v) for v in value]
    if isinstance(value, dict):
        return untag({k: from_json(v) for k, v in value.items()})
    return value


# One encoder of each kind and one decoder for the process: json.dumps and json.loads
# given options build a new encoder or decoder on every call, which costs more than
# encoding or parsing a task's envelope (bench/bench_tasks.py). They keep no state
# between calls, so threads share them (as json's own default ones are shared).
_encode: Callable[[Any], str] = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
_encode_canonical: Callable[[Any], str] = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, allow_nan=False, sort_keys=True
).encode


def _not_json(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# Faster still where CPython's C encoder is there: JSONEncoder.encode builds a C encoder
# on every call (a third of a task's send-side Python), so build the two once. Without
# the circular-reference check (markers None): what they encode went through to_json,
# which refuses nesting deeper than MAX_DEPTH, so it holds no cycle; and with no markers
# they keep no state between calls, so threads share them.
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
if _c_make_encoder is not None:
    _c_compact = _c_make_encoder(None, _not_json, json.encoder.encode_basestring, None, ":", ",", False, False, False)
    _c_canonical = _c_make_encoder(None, _not_json, json.encoder.encode_basestring, None, ":", ",", True, False, False)

    def _encode_c(value: Any) -> str:
        return "".join(_c_compact(value, 0))

    def _encode_canonical_c(value: Any) -> str:
        return "".join(_c_canonical(value, 0))

    _encode, _encode_canonical = _encode_c, _encode_canonical_c

def _scanning(decoder: json.JSONDecoder) -> Callable[[str], Any]:
    """``decoder.decode``, faster for text that is one JSON value with no whitespace
    around it (every envelope): the C scanner alone, without ``decode``'s two whitespace
    matches and its Python frames. Anything else (whitespace around, not JSON) goes to
    ``decoder.decode``, which reads it or raises exactly as before."""
    make_scanner = getattr(json_scanner, "c_make_scanner", None)
    if make_scanner is None:
        return decoder.decode
    scan = make_scanner(decoder)

    def decode(text: str) -> Any:
        try:
            value, end = scan(text, 0)
        except StopIteration:
            return decoder.decode(text)
        return value if end == len(text) else decoder.decode(text)

    return decode


_decode = _scanning(json.JSONDecoder(object_hook=untag))
# Without a tag in the text, no object needs untagging: the decoder without a hook
# (no Python call per JSON object) reads it the same, faster.
_decode_plain = _scanning(json.JSONDecoder())


def dumps(value: Any) -> str:
    """Plain JSON data as compact text (UTF-8, no NaN)."""
    return _encode(value)


def canonical(value: Any) -> str:
    """Plain JSON data as text in one canonical form (keys sorted): equal data, equal
    text (set order, job ids of ``unique=True``)."""
    return _encode_canonical(value)


def loads(text: str | bytes) -> Any:
    """JSON text to values, tags decoded: ``json.loads(text, object_hook=untag)``, with
    one decoder for the process.

    Raises:
        ValueError: not JSON (``json.JSONDecodeError``), or bytes that do not decode.
        InvalidArgument: a tagged value that does not decode (:func:`untag`).
        TypeError: neither str nor bytes.
    """
    if isinstance(text, (bytes, bytearray)):
        # A JSON object in UTF-8 (an envelope) shows by its first two bytes; anything
        # else is detected as json.loads detects it.
        encoding = "utf-8" if text[:1] == b"{" and text[1:2] != b"\x00" else json.detect_encoding(text)
        text = text.decode(encoding, "surrogatepass")
    elif not isinstance(text, str):
        raise TypeError(f"the JSON object must be str, bytes or bytearray, not {text.__class__.__name__}")
    elif text.startswith("\ufeff"):
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    return _decode(text) if TAG in text else _decode_plain(text)

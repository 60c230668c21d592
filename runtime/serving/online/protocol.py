"""The Open Inference Protocol's (KServe v2) REST bodies: an infer request to raw columns, outputs to JSON.

    request = decode_request(body, model.inputs)    # BadRequest naming the input and the problem
    request.fields   -> {"userId": [1, 2], "movieId": [1000, 1007]}
    request.rows     -> 2
    encode_response(model_name, request.id, [Output("like", "FP32", [2], [0.7, 0.1])], parameters)

A request's body is a JSON object with `inputs`: one object per input, each
with `name`, `datatype`, `shape` [N] and `data` (a flat list of N values, or
N one-element lists, or with the binary tensor extension a
`binary_data_size` in its `parameters` and its bytes after the JSON, whose
length the `Inference-Header-Content-Length` header gives: tritonclient's
default); every input the model takes must be there, with a
datatype it accepts, and the same N for all. BYTES values are strings,
INT64/INT32 integers, FP32/FP64 numbers; a number may be null, an empty
field (what an empty CSV field is to the reader). `outputs` (optional) names the
outputs wanted; `binary_data_output` (request parameters) or an
output's `binary_data` asks for binary outputs, as tritonclient does.
Nothing in a request is executed or used as a path: values only reach the
readers' parsing (runtime.serving.online.raw_rows).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.serving.online.raw_rows import RawInput

__all__ = [
    "BadRequest",
    "InferRequest",
    "Output",
    "decode_object",
    "decode_request",
    "encode_response",
    "tensor_bytes",
]


class BadRequest(Exception):
    """A request the server refuses with 400; the message names the input and the problem."""


@dataclass(frozen=True)
class InferRequest:
    fields: dict[str, list[Any]]
    rows: int
    id: str | None = None
    outputs: tuple[str, ...] | None = None  # None: every output
    binary: frozenset[str] = frozenset()  # the outputs answered as binary data


@dataclass(frozen=True)
class Output:
    name: str
    datatype: str
    shape: list[int]
    data: list[Any]


def decode_request(
    body: bytes, inputs: Sequence[RawInput], outputs: Sequence[str], header_length: str | None = None
) -> InferRequest:
    """The raw columns of an infer request's `body` for a model taking `inputs`; `header_length`: the
    Inference-Header-Content-Length header (the JSON's bytes, binary tensors after it)."""
    blobs = b""
    if header_length is not None:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise BadRequest(f"Inference-Header-Content-Length {header_length[:20]!r}: not a length within the body")
        body, blobs = body[: int(header_length)], body[int(header_length) :]
    try:
        request = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BadRequest(f"malformed JSON: {error}") from None
    return decode_object(request, inputs, outputs, blobs)


def decode_object(request: Any, inputs: Sequence[RawInput], outputs: Sequence[str], blobs: bytes = b"") -> InferRequest:
    """`decode_request` of a request already parsed from JSON (`blobs`: the binary data after it)."""
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        raise BadRequest("the body must be a JSON object with a list 'inputs'")
    known = {raw.name: raw for raw in inputs}
    fields: dict[str, list[Any]] = {}
    rows: int | None = None
    for position, item in enumerate(request["inputs"]):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise BadRequest(f"inputs[{position}]: an object with a string 'name'")
        name = item["name"]
        if name not in known:
            raise BadRequest(f"input {name!r}: the model has no such input (its inputs: {', '.join(known)})")
        if name in fields:
            raise BadRequest(f"input {name!r}: given twice")
        fields[name], blobs = _values(known[name], item, blobs)
        if rows is None:
            rows = len(fields[name])
        elif len(fields[name]) != rows:
            first = next(iter(fields))
            raise BadRequest(f"input {name!r}: shape [{len(fields[name])}], but input {first!r} has shape [{rows}]")
    missing = [name for name in known if name not in fields]
    if missing:
        raise BadRequest(f"input {missing[0]!r} is missing (the model's inputs: {', '.join(known)})")
    if blobs:
        raise BadRequest(f"{len(blobs)} bytes of binary data after the inputs' binary_data_size")
    if not rows:
        raise BadRequest("the request has no rows (shape [0])")
    requested, binary = _requested(request.get("outputs"), outputs, request.get("parameters"))
    return InferRequest(fields, rows, _id(request.get("id")), requested, binary)


def _values(raw: RawInput, item: dict[str, Any], blobs: bytes) -> tuple[list[Any], bytes]:
    """The input's values, and what is left of the binary data after its own."""
    name, datatype, shape = raw.name, item.get("datatype"), item.get("shape")
    if datatype not in raw.accepts:
        raise BadRequest(f"input {name!r}: datatype {datatype!r}, expected {' or '.join(raw.accepts)}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise BadRequest(f"input {name!r}: 'shape' must be a list of integers, got {shape!r}")
    if len(shape) != 1 and not (len(shape) == 2 and shape[1] == 1):
        raise BadRequest(f"input {name!r}: shape {shape}, expected [N] (one value per row)")
    size = (item.get("parameters") or {}).get("binary_data_size") if isinstance(item.get("parameters"), dict) else None
    if size is not None:
        if not _is_int(size) or not 0 <= size <= len(blobs):
            raise BadRequest(
                f"input {name!r}: binary_data_size {size!r}, but {len(blobs)} bytes of binary data are left"
            )
        data: Any = _binary(name, datatype, blobs[:size])
        blobs = blobs[size:]
    else:
        data = item.get("data")
    if not isinstance(data, list):
        raise BadRequest(f"input {name!r}: 'data' must be a list")
    values = [v[0] if isinstance(v, list) and len(v) == 1 else v for v in data]
    if len(values) != shape[0]:
        raise BadRequest(f"input {name!r}: shape {shape} but {len(values)} values in 'data'")
    check = _CHECKS[datatype]
    for row, value in enumerate(values):
        if not check(value):
            raise BadRequest(f"input {name!r}, row {row}: {json.dumps(value)[:40]} is not a {_WHAT[datatype]}")
    return values, blobs


_NUMPY = {"INT64": "<i8", "INT32": "<i4", "FP32": "<f4", "FP64": "<f8"}


def _binary(name: str, datatype: str, data: bytes) -> list[Any]:
    """Binary tensor data: little-endian numbers, or BYTES as (4-byte length, bytes) per element."""
    if datatype != "BYTES":
        width = np.dtype(_NUMPY[datatype]).itemsize
        if len(data) % width:
            raise BadRequest(
                f"input {name!r}: {len(data)} bytes of binary data is no whole number of {datatype} values"
            )
        return np.frombuffer(data, dtype=_NUMPY[datatype]).tolist()
    values: list[str] = []
    at = 0
    while at < len(data):
        if at + 4 > len(data) or at + 4 + struct.unpack_from("<I", data, at)[0] > len(data):
            raise BadRequest(f"input {name!r}: binary BYTES element {len(values)} runs past the data")
        length = struct.unpack_from("<I", data, at)[0]
        try:
            values.append(data[at + 4 : at + 4 + length].decode("utf-8"))
        except UnicodeDecodeError:
            raise BadRequest(f"input {name!r}, row {len(values)}: not UTF-8 text") from None
        at += 4 + length
    return values


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))


# null is an empty field, as an empty CSV field is: its reader's empty value (0, a learned fill).
_CHECKS = {
    "BYTES": lambda v: isinstance(v, str),
    "INT64": lambda v: v is None or (_is_int(v) and -(2**63) <= v < 2**63),
    "INT32": lambda v: v is None or (_is_int(v) and -(2**31) <= v < 2**31),
    "FP32": lambda v: v is None or _is_number(v),
    "FP64": lambda v: v is None or _is_number(v),
}
_WHAT = {
    "BYTES": "string",
    "INT64": "64-bit integer",
    "INT32": "32-bit integer",
    "FP32": "finite number",
    "FP64": "finite number",
}


def _id(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise BadRequest(f"'id' must be a string, got {json.dumps(value)[:40]}")
    return value


def _requested(value: Any, outputs: Sequence[str], parameters: Any) -> tuple[tuple[str, ...] | None, frozenset[str]]:
    """The outputs asked for (None: all) and those wanted as binary data."""
    everything = isinstance(parameters, dict) and parameters.get("binary_data_output") is True
    if value is None:
        return None, frozenset(outputs if everything else ())
    if not isinstance(value, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in value):
        raise BadRequest("'outputs' must be a list of objects with a string 'name'")
    names = tuple(o["name"] for o in value)
    for name in names:
        if name not in outputs:
            raise BadRequest(f"output {name!r}: the model has no such output (its outputs: {', '.join(outputs)})")
    binary = {o["name"] for o in value if isinstance(o.get("parameters"), dict) and o["parameters"].get("binary_data")}
    return names, frozenset(binary | (set(names) if everything else set()))


def encode_response(
    model: str, request: InferRequest, outputs: Sequence[Output], parameters: dict[str, Any] | None = None
) -> tuple[bytes, int | None]:
    """The body of an infer response with the requested `outputs` (all by default), and the length of
    its JSON part when binary data follows it (the Inference-Header-Content-Length), else None."""
    wanted = [o for o in outputs if request.outputs is None or o.name in request.outputs]
    blobs = []
    described = []
    for o in wanted:
        entry: dict[str, Any] = {"name": o.name, "datatype": o.datatype, "shape": o.shape}
        if o.name in request.binary:
            blobs.append(tensor_bytes(o))
            entry["parameters"] = {"binary_data_size": len(blobs[-1])}
        else:
            entry["data"] = o.data
        described.append(entry)
    response: dict[str, Any] = {"model_name": model, "model_version": "1", "outputs": described}
    if request.id is not None:
        response["id"] = request.id
    if parameters:
        response["parameters"] = parameters
    text = json.dumps(response).encode()
    return (text + b"".join(blobs), len(text)) if blobs else (text, None)


def tensor_bytes(output: Output) -> bytes:
    """An output's values as binary tensor data (little-endian; BYTES as a 4-byte length and the UTF-8
    bytes per element), as the binary extension and gRPC carry them."""
    if output.datatype == "BYTES":
        encoded = [value.encode() for value in output.data]
        return b"".join(struct.pack("<I", len(value)) + value for value in encoded)
    return np.asarray(output.data, dtype=_NUMPY[output.datatype]).tobytes()

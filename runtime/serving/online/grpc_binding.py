"""The Open Inference Protocol's gRPC binding (KServe v2 `inference.GRPCInferenceService`), `--grpc-port`.

    server = await start_grpc(slots, "127.0.0.1", 8001, max_body)   # grpc.aio, on the serving loop
    ...
    await server.stop(drain_seconds)

The service's messages and stubs are tritonclient's (`tritonclient.grpc`'s
generated `service_pb2`, BSD-3; the `grpc` extra), not a vendored proto:
Triton and KServe share the `inference` package. ServerLive, ServerReady,
ServerMetadata, ModelMetadata, ModelReady and ModelInfer are answered;
the other methods answer UNIMPLEMENTED. A ModelInfer request becomes the
REST binding's request: `raw_input_contents` are the binary tensor
extension's bytes (tritonclient's default), typed `contents` its `data`,
so both bindings check inputs with the same code and give the same 400
messages, here as INVALID_ARGUMENT (NOT_FOUND for an unknown model,
UNAVAILABLE when overloaded). Outputs go back as `raw_output_contents`;
the requests join the same batches as the REST ones.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from runtime.serving.online.batcher import Overloaded
from runtime.serving.online.metrics import Metrics
from runtime.serving.online.protocol import BadRequest, decode_object, tensor_bytes
from runtime.serving.online.registry import Slot

__all__ = ["start_grpc"]

# The typed contents field of each datatype a request may send.
_CONTENTS = {
    "INT64": "int64_contents",
    "INT32": "int_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


class _Service(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, slots: Mapping[str, Slot], metrics: Metrics) -> None:
        self.slots, self.metrics = slots, metrics

    async def _slot(self, name: str, version: str, context: grpc.aio.ServicerContext) -> Slot:
        if name not in self.slots:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown model {name!r} (served: {', '.join(self.slots)})")
        if version not in ("", "1"):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"model {name!r} has version 1 only, not {version!r}")
        return self.slots[name]

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=True)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerMetadataResponse(name="reccompile", version="1", extensions=["model_repository"])

    async def ModelReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ModelReadyResponse(ready=request.name in self.slots and request.version in ("", "1"))

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        model = (await self._slot(request.name, request.version, context)).model
        tensor = service_pb2.ModelMetadataResponse.TensorMetadata
        return service_pb2.ModelMetadataResponse(
            name=model.name,
            versions=["1"],
            platform="reccompile",
            inputs=[tensor(name=i.name, datatype=i.datatype, shape=[-1]) for i in model.inputs],
            outputs=[tensor(name=n, datatype=d, shape=list(s)) for n, d, s in model.outputs],
        )

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        started, name, code = time.perf_counter(), request.model_name, 500
        try:
            slot = await self._slot(name, request.model_version, context)
            model = slot.model
            try:
                body, blobs = _as_rest(request)
                decoded = decode_object(body, model.inputs, model.output_names, blobs)
                outputs, parameters = await slot.batcher.submit((model, decoded), decoded.rows)
            except BadRequest as error:
                code = 400
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
            except Overloaded as error:
                code = 503
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"overloaded: {error}; retry later")
            code = 200
            wanted = [o for o in outputs if decoded.outputs is None or o.name in decoded.outputs]
            response = service_pb2.ModelInferResponse(
                model_name=model.name,
                model_version="1",
                id=decoded.id or "",
                outputs=[
                    service_pb2.ModelInferResponse.InferOutputTensor(name=o.name, datatype=o.datatype, shape=o.shape)
                    for o in wanted
                ],
                raw_output_contents=[tensor_bytes(o) for o in wanted],
            )
            for key, value in parameters.items():
                response.parameters[key].double_param = value
            return response
        finally:
            if name in self.slots:
                self.metrics.request(name, code, time.perf_counter() - started)


def _as_rest(request: Any) -> tuple[dict[str, Any], bytes]:
    """A ModelInferRequest as the REST binding's JSON object and the binary data after it."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise BadRequest(f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs")
    inputs = []
    for position, tensor in enumerate(request.inputs):
        item: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
        if raw:
            item["parameters"] = {"binary_data_size": len(raw[position])}
        else:
            field = _CONTENTS.get(tensor.datatype)
            values = list(getattr(tensor.contents, field)) if field else []
            if tensor.datatype == "BYTES":
                try:
                    values = [v.decode("utf-8") for v in values]
                except UnicodeDecodeError:
                    raise BadRequest(f"input {tensor.name!r}: not UTF-8 text") from None
            item["data"] = values
        inputs.append(item)
    body: dict[str, Any] = {"inputs": inputs, "outputs": [{"name": o.name} for o in request.outputs] or None}
    if request.id:
        body["id"] = request.id
    return body, b"".join(raw)


async def start_grpc(slots: Mapping[str, Slot], metrics: Metrics, host: str, port: int, max_body: int) -> Any:
    """A started grpc.aio server on host:port (0: any free port); returns (server, the port it listens on)."""
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", max_body)])
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(_Service(slots, metrics), server)
    bound = server.add_insecure_port(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    await server.start()
    return server, bound

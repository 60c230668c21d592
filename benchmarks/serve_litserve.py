"""serve-bench's general-purpose comparison: LitServe serving a reccompile export.

    python benchmarks/serve_litserve.py OUT --port P [--threads T] [--max-wait-ms T]

LitServe's own HTTP server (FastAPI on uvicorn), its request batching (64
rows, `--max-wait-ms`, as `reccompile serve` is run) and one inference worker
process; the request body and the work per request are `reccompile serve`'s
(the Open Inference Protocol's JSON, runtime.serving.online's raw-row path
and model), so the difference measured is the serving machinery. Started and
stopped by benchmarks/serve_bench.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import litserve as ls

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's runtime


class ExportApi(ls.LitAPI):
    def __init__(self, export: Path, threads: int, max_wait_ms: float) -> None:
        super().__init__(max_batch_size=64, batch_timeout=max_wait_ms / 1000)
        self.export, self.threads = export, threads

    def setup(self, device: str) -> None:
        import torch

        from runtime.serving.online.models import load_model

        torch.set_num_threads(self.threads)
        self.model = load_model(self.export)

    def decode_request(self, request):  # unannotated: with an annotation FastAPI reads a query parameter
        from runtime.serving.online.protocol import decode_object

        return decode_object(request, self.model.inputs, self.model.output_names)

    def predict(self, requests: list[Any]) -> list[Any]:
        return self.model.predict(requests)

    def encode_response(self, answer: Any) -> dict[str, Any]:
        outputs, _ = answer
        return {
            "outputs": [{"name": o.name, "datatype": o.datatype, "shape": o.shape, "data": o.data} for o in outputs]
        }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("export", type=Path)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-wait-ms", type=float, default=2.0)
    args = parser.parse_args()
    server = ls.LitServer(
        ExportApi(args.export, args.threads, args.max_wait_ms), accelerator="cpu", workers_per_device=1
    )
    server.run(host="127.0.0.1", port=args.port, generate_client_file=False)

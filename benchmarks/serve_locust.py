"""serve-bench's load: locust users posting Open Inference Protocol requests of MovieLens rows, no think time.

Run by benchmarks/serve_bench.py (`locust -f serve_locust.py --headless ...`), which sets:
SERVE_PATH (the infer path), SERVE_ROWS (rows per request), SERVE_USERS and SERVE_MOVIES
(the ids drawn from). Every request is checked for a 200 and the rows' scores.
"""

from __future__ import annotations

import json
import os
import random

from locust import FastHttpUser, task

PATH = os.environ.get("SERVE_PATH", "/v2/models/two_tower_movielens/infer")
ROWS = int(os.environ.get("SERVE_ROWS", "1"))
USERS = [int(v) for v in os.environ.get("SERVE_USERS", "1").split(",")]
MOVIES = [int(v) for v in os.environ.get("SERVE_MOVIES", "1").split(",")]


def body(rng: random.Random) -> bytes:
    return json.dumps(
        {
            "inputs": [
                {"name": "userId", "datatype": "INT64", "shape": [ROWS], "data": rng.choices(USERS, k=ROWS)},
                {"name": "movieId", "datatype": "INT64", "shape": [ROWS], "data": rng.choices(MOVIES, k=ROWS)},
            ]
        }
    ).encode()


class Client(FastHttpUser):
    def on_start(self) -> None:
        self.bodies = [body(random.Random(seed)) for seed in range(32)]
        self.next = 0

    @task
    def infer(self) -> None:
        self.next = (self.next + 1) % len(self.bodies)
        with self.client.post(
            PATH, data=self.bodies[self.next], headers={"Content-Type": "application/json"}, catch_response=True
        ) as response:
            if response.status_code != 200:
                response.failure(f"status {response.status_code}: {response.text[:200]}")
            elif len(json.loads(response.text)["outputs"][0]["data"]) != ROWS:
                response.failure("wrong number of scores")

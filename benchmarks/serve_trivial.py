"""serve-bench's ceiling: the cheapest aiohttp endpoint answering an infer path, with no model behind it.

    python benchmarks/serve_trivial.py --port P [--uvloop]

It reads the request's body and answers a fixed one-score JSON response (so serve-bench runs it at 1 row):
what one Python HTTP server process does per request before any parsing,
batching or model. Its requests/s, on the core `reccompile serve` gets, is the
ceiling any server on aiohttp reaches here. Started and stopped by
benchmarks/serve_bench.py.
"""

from __future__ import annotations

import argparse

from aiohttp import web

ANSWER = (
    b'{"model_name":"two_tower_movielens","model_version":"1",'
    b'"outputs":[{"name":"score","datatype":"FP32","shape":[1],"data":[0.5]}]}'
)


async def infer(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=ANSWER, content_type="application/json")


async def ready(_: web.Request) -> web.Response:
    return web.Response(text="{}", content_type="application/json")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--uvloop", action="store_true", help="run the event loop on uvloop")
    args = parser.parse_args()
    app = web.Application()
    app.add_routes([web.post("/v2/models/{name}/infer", infer), web.get("/v2/health/ready", ready)])
    loop = None
    if args.uvloop:
        import uvloop

        loop = uvloop.new_event_loop()
    web.run_app(app, host="127.0.0.1", port=args.port, access_log=None, print=None, loop=loop)

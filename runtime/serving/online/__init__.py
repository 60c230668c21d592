"""Serving online: `reccompile serve`, a thin layer over export directories.

    protocol.py   Open Inference Protocol (KServe v2) bodies <-> raw columns; bad requests -> 400
    raw_rows.py   raw columns -> a batch, through the readers' own parsing (as `predict` reads files)
    models.py     an export (ranking or retrieval) or a retrieval -> ranking pipeline, as one `predict`
    batcher.py    concurrent requests batched on the event loop, at max rows or max wait
    registry.py   the served models by name; reload swaps atomically
    watch.py      --watch: a new complete export in a served directory swapped in, a broken one refused
    metrics.py    Prometheus text
    app.py        the HTTP endpoints (aiohttp) and the serve loop (SIGTERM drains)

It holds no model or feature logic of its own: the export's model scores,
the readers' functions turn raw values into ids and floats.
"""

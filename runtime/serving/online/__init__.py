"""Serving online: `reccompile serve`, a thin layer over export directories.

    protocol.py   Open Inference Protocol (KServe v2) bodies <-> raw columns; bad requests -> 400
    raw_rows.py   raw columns -> a batch, through the readers' own parsing (as `predict` reads files)
    models.py     an export (ranking or retrieval) or a retrieval -> ranking pipeline, as one `predict`
    batcher.py    concurrent requests cut into batches at max rows or max wait
    registry.py   the served models by name; reload swaps atomically
    metrics.py    Prometheus text
    app.py        the HTTP endpoints (aiohttp) and the serve loop (SIGTERM drains)

It holds no model or feature logic of its own: the export's model scores,
the readers' functions turn raw values into ids and floats.
"""

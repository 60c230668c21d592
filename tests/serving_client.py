"""A `reccompile serve` process for tests, and a plain HTTP client for it (the standard library's).

    with started_server([out, "--max-wait-ms", "2"]) as server:
        status, headers, body = server.call("POST", "/v2/models/m/infer", {"inputs": [...]})

The server listens on 127.0.0.1, port 0 (the kernel picks a free one; the
server prints it), so tests running at once never collide. Leaving the
block sends SIGTERM and waits for the exit; `server.stop()` does so earlier
and returns the exit status and the output.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
START_SECONDS = 120


class Server:
    def __init__(self, process: subprocess.Popen, url: str, lines: list[str]) -> None:
        self.process, self.url, self.lines = process, url, lines

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.url.removeprefix("http://").rsplit(":", 1)
        return host, int(port)

    def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None, timeout: float = 30
    ) -> tuple[int, dict[str, str], Any]:
        """(status, headers, JSON or text body); a dict or list body is sent as JSON, bytes as they are."""
        data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                status, got, raw = response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            status, got, raw = error.code, dict(error.headers), error.read()
        text = raw.decode()
        return status, got, json.loads(text) if got.get("Content-Type", "").startswith("application/json") else text

    def metric(self, name: str) -> float:
        """One sample of /metrics, `name` with its labels as printed; 0 when absent."""
        _, _, text = self.call("GET", "/metrics")
        found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        return float(found.group(1)) if found else 0.0

    def stop(self) -> tuple[int, str]:
        """SIGTERM, then the exit status and everything printed."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        out, _ = self.process.communicate(timeout=60)
        return self.process.returncode, "".join(self.lines) + out


@contextlib.contextmanager
def started_server(args: list[str | Path], cwd: Path = REPO_ROOT) -> Iterator[Server]:
    command = [sys.executable, "-m", "compiler.cli", "serve", *map(str, args), "--port", "0", "--threads", "1"]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd)
    lines: list[str] = []
    try:
        assert process.stdout is not None
        for line in process.stdout:  # bounded: the server exits (EOF) or says where it listens
            lines.append(line)
            found = re.match(r"listening on (http://\S+)", line)
            if found:
                server = Server(process, found.group(1), lines)
                break
        else:
            raise AssertionError(f"the server exited with {process.wait()}:\n{''.join(lines)}")
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()

"""A data loader's workers start cleanly whatever the rank's other threads hold (runtime.process.workers).

A rank forks its loaders' workers while gloo's, Arrow's and the loaders' own
threads run. A worker forked from it inherits every lock one of them held at
that instant, held for good. Here a thread holds a lock that the reader takes
for each line, all the while the loader starts and reads: a forked worker
would never parse its first line. The run is a script in its own process, so
that the lock is the only one held and a hang ends at the timeout.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sample_files import RATINGS

REPO = Path(__file__).resolve().parents[3]

LOCKED = '''
import threading
from typing import Any

HELD = threading.Lock()  # taken by another thread of the process that starts the loader


class LockedReader:
    """A reader whose parse takes HELD for each line."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader
        for name in ("name", "source", "weighted", "unseen_features", "timestamps"):
            setattr(self, name, getattr(reader, name))

    def epoch_lines(self):
        return self.reader.epoch_lines()

    def parse(self, line: bytes) -> Any:
        with HELD:
            return self.reader.parse(line)

    def to_columns(self, rows):
        return self.reader.to_columns(rows)
'''

RUN = """
import sys
import threading
from pathlib import Path

from locked import HELD, LockedReader
from sample_files import movielens_spec, write_ml100k

from runtime.data.checks.bad_rows import BadRowLog
from runtime.data.loader import epoch_batches
from runtime.data.sources import DataChoice, open_reader

if __name__ == "__main__":
    data = write_ml100k(Path(sys.argv[1]))
    reader = LockedReader(open_reader(movielens_spec(), DataChoice("movielens", str(data))))
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        with HELD:
            taken.set()
            done.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    taken.wait()
    batches = epoch_batches(reader, global_batch=100, rank=0, world_size=1, bad_rows=BadRowLog("fail"), num_workers=1)
    rows = sum(batch.real for batch in batches)
    done.set()
    holder.join()
    print(rows)
"""


def test_a_worker_parses_while_another_thread_of_the_rank_holds_a_lock_it_takes(tmp_path: Path) -> None:
    (tmp_path / "locked.py").write_text(LOCKED)
    (tmp_path / "run.py").write_text(RUN)
    paths = [str(tmp_path), str(REPO / "tests" / "runtime" / "data"), str(REPO)]
    try:
        done = subprocess.run(
            [sys.executable, str(tmp_path / "run.py"), str(tmp_path / "ml-100k")],
            capture_output=True,
            text=True,
            timeout=120,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(paths)},
        )
    except subprocess.TimeoutExpired:
        raise AssertionError("the loader's worker never parsed a line: it inherited the other thread's lock") from None
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(len(RATINGS))]

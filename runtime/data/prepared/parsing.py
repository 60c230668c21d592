"""How many processes parse a prepare's raw files, and why: `--workers`, or chosen by the cores.

    choice = choose_parsing(files=3, workers=None)   # on a 4-core machine
    choice.describe()
    # 'with 3 parse processes, one per file (3 files on 4 usable cores: one kept for writing the parts)'

Parsed one process per file (runtime.data.prepared.by_file), every row is
also read back from its file part and stitched into the parts by the
prepare's own process, which therefore needs a core of its own: on a busy
2-core machine two files of 200k Criteo rows went at 10,246 rows/s with two
parse processes and 8,963 with one, against 11,566 line by line in one
process. So without `--workers` the files are parsed one process per file
only when there are several and at least `MIN_CORES` cores this process
may run on (`os.sched_getaffinity`), by as many processes as there are
files and cores but one; otherwise line by line in the prepare's process.
One file is read line by line too: DataLoader processes sharing its lines
send every parsed block back pickled, and one of them went at 8,300-8,500
rows/s against 9,600-14,500 in the prepare's own process (100k rows, the
same busy 2-core machine).
A prepare stopped part-way is continued in the mode it started in (its
journal says where to go on in that mode's terms: a file, or a line).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

MIN_CORES = 3  # parse processes, and one core for the stitching process


@dataclass(frozen=True, slots=True)
class ParseChoice:
    processes: int  # 0: line by line in the prepare's process
    by_file: bool  # one process per file (else, with processes >= 1, DataLoader processes sharing the lines)
    reason: str

    def describe(self) -> str:
        """How the files are parsed, to follow "parsing "."""
        if self.processes == 0:
            return f"line by line in this process ({self.reason})"
        how = "one per file" if self.by_file else "sharing the lines of the file"
        return f"with {_count(self.processes, 'parse process')}, {how} ({self.reason})"


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0))


def choose_parsing(files: int, workers: int | None, resumed_by_file: bool | None = None) -> ParseChoice:
    """How `files` raw files are parsed: by `workers` processes when given, else by the cores.

    `resumed_by_file`: how a stopped prepare being continued parsed (None: a new prepare)."""
    if workers is not None:
        given = f"--workers {workers}"
        if workers >= 1 and files > 1:
            return ParseChoice(min(workers, files), True, f"{given}, {files} files")
        return ParseChoice(workers, False, given)
    cores = usable_cores()
    on = f"{_count(files, 'file')} on {_count(cores, 'usable core')}"
    if resumed_by_file is not None:
        continued = "continuing a stopped prepare that parsed"
        if resumed_by_file:
            return ParseChoice(max(1, min(files, cores - 1)), True, f"{continued} one process per file; {on}")
        return ParseChoice(0, False, f"{continued} line by line")
    if files > 1 and cores >= MIN_CORES:
        return ParseChoice(min(files, cores - 1), True, f"{on}: one kept for writing the parts")
    if files > 1:
        return ParseChoice(0, False, f"{on}: one process per file needs {MIN_CORES} or more")
    return ParseChoice(0, False, f"{on}: one process per file needs 2 or more files")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{('es' if noun.endswith('s') else 's') if n != 1 else ''}"

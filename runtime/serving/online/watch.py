"""`--watch`: poll the served export directories and swap a new complete export in, refusing a broken one.

    await watch(slots, every=1.0, report=report)   # until cancelled; report(name, None | error)

Each slot's directories (the ones given on the command line) are polled every
`every` seconds. A new export is one whose manifest.json bytes (sha256)
differ from those the served model was loaded with (read just before its load). It is loaded once the
directory has held still for one poll (no file's size or mtime changed,
so an export still being copied is not read half-way), through the slot's
own reload, which checks every file's size and sha256 against the manifest:
a directory that is incomplete or corrupt is refused (`report(name, error)`,
`reccompile_reload_failures_total`) and the old model keeps serving; it is
tried again only when something in the directory changes. Requests in flight
finish on the model they started on (runtime.serving.online.registry).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from runtime.serving.online.registry import Slot, manifest_digests

__all__ = ["watch"]

Fingerprint = tuple[tuple[str, int, int], ...]


def fingerprint(directories: tuple[Path, ...]) -> Fingerprint:
    """(path, size, mtime_ns) of every file under the directories: changes when any file does."""
    found = []
    for directory in directories:
        for root, _, names in os.walk(directory):
            for name in names:
                try:
                    facts = os.stat(os.path.join(root, name))
                except OSError:  # removed while walking: the next poll sees the rest
                    continue
                found.append((os.path.join(root, name), facts.st_size, facts.st_mtime_ns))
    return tuple(sorted(found))


class _Watched:
    def __init__(self, name: str, slot: Slot) -> None:
        self.name, self.slot = name, slot
        self.refused: Fingerprint | None = None  # the directories as they were when last refused
        self.settling: Fingerprint | None = None  # as seen at the last poll, while waiting for them to hold still

    async def poll(self, report: Callable[[str, BaseException | None], None]) -> None:
        directories = self.slot.directories
        now = await asyncio.to_thread(fingerprint, directories)
        if now == self.refused:
            return
        digests = await asyncio.to_thread(manifest_digests, directories)
        if digests == self.slot.digests:  # the served export (back again, or reloaded by other means)
            self.refused = self.settling = None
            return
        if now != self.settling:  # still changing, or just seen: load it once it holds still for a poll
            self.settling = now
            return
        self.settling = None
        try:
            await asyncio.to_thread(self.slot.reload)
        except Exception as error:  # incomplete or corrupt: the old model keeps serving
            self.refused = now
            report(self.name, error)
            return
        self.refused = None
        report(self.name, None)


async def watch(slots: Mapping[str, Slot], every: float, report: Callable[[str, BaseException | None], None]) -> None:
    """Poll every `every` seconds until cancelled (see the module docstring)."""
    watched = [_Watched(name, slot) for name, slot in slots.items()]
    while True:
        await asyncio.sleep(every)
        for one in watched:
            await one.poll(report)

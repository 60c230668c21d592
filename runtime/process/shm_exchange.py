"""The ranks' all-to-alls through shared memory when they share a host; gloo otherwise.

Why: gloo moves an all-to-all between two processes on one host through
loopback TCP, and its own threads (the TCP loop and a worker) do the socket
work: about 13 ms of CPU per rank per step of dlrm-bench multihot dist2, taken
from the two cores the training threads run on. On one host the bytes can
simply be copied through memory, the intra-node path NCCL takes on GPUs:
the sender copies each destination's piece into a shared file mapping, the
receiver copies it out. The bits are the same; only the route changes.

`all_to_all_single` has `torch.distributed.all_to_all_single`'s signature
and meaning. Its first call on a group sets the group's transport up (a
collective: every rank makes it in the same order, as every collective):

- on a gloo group of CPU tensors, every rank tells the others its host
  (name and boot id) and pid; when all match, on Linux x86-64, the group
  exchanges through shared memory, else through gloo. `RECCOMPILE_EXCHANGE=gloo` always takes
  the backend; `=shm` requires shared memory and fails with a clear error
  where it cannot be had (`auto`, the default, falls back with a warning);
- a control file in `RECCOMPILE_SHM_DIR` (default /dev/shm), named after a
  token rank 0 draws for this group, holds the channels' counters. It is
  unlinked as soon as every rank has mapped it. Rank 0 first unlinks what
  runs whose ranks were all killed at once left behind (`sweep`).

Each ordered pair of ranks (src, dst) is a channel. Its sender keeps a
pool of buffers, each a file it maps; a piece goes into a free buffer (one
whose last piece was consumed; the smallest that holds it, else one grown:
a new file), and a new buffer is made when none is free, so however many
all-to-alls are in flight unwaited, a sender never waits to write. The
receiver unlinks each file as soon as it has mapped it, so between steps no
file remains, and a rank that finds its peer gone, or closes, unlinks what
is left of theirs or its own (`close_all` runs at exit too). The group's
n-th all-to-all has entry n % ENTRIES of each channel in the control:

- `posted` (the sender wrote op n's piece: n + 1) and `consumed` (the
  receiver copied it out: n + 1), 32-bit words waited on with futex, so a
  waiting rank sleeps in the kernel and costs no CPU;
- the buffer, its file's generation and the piece's size in bytes: a
  receiver that expects another size (the ranks disagree on the splits)
  raises, where gloo would abort the process or truncate.

An entry is reused ENTRIES ops later, once its op was consumed (a sender
waits for that only with ENTRIES ops unwaited). The sender writes at the
call (async or not), the receiver reads in `wait()`: the copies happen in
the calling thread, and nothing runs in the background. A waiting rank
checks every second whether its peer is alive and still has its transport
open, and fails with a message naming the peer when not. Ordering: x86-64
keeps stores in order (TSO), so a receiver that sees `posted` sees the
piece written before it.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import mmap
import os
import platform
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from runtime.process.lifetime import alive

log = logging.getLogger(__name__)

ENTRIES = 1024  # all-to-alls of a group in flight unwaited before a sender waits
STALE_S = 60.0  # a named file older than this, of a gone rank 0, is no live exchange's
_PREFIX = "reccompile-a2a-"
TIMEOUT_S = 1800.0  # as torch.distributed's default collective timeout
_POLL_S = 1.0  # how often a waiting rank checks its peer
_FIELDS = 4  # int32 words per (src, dst, entry): posted, consumed, buffer, generation
_POSTED, _CONSUMED, _BUFFER, _GENERATION = 0, 1, 2, 3
_MASK = 0x7FFFFFFF
_FUTEX_WAIT, _FUTEX_WAKE, _SYS_FUTEX = 0, 1, 202  # x86-64


class ExchangeError(RuntimeError):
    """The shared-memory exchange could not be set up, or a peer left it."""


def all_to_all_single(
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes: Sequence[int] | None,
    input_split_sizes: Sequence[int] | None,
    group: dist.ProcessGroup,
    async_op: bool = False,
) -> Any:
    """`dist.all_to_all_single` between the ranks of `group`, through shared memory on one host."""
    transport = _transport(group) if input.device.type == "cpu" else None
    if transport is None:
        return dist.all_to_all_single(
            output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op
        )
    work = transport.start(output, input, output_split_sizes, input_split_sizes)
    if async_op:
        return work
    work.wait()
    return None


def shares_memory(group: dist.ProcessGroup) -> bool:
    """Whether `group`'s all-to-alls go through shared memory (its first call is a collective, as
    `all_to_all_single`'s first is)."""
    return _transport(group) is not None


def close_all() -> None:
    """Close every group's transport (before the process group ends): unmap, unlink, tell the peers."""
    for transport in list(_TRANSPORTS.values()):
        if transport is not None:
            transport.close()
    _TRANSPORTS.clear()


_TRANSPORTS: weakref.WeakKeyDictionary[Any, _Shared | None] = weakref.WeakKeyDictionary()
_setup_lock = threading.Lock()
atexit.register(close_all)


def _transport(group: dist.ProcessGroup) -> _Shared | None:
    if group in _TRANSPORTS:
        return _TRANSPORTS[group]
    with _setup_lock:
        if group not in _TRANSPORTS:
            _TRANSPORTS[group] = setup(group, os.environ.get("RECCOMPILE_EXCHANGE", "auto"), shm_dir())
        return _TRANSPORTS[group]


def shm_dir() -> str:
    return os.environ.get("RECCOMPILE_SHM_DIR", "/dev/shm")


def host_key() -> str:
    """This host as the ranks compare it: its name and its boot's id."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def shared_memory_refusal(hosts: Sequence[str], machines: Sequence[str]) -> str | None:
    """Why the ranks cannot exchange through shared memory (None: they can)."""
    if len(set(hosts)) > 1:
        return f"the ranks run on {len(set(hosts))} hosts"
    if any(m != "Linux/x86_64" for m in machines):
        return f"shared memory is used on Linux x86-64 only (a rank runs on {sorted(set(machines))})"
    return None


def setup(group: dist.ProcessGroup, mode: str, directory: str) -> _Shared | None:
    """The group's transport (None: its own backend), agreed on by all its ranks (a collective)."""
    if mode not in ("auto", "gloo", "shm"):
        raise ExchangeError(f"RECCOMPILE_EXCHANGE={mode!r}: expected auto, gloo or shm")
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    if mode == "gloo" or world_size == 1 or dist.get_backend(group) != "gloo":
        return None  # NCCL moves CUDA tensors its own way
    if rank == 0:
        sweep(directory)
    token = f"{_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
    me = (host_key(), f"{platform.system()}/{platform.machine()}", os.getpid(), token)
    everyone: list[Any] = [None] * world_size
    dist.all_gather_object(everyone, me, group=group)
    refusal = shared_memory_refusal([e[0] for e in everyone], [e[1] for e in everyone])
    if refusal is not None:
        if mode == "shm":
            raise ExchangeError(f"RECCOMPILE_EXCHANGE=shm: {refusal}")
        return None
    token, pids = everyone[0][3], [e[2] for e in everyone]
    transport, error = None, ""
    try:
        transport = _Shared(directory, token, rank, pids, create=rank == 0) if rank == 0 else None
    except OSError as e:
        error = f"rank {rank} cannot create {os.path.join(directory, token)}: {e.strerror}"
    errors: list[Any] = [None] * world_size
    dist.all_gather_object(errors, error, group=group)  # rank 0's control file exists (or failed) from here
    if rank and not errors[0]:
        try:
            transport = _Shared(directory, token, rank, pids, create=False)
        except OSError as e:
            error = f"rank {rank} cannot open {os.path.join(directory, token)}: {e.strerror}"
    dist.all_gather_object(errors, error, group=group)  # every rank has mapped it, or said why not
    if rank == 0:
        _unlink(os.path.join(directory, token))
    failed = [e for e in errors if e]
    if failed:
        if transport is not None:
            transport.close()
        if mode == "shm":
            raise ExchangeError(f"the shared-memory exchange could not be set up: {failed[0]}")
        log.warning("reccompile: all-to-alls go through the process group's backend: %s", failed[0])
        return None
    return transport


def sweep(directory: str, now: float | None = None) -> list[str]:
    """Unlink the files of exchanges whose rank 0 is gone, named for over STALE_S seconds; the
    names unlinked.

    Every way a run ends unlinks its files but one: all its ranks killed at once, between a
    post and its receiver's mapping. Such a file keeps its rank 0's pid in its name (the token),
    and a live exchange's files keep their names for milliseconds, so a dead pid and an old
    name together mean no rank will ever map it.
    """
    now = time.time() if now is None else now
    swept = []
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            pid = entry.name.removeprefix(_PREFIX).split("-", 1)[0]
            if entry.name == pid or not pid.isdigit() or alive(int(pid)):
                continue
            with contextlib.suppress(OSError):
                if now - entry.stat(follow_symlinks=False).st_ctime > STALE_S:
                    os.unlink(entry.path)
                    swept.append(entry.name)
    return swept


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


_libc = ctypes.CDLL(None, use_errno=True)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_POLL = _Timespec(int(_POLL_S), int((_POLL_S % 1) * 1e9))


def _futex_wait(address: int, value: int) -> None:
    """Sleep while the word at `address` holds `value`, at most _POLL_S (the GIL is released)."""
    _libc.syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAIT, value, ctypes.byref(_POLL), None, 0)


def _futex_wake(address: int) -> None:
    _libc.syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAKE, _MASK, None, None, 0)


class _Mapping:
    """One file mapped shared, with a byte tensor over it."""

    def __init__(self, path: str, size: int, create: bool) -> None:
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            size = os.fstat(fd).st_size
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.size = size
        self.bytes = torch.frombuffer(self.map, dtype=torch.uint8) if size else torch.empty(0, dtype=torch.uint8)

    def view(self, nbytes: int, dtype: torch.dtype) -> torch.Tensor:
        return self.bytes[:nbytes].view(dtype)

    def close(self) -> None:
        del self.bytes
        self.map.close()


class _Shared:
    """The shared-memory channels of one group, as seen from `rank` (see the module docstring)."""

    def __init__(self, directory: str, token: str, rank: int, pids: Sequence[int], create: bool) -> None:
        self.directory, self.token, self.rank, self.pids = directory, token, rank, list(pids)
        self.world_size = len(self.pids)
        entries = self.world_size * self.world_size * ENTRIES
        words = entries * _FIELDS
        self._control = _Mapping(os.path.join(directory, token), 4 * (words + self.world_size) + 8 * entries, create)
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(self._control.map))
        self._words = (ctypes.c_int32 * (words + self.world_size)).from_buffer(self._control.map)
        self._sizes = (ctypes.c_int64 * entries).from_buffer(self._control.map, 4 * (words + self.world_size))
        self._open_word = words  # + rank: 1 while that rank's transport is open
        self._words[self._open_word + rank] = 1
        self._pools: list[list[_Buffer]] = [[] for _ in range(self.world_size)]  # per destination
        self._received: dict[tuple[int, int], tuple[int, _Mapping]] = {}  # (src, buffer): (generation, file)
        self._ops = 0
        self._lock = threading.Lock()
        self._closed = False

    def _index(self, src: int, dst: int, entry: int) -> int:
        return (src * self.world_size + dst) * ENTRIES + entry

    def _word(self, src: int, dst: int, entry: int, field: int) -> int:
        return self._index(src, dst, entry) * _FIELDS + field

    def _file(self, src: int, dst: int, buffer: int, generation: int) -> str:
        return os.path.join(self.directory, f"{self.token}-{src}-{dst}-{buffer}-{generation}")

    def start(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: Sequence[int] | None,
        input_split_sizes: Sequence[int] | None,
    ) -> _Work:
        """Write this rank's pieces for op n; the returned work reads the others' in `wait()`."""
        if self._closed:
            raise ExchangeError("the shared-memory exchange of this group is closed")
        if output.dtype != input.dtype:
            raise ValueError(f"all_to_all_single: output is {output.dtype}, input {input.dtype}")
        sent = _pieces(input, input_split_sizes, self.world_size)
        received = _pieces(output, output_split_sizes, self.world_size)
        with self._lock:
            op, self._ops = self._ops, self._ops + 1
        entry, mark = op % ENTRIES, (op + 1) & _MASK
        for dst in range(self.world_size):
            if dst != self.rank:
                self._post(dst, entry, op, mark, sent[dst])
        received[self.rank].copy_(sent[self.rank])
        return _Work(self, entry, mark, received)

    def _post(self, dst: int, entry: int, op: int, mark: int, piece: torch.Tensor) -> None:
        if op >= ENTRIES:  # the entry's previous op must be consumed
            self._await(self._word(self.rank, dst, entry, _CONSUMED), (op + 1 - ENTRIES) & _MASK, dst, "consume")
        nbytes = piece.numel() * piece.element_size()
        buffer = -1
        if nbytes:
            buffer = self._buffer(dst, nbytes)
            held = self._pools[dst][buffer]
            held.mapping.view(nbytes, piece.dtype).view(piece.shape).copy_(piece)
            held.carries = (self._word(self.rank, dst, entry, _CONSUMED), mark)
            self._words[self._word(self.rank, dst, entry, _GENERATION)] = held.generation
        self._words[self._word(self.rank, dst, entry, _BUFFER)] = buffer
        self._sizes[self._index(self.rank, dst, entry)] = nbytes
        word = self._word(self.rank, dst, entry, _POSTED)
        self._words[word] = mark
        _futex_wake(self._base + 4 * word)

    def _buffer(self, dst: int, nbytes: int) -> int:
        """A free buffer to `dst` that holds `nbytes`: the smallest that does, else one grown or made."""
        pool = self._pools[dst]
        free = [
            i
            for i, held in enumerate(pool)
            if held.carries is None or _reached(self._words[held.carries[0]], held.carries[1])
        ]
        fitting = [i for i in free if pool[i].mapping.size >= nbytes]
        if fitting:
            return min(fitting, key=lambda i: pool[i].mapping.size)
        if free:
            index = max(free, key=lambda i: pool[i].mapping.size)
            generation, size = pool[index].generation + 1, max(nbytes, 2 * pool[index].mapping.size)
        else:
            index, generation, size = len(pool), 0, nbytes
        size = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        try:
            mapping = _Mapping(self._file(self.rank, dst, index, generation), size, create=True)
        except OSError as e:
            raise ExchangeError(
                f"rank {self.rank} cannot create a {size}-byte exchange file in {self.directory}: {e.strerror}"
            ) from None
        if index < len(pool):
            pool[index].mapping.close()
            pool[index] = _Buffer(mapping, generation)
        else:
            pool.append(_Buffer(mapping, generation))
        return index

    def read(self, src: int, entry: int, mark: int, piece: torch.Tensor) -> None:
        """Copy src's piece of the op marked `mark` into `piece`, then mark it consumed."""
        self._await(self._word(src, self.rank, entry, _POSTED), mark, src, "send")
        nbytes = piece.numel() * piece.element_size()
        posted = self._sizes[self._index(src, self.rank, entry)]
        if posted != nbytes:
            raise ExchangeError(
                f"rank {src} sent {posted} bytes to rank {self.rank}, which expects {nbytes}: "
                "the ranks disagree on the all-to-all's split sizes"
            )
        if nbytes:
            buffer = self._words[self._word(src, self.rank, entry, _BUFFER)]
            generation = self._words[self._word(src, self.rank, entry, _GENERATION)]
            known = self._received.get((src, buffer))
            if known is None or known[0] != generation:
                if known is not None:
                    known[1].close()
                path = self._file(src, self.rank, buffer, generation)
                mapping = _Mapping(path, 0, create=False)
                _unlink(path)  # both ends have it mapped: the name is no longer needed
                self._received[(src, buffer)] = known = (generation, mapping)
            piece.copy_(known[1].view(nbytes, piece.dtype).view(piece.shape))
        word = self._word(src, self.rank, entry, _CONSUMED)
        self._words[word] = mark
        _futex_wake(self._base + 4 * word)

    def _await(self, word: int, mark: int, peer: int, what: str) -> None:
        """Until the word holds `mark`, sleeping on it; fail if the peer is gone or the time is up."""
        deadline = None
        while True:
            value = self._words[word]
            if value == mark:
                return
            if deadline is None:
                deadline = time.monotonic() + TIMEOUT_S
            elif time.monotonic() > deadline:
                raise ExchangeError(f"rank {self.rank} waited {TIMEOUT_S:.0f} s for rank {peer} to {what} its data")
            if not self._words[self._open_word + peer] or not alive(self.pids[peer]):
                self._unlink_files_of(peer)
                raise ExchangeError(
                    f"rank {peer} (pid {self.pids[peer]}) left the shared-memory exchange "
                    f"while rank {self.rank} waited for it to {what} its data"
                )
            _futex_wait(self._base + 4 * word, value)

    def _unlink_files_of(self, sender: int) -> None:
        """The files `sender` made that still have a name (a receiver unlinks each once it mapped it)."""
        prefix = f"{self.token}-{sender}-"
        for name in os.listdir(self.directory):
            if name.startswith(prefix):
                _unlink(os.path.join(self.directory, name))

    def close(self) -> None:
        """Unmap every file, unlink those this rank made, and tell the peers it is gone."""
        if self._closed:
            return
        self._closed = True
        self._words[self._open_word + self.rank] = 0
        for peer in range(self.world_size):  # wake a peer sleeping on this rank
            if peer != self.rank:
                for entry in range(ENTRIES):
                    _futex_wake(self._base + 4 * self._word(peer, self.rank, entry, _CONSUMED))
                    _futex_wake(self._base + 4 * self._word(self.rank, peer, entry, _POSTED))
        self._unlink_files_of(self.rank)  # the pieces no receiver mapped yet
        for mapping in [*(b.mapping for pool in self._pools for b in pool), *(m for _, m in self._received.values())]:
            mapping.close()
        self._pools.clear()
        self._received.clear()
        del self._words, self._sizes
        self._control.close()


def _reached(value: int, mark: int) -> bool:
    """Whether a counter holding `value` has reached `mark` (marks count up, modulo 2**31)."""
    return (value - mark) & _MASK < _MASK // 2


def _pieces(tensor: torch.Tensor, split_sizes: Sequence[int] | None, world_size: int) -> list[torch.Tensor]:
    """`tensor`'s pieces along dim 0, one per rank (equal ones where no sizes are given)."""
    if not tensor.is_contiguous():
        raise ValueError("all_to_all_single: tensors must be contiguous")
    rows = tensor.shape[0]
    sizes = list(split_sizes) if split_sizes else [rows // world_size] * world_size
    if len(sizes) != world_size or sum(sizes) != rows:
        raise ValueError(f"all_to_all_single: split sizes {sizes} do not cut {rows} rows into {world_size}")
    return list(tensor.split(sizes))


class _Buffer:
    """One of a sender's buffers to a destination: its file, and the (consumed word, mark) of the
    last piece it carried (None: never used)."""

    def __init__(self, mapping: _Mapping, generation: int) -> None:
        self.mapping, self.generation = mapping, generation
        self.carries: tuple[int, int] | None = None


class _Work:
    """An op in flight: this rank's pieces are posted; `wait()` copies the peers' in."""

    def __init__(self, shared: _Shared, entry: int, mark: int, received: list[torch.Tensor]) -> None:
        self._shared, self._entry, self._mark = shared, entry, mark
        self._received: list[torch.Tensor] | None = received  # None once waited for

    def wait(self, timeout: Any = None) -> bool:
        if self._received is not None:
            received, self._received = self._received, None
            for src, piece in enumerate(received):
                if src != self._shared.rank:
                    self._shared.read(src, self._entry, self._mark, piece)
        return True

    def is_completed(self) -> bool:
        return self._received is None

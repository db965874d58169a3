"""CPU runtime helpers: torch thread counts (used by the two-call kernel path and by the
recorder) and glibc's malloc thresholds, with the trim that bounds what they keep (set by
``focus_lab.hf.models.load_model``)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import sys
import threading
import time

import torch

#: environment variable: "0" keeps glibc's default malloc thresholds (``keep_freed_memory`` does nothing)
ENV_KEEP_FREED_MEMORY = "FOCUS_LAB_KEEP_FREED_MEMORY"
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, <malloc.h>
_kept = False
_heap_at_last_trim = 0  # bytes in glibc's heaps when trim_freed_memory last trimmed
TRIM_INTERVAL_S = 2.0  # how often the trim thread looks at the heap, seconds


class _MallInfo2(ctypes.Structure):  # <malloc.h> struct mallinfo2 (glibc >= 2.33)
    _fields_ = [(f, ctypes.c_size_t) for f in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]


@functools.lru_cache(maxsize=1)
def _glibc():
    """glibc's handle with ``mallinfo2`` and ``malloc_trim`` typed, or None (not glibc, or older than 2.33)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


def trim_freed_memory(growth_bytes: int) -> bool:
    """Hand glibc's free heap pages back to the kernel (``malloc_trim(0)``) when its heaps have
    grown by more than ``growth_bytes`` since the last trim (``mallinfo2().arena``, all arenas;
    since the start before the first trim).

    With ``keep_freed_memory``'s thresholds large tensors come from the heap, and a freed one
    can leave a hole that the next, slightly different allocation does not fit: the heap then
    grows by about one such tensor per forward. Measured: ``layer_budget`` at 4096 tokens on one
    torch thread grew by 0.79 GB (one (4096, 49152) float32 logits tensor) per window and was
    killed for memory at 13 GB RSS beside another at 23 GB (24 GiB machine); a trim brought
    such a process from 3.0 GB back to 1.1 GB in 0.18 s. A heap that is reused, however much of
    it is free between forwards, does not grow past its size at the last trim, so it is not
    trimmed and the forward keeps its speed.

    Args:
        growth_bytes: bytes the heaps may grow by between trims.
    Returns:
        True when it trimmed. False where glibc's ``mallinfo2`` is missing.
    """
    global _heap_at_last_trim
    libc = _glibc()
    if libc is None:
        return False
    heap = int(libc.mallinfo2().arena)
    if heap - _heap_at_last_trim <= growth_bytes:
        return False
    libc.malloc_trim(0)
    _heap_at_last_trim = heap  # the high-water mark: a trim shrinks the heap only at its top
    return True


def release_freed_memory() -> bool:
    """Hand every free page of glibc's heaps back to the kernel now (``malloc_trim(0)``), whatever
    the heaps grew by: for a caller that knows its large tensors are dead and the next ones will
    not fit the holes they left.

    The recorder calls it after each window's body forward and after each window
    (``recording.recorder.record_run``): on Gemma-3-270M the body's freed activations stayed in
    the heap while the output head's (512, 262,144) float32 slices, larger than any hole, grew it
    again, and each window added more. Measured (one torch thread, 4096 tokens, every metric):
    the resident set after a window's head 4.03 GiB, 1.84 GiB after the trim; without a trim
    the next window's head ended at 5.04 GiB, with it 4.38 GiB.

    Returns:
        True when it trimmed; False where glibc's ``mallinfo2`` is missing (not glibc, or older
        than 2.33).
    """
    global _heap_at_last_trim
    libc = _glibc()
    if libc is None:
        return False
    heap = int(libc.mallinfo2().arena)
    libc.malloc_trim(0)
    _heap_at_last_trim = heap
    return True


def _trim_loop(growth_bytes: int) -> None:
    while True:
        time.sleep(TRIM_INTERVAL_S)
        trim_freed_memory(growth_bytes)


def default_trim_growth() -> int:
    """The trim thread's ``growth_bytes``: an eighth of the machine's physical memory (2.9 GiB
    on a 23.5 GiB machine), so two jobs side by side stay well inside it. Bytes."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 8


def keep_freed_memory(limit_bytes: int = 2**31 - 1) -> bool:
    """Let glibc's malloc serve large tensors from its heap and keep freed memory for reuse.

    By default glibc maps every allocation above its mmap threshold (at most 32 MiB) fresh from
    the kernel and unmaps it when freed. A forward over thousands of tokens allocates such
    tensors in every op (one MLP activation at 8192 tokens: 8192 x 1536 float32 = 50 MB), so each
    op first page-faults through fresh zeroed pages. Raising the mmap and trim thresholds to
    ``limit_bytes`` (via ``mallopt``) lets later allocations reuse the freed memory. Measured
    (figures/bench_attention/RUNS.md, "prefill at 8192 with glibc's default malloc thresholds"
    against the prefill at 8192 with them raised): a bare forward of 8192
    tokens of SmolLM2-135M on a 2-core AMD EPYC, 1 torch thread, dense 88.7 -> 106.5 tokens/s,
    hard top-1 120.9 -> 151.6. Results do not change: only where memory comes from.

    Process-global and idempotent. Memory the process frees stays with it (returned to the
    allocator, not to the kernel), up to a bound: a daemon thread ("focus-lab-trim") looks at
    the heap every TRIM_INTERVAL_S seconds and calls ``trim_freed_memory(default_trim_growth())``,
    so the free pages of a heap that keeps growing (holes the next tensor does not fit) go
    back to the kernel. Does nothing, and returns False, where libc is not glibc (macOS, musl)
    or when the environment sets ``FOCUS_LAB_KEEP_FREED_MEMORY=0``. Where glibc is older than
    2.33 (no ``mallinfo2``) the thresholds stay at glibc's defaults: without the bound, no raise.

    Args:
        limit_bytes: the new thresholds, bytes (at most 2**31 - 1, mallopt's int).
    Returns:
        True when the thresholds are set (by this call or a former one).
    """
    global _kept
    if _kept:
        return True
    if os.environ.get(ENV_KEEP_FREED_MEMORY, "1") == "0" or not sys.platform.startswith("linux"):
        return False
    libc = _glibc()
    if libc is None:  # not glibc, or no mallinfo2 to bound what is kept
        return False
    libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _kept = bool(libc.mallopt(_M_MMAP_THRESHOLD, limit_bytes)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, limit_bytes))
    if _kept:
        threading.Thread(target=_trim_loop, args=(default_trim_growth(),), name="focus-lab-trim",
                         daemon=True).start()
    return _kept


@contextlib.contextmanager
def torch_threads(n: int):
    """Run the enclosed work on ``n`` torch threads, then restore the previous count.

    On a shared machine a parallel op over small tensors can wait tens of milliseconds for a
    descheduled worker thread; one thread never waits. Process-global: not thread-safe.
    """
    old = torch.get_num_threads()
    if n == old:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)

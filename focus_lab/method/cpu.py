"""CPU runtime helpers: torch thread counts (used by the two-call kernel path and by the
recorder) and glibc's malloc thresholds (set by ``focus_lab.hf.models.load_model``)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import sys

import torch

#: environment variable: "0" keeps glibc's default malloc thresholds (``keep_freed_memory`` does nothing)
ENV_KEEP_FREED_MEMORY = "FOCUS_LAB_KEEP_FREED_MEMORY"
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, <malloc.h>
_kept = False


def keep_freed_memory(limit_bytes: int = 2**31 - 1) -> bool:
    """Let glibc's malloc serve large tensors from its heap and keep freed memory for reuse.

    By default glibc maps every allocation above its mmap threshold (at most 32 MiB) fresh from
    the kernel and unmaps it when freed. A forward over thousands of tokens allocates such
    tensors in every op (one MLP activation at 8192 tokens: 8192 x 1536 float32 = 50 MB), so each
    op first page-faults through fresh zeroed pages. Raising the mmap and trim thresholds to
    ``limit_bytes`` (via ``mallopt``) lets later allocations reuse the freed memory. Measured
    (docs/results.md "Speed", runs D and E of figures/bench_attention): a bare forward of 8192
    tokens of SmolLM2-135M on a 2-core AMD EPYC, 1 torch thread, dense 88.7 -> 106.5 tokens/s,
    hard top-1 120.9 -> 151.6. Results do not change: only where memory comes from.

    Process-global and idempotent. Memory the process frees stays with it until it exits
    (returned to the allocator, not to the kernel). Does nothing, and returns False, where libc
    is not glibc (macOS, musl) or when the environment sets ``FOCUS_LAB_KEEP_FREED_MEMORY=0``.

    Args:
        limit_bytes: the new thresholds, bytes (at most 2**31 - 1, mallopt's int).
    Returns:
        True when the thresholds are set (now or by an earlier call).
    """
    global _kept
    if _kept:
        return True
    if os.environ.get(ENV_KEEP_FREED_MEMORY, "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _kept = bool(mallopt(_M_MMAP_THRESHOLD, limit_bytes)) and bool(mallopt(_M_TRIM_THRESHOLD, limit_bytes))
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

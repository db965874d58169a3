"""A helper for CPU thread counts (used by the two-call kernel path and by the recorder)."""

from __future__ import annotations

import contextlib

import torch


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

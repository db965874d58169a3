"""keep_freed_memory: glibc keeps a freed large tensor's pages for reuse (measured through the
process's resident memory, in a fresh interpreter each, since the setting is process-global)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

RSS = """
def rss():  # resident pages, bytes
    return int(open("/proc/self/statm").read().split()[1]) * 4096
"""

SCRIPT = RSS + """
import json, torch
from focus_lab.method.cpu import keep_freed_memory
kept = keep_freed_memory()
before = rss()
x = torch.ones(64 * 1024 * 1024 // 4)  # 64 MiB, above glibc's largest default mmap threshold (32 MiB)
during = rss()
del x
after = rss()
print(json.dumps({"kept": kept, "grew": during - before, "returned": during - after}))
"""


def _run(env_value: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "FOCUS_LAB_KEEP_FREED_MEMORY"}
    if env_value is not None:
        env["FOCUS_LAB_KEEP_FREED_MEMORY"] = env_value
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_freed_tensor_stays_with_the_process_and_the_default_returns_it():
    mib = 1024 * 1024
    on = _run(None)
    assert on["kept"] is True
    assert on["grew"] > 60 * mib                  # the tensor was resident
    assert on["returned"] < 4 * mib               # ... and stays after del: reused by the next op
    off = _run("0")                               # opt out: glibc's default, munmap on free
    assert off["kept"] is False
    assert off["returned"] > 60 * mib


HOLES = RSS + """
import json, torch
from focus_lab.method.cpu import _glibc, keep_freed_memory, release_freed_memory, trim_freed_memory
def heap_free_bytes():  # glibc's free heap bytes, all arenas
    return _glibc().mallinfo2().fordblks
assert keep_freed_memory()
mib = 1024 * 1024
big, small = [], []
for i in range(16):  # 40 MiB tensors from the heap, each pinned in place by a small one after it
    big.append(torch.ones(40 * mib // 4))
    small.append(torch.ones(mib // 4))
free0 = heap_free_bytes()
del big  # 640 MiB of holes: free in the heap, still resident, and not at its top
held = rss()
free1 = heap_free_bytes()
"""

TRIM_SCRIPT = HOLES + """
trimmed = trim_freed_memory(100 * mib)
after = rss()
again = trim_freed_memory(100 * mib)  # the heap has not grown since: no second trim
print(json.dumps({"freed": free1 - free0, "held": held, "after": after, "trimmed": trimmed, "again": again}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim: Linux only")
def test_trim_hands_back_the_holes_freed_tensors_leave_once_they_pass_the_bound():
    mib = 1024 * 1024
    out = subprocess.run([sys.executable, "-c", TRIM_SCRIPT], capture_output=True, text=True, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["freed"] >= 600 * mib                # the 16 x 40 MiB are free heap memory now
    assert r["trimmed"] is True
    assert r["held"] - r["after"] > 500 * mib     # ... and their pages went back to the kernel
    assert r["again"] is False


RELEASE_SCRIPT = HOLES + """
bounded = trim_freed_memory(64 * 1024 * mib)  # under a 64 GiB bound the trim thread would keep them
released = release_freed_memory()
after = rss()
print(json.dumps({"held": held, "after": after, "bounded": bounded, "released": released}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim: Linux only")
def test_release_hands_back_the_holes_whatever_the_heap_grew_by():
    mib = 1024 * 1024
    out = subprocess.run([sys.executable, "-c", RELEASE_SCRIPT], capture_output=True, text=True, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["bounded"] is False                  # the bounded trim keeps them ...
    assert r["released"] is True
    assert r["held"] - r["after"] > 500 * mib     # ... the release hands their pages back

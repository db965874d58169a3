"""Atomic file and directory writes: a reader never sees a half-written artifact."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    import pandas as pd


class ArtifactError(RuntimeError):
    """An artifact could not be written or read; the message names the path and the fix."""


def file_sha256(path: str | Path) -> str:
    """sha256 (hex) of a file's bytes, read in 1 MiB chunks: the identity of a router file or
    an artifact in every table and manifest."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _explain_os_error(path: Path, e: OSError) -> ArtifactError:
    if e.errno == errno.ENOSPC:
        return ArtifactError(f"no space left on the device while writing {path}: free disk space "
                             "or choose another output directory")
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return ArtifactError(f"permission denied writing {path}: choose a writable output directory")
    return ArtifactError(f"could not write {path}: {e}")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it onto ``path`` only on success.

    Works for files and directories. On an exception the temporary is removed and the
    previous ``path`` (if any) is untouched. Raises ArtifactError on disk-full or permission
    errors, with the path and the fix.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        os.unlink(tmp_name)
    except OSError as e:
        raise _explain_os_error(path, e) from e
    tmp = Path(tmp_name)
    try:
        yield tmp
        if path.is_dir() and tmp.is_dir():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except OSError as e:
        raise _explain_os_error(path, e) from e
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.exists():
            tmp.unlink()


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str))


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8), atomically: a reader sees the old file or the new one, never half."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_parquet(path: str | os.PathLike, df) -> None:
    """Write a pandas DataFrame as parquet (pyarrow), atomically."""
    with atomic_path(path) as tmp:
        df.to_parquet(tmp, index=False)


def with_table(path: Path, new: "pd.DataFrame", name: str, column: str = "table") -> "pd.DataFrame":
    """The rows of the committed parquet ``path`` with those of table ``name`` replaced by ``new``
    (which gets ``column`` = name as its first column): the one rule every ``--commit`` of the
    analyses follows (length table cells, passkey tables, layer-budget studies). ``new`` alone
    when the file is absent. The caller writes the result (``write_parquet``)."""
    import pandas as pd
    new = new.copy()
    if column in new:
        new = new.drop(columns=column)
    new.insert(0, column, name)
    old = pd.read_parquet(path) if Path(path).is_file() else None
    if old is None or column not in old:
        return new.reset_index(drop=True)
    return pd.concat([old[old[column] != name], new], ignore_index=True)


def machine() -> dict:
    """The machine a measurement ran on, for the record beside its numbers: CPU model, logical
    cores (``nproc``), memory (``mem_gib``, GiB), platform, torch version and threads, and the GPU
    name and CUDA version when one is visible. Never raises (a field it cannot read is left out)."""
    import platform

    env: dict = {"nproc": os.cpu_count(), "platform": platform.platform(), "cpu_model": platform.machine()}
    try:
        env["cpu_model"] = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if "model name" in l)
    except (OSError, StopIteration):
        pass
    try:
        import psutil
        env["mem_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    except Exception:  # noqa: BLE001 - psutil missing or unreadable: leave the field out
        pass
    try:
        import torch
        env.update(torch=torch.__version__, threads=torch.get_num_threads())
        if torch.cuda.is_available():
            env.update(gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda)
    except Exception:  # noqa: BLE001
        pass
    return env


def machine_line(env: dict) -> str:
    """``machine()``'s record as one line: "AMD EPYC ..., 2 cores, 23.4 GiB, no GPU"."""
    parts = [env.get("cpu_model", "unknown CPU"), f"{env.get('nproc', '?')} cores"]
    if "mem_gib" in env:
        parts.append(f"{env['mem_gib']:g} GiB")
    parts.append(env["gpu"] if env.get("gpu") else "no GPU")
    return ", ".join(parts)


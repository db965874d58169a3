"""Router files shipped inside the package, used when ``--routers`` is not given.

``focus_lab/routers/MANIFEST.json`` lists, per base model name (``models.load_model``'s
name), the file, its sha256 and its provenance (command, data, steps, seconds); the file's
own metadata carries the FocusConfig and the base model's identity (config and embedding
checksums), so ``retrofit.load_routers`` refuses it on another model.
"""

from __future__ import annotations

import json
from pathlib import Path

from focus_lab.io import ArtifactError, file_sha256

ROUTER_DIR = Path(__file__).resolve().parent.parent / "routers"
MANIFEST = ROUTER_DIR / "MANIFEST.json"


def manifest() -> dict:
    """{model name: {"file", "sha256", "provenance"...}} of the shipped router files ({} if none)."""
    if not MANIFEST.is_file():
        return {}
    return json.loads(MANIFEST.read_text())


def shipped_router_file(model_name: str | None = None) -> Path:
    """Path of the shipped router file for ``model_name`` (None: the embedded SmolLM2-135M),
    checked against the manifest's sha256.

    Raises:
        ArtifactError: no router file ships for that model, or the shipped file is missing or
            corrupted (its sha256 differs); the message names the file and ``focus-lab train``.
    """
    from focus_lab.hf.models import EMBEDDED
    name = EMBEDDED if model_name in (None, "", "embedded") else model_name
    entry = manifest().get(name)
    if entry is None:
        raise ArtifactError(f"no router file ships with focus-lab for model {name!r}: train one with "
                            f"'focus-lab train --model {name} --out checkpoints/x' and pass "
                            "--routers checkpoints/x/routers.safetensors")
    path = ROUTER_DIR / entry["file"]
    if not path.is_file():
        raise ArtifactError(f"the shipped router file {path} is missing: reinstall focus-lab, or "
                            "train routers with 'focus-lab train' and pass --routers")
    digest = file_sha256(path)
    if digest != entry["sha256"]:
        raise ArtifactError(f"the shipped router file {path} is corrupted (sha256 {digest[:12]}, "
                            f"expected {entry['sha256'][:12]}): reinstall focus-lab, or train routers "
                            "with 'focus-lab train' and pass --routers")
    return path


def same_tensor_shas(sha256: str) -> set[str]:
    """sha256 of the router files that hold exactly the tensors of the file with ``sha256`` under
    another saved config, as the manifest records for a shipped file (``same_tensors_sha256``:
    e.g. the file with every layer routed, whose tensors ship with
    ``random_layers`` 1-9). Results made with such a file under the same config are this file's
    results (``analyses.length_table.same_router_rows``). Empty for any other file."""
    for entry in manifest().values():
        if entry.get("sha256") == sha256:
            return set(entry.get("same_tensors_sha256", []))
    return set()


def same_router_shas(sha256: str) -> set[str]:
    """sha256 of the router files whose results under the same per-layer k are the file
    ``sha256``'s: they hold the same tensors under the same config but for
    ``FocusConfig.top_k_budgets`` (the manifest's ``budget_only_sha256`` for a shipped file:
    the file before its top-2 budget was saved into it, docs/method.md §2.7). A result made with
    such a file counts only where the pattern ran with the per-layer k this file gives it
    (``analyses.length_table.same_router_rows``). Empty for any other file."""
    for entry in manifest().values():
        if entry.get("sha256") == sha256:
            return set(entry.get("budget_only_sha256", []))
    return set()


def capacity_only_shas(sha256: str) -> set[str]:
    """sha256 of the router files that hold the tensors and per-layer budget of the file
    ``sha256`` under the same config but for the group capacity (``FocusConfig.group_capacity``,
    ``capacity_layers``, ``capacity_overflow``, ``capacity_top_k``; the manifest's
    ``capacity_only_sha256`` for a shipped file: the file before its capacity was saved into it,
    docs/method.md §2.9). A result made with such a file counts only for a pattern the capacity
    does not touch under this file (``analyses.length_table.capacity_in_force`` empty: hard
    top-1, random and shuffled groups, ``_nocap``), or one that ran with the same capacity.
    Empty for any other file."""
    for entry in manifest().values():
        if entry.get("sha256") == sha256:
            return set(entry.get("capacity_only_sha256", []))
    return set()


def resolve_routers(routers: str | Path | None, model_name: str | None = None) -> Path:
    """``routers`` if given, else the shipped file for the model (see ``shipped_router_file``)."""
    return Path(routers) if routers is not None else shipped_router_file(model_name)


def ship(source: str | Path, model_name: str, provenance: dict) -> Path:
    """Copy a trained router file into the package and record it in the manifest (maintainers).

    Writes atomically; returns the shipped path."""
    from focus_lab.io import atomic_path, write_json
    source = Path(source)
    target = ROUTER_DIR / f"{model_name}.safetensors"
    data = source.read_bytes()
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)
    entries = manifest()
    entries[model_name] = {"file": target.name, "sha256": file_sha256(target),
                           "bytes": len(data), **provenance}
    write_json(MANIFEST, entries)
    return target

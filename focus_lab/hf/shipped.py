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
SHIPPED = "shipped"  # the alias of the file shipped for a model, resolved at run time
ROUTER_FORMAT = "focus-lab-router"  # the metadata tag of a router file (router_files.write_router_file)


def registry() -> dict:
    """The router manifest (schema 2): ``files`` {name: {model, sha256, file (None: not
    tracked), parent, recipe, default_pattern, window, sink_tokens, ...}}, ``shipped`` {model
    name: file name} and ``provenance`` {file name: the full record of how it was made}.
    {} when no manifest ships."""
    if not MANIFEST.is_file():
        return {}
    data = json.loads(MANIFEST.read_text())
    if data.get("schema_version") != 2:
        raise ArtifactError(f"{MANIFEST} is not a schema-2 router manifest; reinstall focus-lab")
    return data


def manifest() -> dict:
    """{model name: {"name", "file", "sha256", "default_pattern", and the provenance record}} of
    the files shipped per model ({} if none): the shipped file of each model."""
    reg = registry()
    out = {}
    for model, name in reg.get("shipped", {}).items():
        f = reg["files"][name]
        out[model] = {**reg.get("provenance", {}).get(name, {}), **{k: v for k, v in f.items() if v is not None},
                      "name": name}
    return out


def named_file(sha256: str) -> str | None:
    """The manifest's name of the router file with ``sha256``; None for a file it does not list."""
    for name, f in registry().get("files", {}).items():
        if f.get("sha256") == sha256:
            return name
    return None


def router_path(name: str, model_name: str | None = None) -> Path:
    """The path of a router file given by manifest name, by the alias ``shipped`` (the file
    shipped for ``model_name``, None: the embedded model) or by path.

    Raises ArtifactError: an unknown name (one line listing the names) or a named file that is
    not tracked in the package (naming the command that remakes it)."""
    if name in (SHIPPED, "") or name is None:
        return shipped_router_file(model_name)
    files = registry().get("files", {})
    if name in files:
        f = files[name]
        if not f.get("file"):
            raise ArtifactError(f"router file {name!r} is listed but not shipped in the package "
                                f"({f.get('recipe', '')}); remake it with 'focus-lab routers show {name}' 's command")
        path = ROUTER_DIR / f["file"]
        if file_sha256(path) != f["sha256"]:
            raise ArtifactError(f"router file {name!r} ({path}) does not match its sha256 in the manifest: reinstall focus-lab")
        return path
    if Path(name).is_file():
        return Path(name)
    raise ArtifactError(f"no router file {name!r}: give a path, '{SHIPPED}', or one of the names "
                        f"{', '.join(sorted(files))} ('focus-lab routers list')")


def router_columns(path: str | Path | None) -> dict[str, str]:
    """What a result records of the router file that made it: ``router_name`` (the manifest's
    name, else the file's path), ``router_sha256``, and ``commit`` (``git describe`` of the
    checkout running, or the package version). ``path`` None: no router file (patterns that use
    no groups, ``Pattern.uses_groups``): router_name 'none', router_sha256 ''."""
    if path is None:
        return {"router_name": "none", "router_sha256": "", "commit": code_commit()}
    sha = file_sha256(path)
    return {"router_name": named_file(sha) or str(path), "router_sha256": sha, "commit": code_commit()}


def code_commit() -> str:
    """The commit of the focus-lab checkout running (``git rev-parse --short HEAD``, '+dirty'
    when the tree has changes), or 'focus-lab <version>' outside a git checkout."""
    import subprocess
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        from importlib.metadata import version
        return f"focus-lab {version('focus-lab')}"


def ships(model_name: str | None = None) -> bool:
    """Whether the manifest lists a router file shipped for ``model_name`` (None: the embedded
    SmolLM2-135M); says nothing of the file's presence or checksum (``shipped_router_file``)."""
    from focus_lab.hf.models import EMBEDDED
    return manifest().get(EMBEDDED if model_name in (None, "", "embedded") else model_name) is not None


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
    return _lineage_shas(sha256, "same_tensors_sha256")


def same_router_shas(sha256: str) -> set[str]:
    """sha256 of the router files whose results under the same per-layer k are the file
    ``sha256``'s: they hold the same tensors under the same config but for
    ``FocusConfig.top_k_budgets`` (the manifest's ``budget_only_sha256`` for a shipped file:
    the file before its top-2 budget was saved into it, docs/method.md §2.7). A result made with
    such a file counts only where the pattern ran with the per-layer k this file gives it
    (``analyses.length_table.same_router_rows``). Empty for any other file."""
    return _lineage_shas(sha256, "budget_only_sha256")


def capacity_only_shas(sha256: str) -> set[str]:
    """sha256 of the router files that hold the tensors and per-layer budget of the file
    ``sha256`` under the same config but for the group capacity (``FocusConfig.group_capacity``,
    ``capacity_layers``, ``capacity_overflow``, ``capacity_top_k``; the manifest's
    ``capacity_only_sha256`` for a shipped file: the file before its capacity was saved into it,
    docs/method.md §2.9). A result made with such a file counts only for a pattern the capacity
    does not touch under this file (``analyses.length_table.capacity_in_force`` empty: hard
    top-1, random and shuffled groups, ``_nocap``), or one that ran with the same capacity.
    Empty for any other file."""
    return _lineage_shas(sha256, "capacity_only_sha256")


def _lineage_shas(sha256: str, key: str) -> set[str]:
    for entry in manifest().values():
        if entry.get("sha256") == sha256:
            return set(entry.get(key, []))
    return set()


def resolve_routers(routers: str | Path | None, model_name: str | None = None) -> Path:
    """``routers`` if given (a path, a manifest name or ``shipped``: ``router_path``), else the
    shipped file for the model (see ``shipped_router_file``)."""
    return router_path(str(routers), model_name) if routers is not None else shipped_router_file(model_name)


def ship(source: str | Path, model_name: str, provenance: dict, name: str | None = None,
         parent: str | None = None) -> Path:
    """Copy a trained router file into the package, list it in the manifest under ``name``
    (default ``<model_name>/shipped-<sha256[:8]>``) and make it the file shipped for
    ``model_name`` (maintainers). Writes atomically; returns the shipped path."""
    from focus_lab.io import atomic_path, write_json
    from focus_lab.patterns import Pattern
    source = Path(source)
    target = ROUTER_DIR / f"{model_name}.safetensors"
    data = source.read_bytes()
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)
    sha = file_sha256(target)
    cfg = read_header(target)["config"]
    name = name or f"{model_name}/shipped-{sha[:8]}"
    reg = registry() or {"schema_version": 2, "shipped": {}, "files": {}, "provenance": {}}
    for f in reg["files"].values():  # the file it replaces keeps its name, no longer tracked
        if f.get("file") == target.name:
            f["file"] = None
    reg["files"][name] = {"model": model_name, "sha256": sha, "file": target.name, "bytes": len(data),
                          "parent": parent, "recipe": provenance.get("recipe", ""),
                          "default_pattern": str(Pattern.from_config(cfg, mode="hard")),
                          "window": cfg.window, "sink_tokens": cfg.sink_tokens}
    reg["shipped"][model_name] = name
    reg["provenance"][name] = provenance
    write_json(MANIFEST, reg)
    return target


def read_header(path: str | Path) -> dict:
    """A router file's safetensors header without loading torch: {"config": FocusConfig,
    "base_model": dict, "extra": dict, "layers": routed layer indices, "tensors": {name: shape}}.
    Raises ArtifactError when ``path`` is not a focus-lab router file."""
    import struct
    from focus_lab.method.config import FocusConfig
    path = Path(path)
    try:
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            if n > path.stat().st_size - 8:  # garbage: a length past the end of the file
                raise ValueError(f"a header of {n} bytes in a file of {path.stat().st_size}")
            header = json.loads(f.read(n))
    except (OSError, struct.error, ValueError) as e:
        raise ArtifactError(f"{path} is not a safetensors router file ({e})") from None
    if not isinstance(header, dict):
        raise ArtifactError(f"{path} is not a safetensors router file (its header is not a mapping)")
    meta = header.pop("__metadata__", {}) or {}
    if meta.get("format") != ROUTER_FORMAT:
        raise ArtifactError(f"{path} is not a focus-lab router file (no '{ROUTER_FORMAT}' metadata)")
    layers = sorted({int(k.split(".")[1]) for k in header if k.startswith("layers.")})
    return {"config": FocusConfig.from_json(meta["focus_config"]), "base_model": json.loads(meta["base_model"]),
            "extra": json.loads(meta.get("extra", "{}")), "layers": layers,
            "tensors": {k: v["shape"] for k, v in header.items()}}


def lineage(name: str) -> list[str]:
    """``name`` and its parents by name, newest first."""
    files, out = registry().get("files", {}), []
    while name and name in files and name not in out:
        out.append(name)
        name = files[name].get("parent")
    return out

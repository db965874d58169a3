"""Write a run directory (schema v1, see runs.py) from held-out text run through Focus.

Tables: tokens, assignments (per token and layer: top-k groups, Sinkhorn probability,
raw scores, top-1 margin), pos (spaCy labels joined by character offsets), plus optional
eval / train_log tables copied in.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.metadata as md
import platform
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .core import sinkhorn
from .io import atomic_path
from .retrofit import add_observer, focus_config, model_identity
from .runs import MANIFEST, SCHEMA_VERSION

PACKAGES = ("torch", "transformers", "spacy", "pandas", "pyarrow", "scikit-learn", "streamlit", "focus-lab")


def package_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for p in PACKAGES:
        try:
            out[p] = md.version(p)
        except md.PackageNotFoundError:
            out[p] = "not installed"
    return out


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@torch.no_grad()
def assignments_for_window(model, input_ids: torch.Tensor) -> pd.DataFrame:
    """One forward of ``input_ids: (T,)``; returns the assignments table of that window.

    Columns: position, layer_idx, group (hard top-1, the key's group), top_k_groups (list,
    best first), prob (Sinkhorn probability of ``group``), margin (top-1 minus top-2 score in
    logit units, group bias included), scores (list of K raw router scores).
    """
    cfg = focus_config(model)
    got: dict[int, tuple] = {}

    def observe(module, q, k, v, routing, bias, out):
        if routing is not None:
            got[module.focus_router.layer_idx] = (routing, module.focus_router.group_bias.clone())

    remove = add_observer(model, observe)
    try:
        model(input_ids=input_ids[None], use_cache=False)
    finally:
        remove()
    frames = []
    T = input_ids.shape[0]
    for layer_idx, (routing, gbias) in sorted(got.items()):
        scores = routing.scores[0].float()  # (T, K)
        log_p = routing.log_p[0] if routing.log_p is not None else \
            sinkhorn(routing.scores, cfg.tau, cfg.sinkhorn_iters)[0][0]  # (T, K)
        group = routing.key_group[0]  # (T,)
        a = scores / cfg.tau + gbias  # (T, K)
        top2 = a.topk(min(2, a.shape[-1]), dim=-1).values
        margin = (top2[:, 0] - top2[:, 1]) if a.shape[-1] > 1 else torch.full((T,), float("inf"))
        frames.append(pd.DataFrame({
            "position": np.arange(T, dtype=np.int32),
            "layer_idx": np.full(T, layer_idx, dtype=np.int16),
            "group": group.numpy().astype(np.int16),
            "top_k_groups": list(routing.query_groups[0].numpy().astype(np.int16)),
            "prob": log_p.exp().gather(1, group[:, None])[:, 0].numpy().astype(np.float32),
            "margin": margin.numpy().astype(np.float32),
            "scores": list(scores.numpy().astype(np.float32)),
        }))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def record_run(model, tokenizer, windows: list, texts: dict[str, str], out_dir: str | Path,
               meta: dict | None = None, with_pos: bool = True, extra_tables: dict | None = None,
               progress: bool = True) -> Path:
    """Record ``windows`` (Focus attached, in the mode of its config) into a run directory.

    Args:
        windows: held-out windows (``doc``, ``input_ids (T,)``, ``offsets (T, 2)`` chars).
        texts: {document name: full text}, to resolve offsets.
        out_dir: the run directory to create (replaced if it exists, atomically).
        meta: provenance merged into the manifest (corpus, router file, command, ...).
        with_pos: join spaCy POS / dependency labels (needs the spaCy pipeline).
        extra_tables: {name: DataFrame} written as additional tables (eval, train_log).
    Returns:
        the run directory path.
    """
    out_dir = Path(out_dir)
    cfg = focus_config(model)
    tok_frames, asg_frames, pos_frames = [], [], []
    pos_table = None
    if with_pos:
        from .linguistics import load_spacy, pos_table
        load_spacy()  # fail early with a clear message
    for w_idx, w in enumerate(tqdm(windows, desc="record", disable=not progress, dynamic_ncols=True)):
        text = texts[w.doc]
        ids = w.input_ids
        offs = np.asarray(w.offsets, dtype=np.int64)
        tok_frames.append(pd.DataFrame({
            "window": np.full(len(ids), w_idx, dtype=np.int32),
            "position": np.arange(len(ids), dtype=np.int32),
            "doc": w.doc,
            "token_id": ids.numpy().astype(np.int64),
            "token": [tokenizer.decode([int(i)]) for i in ids],
            "char_start": offs[:, 0], "char_end": offs[:, 1],
        }))
        a = assignments_for_window(model, ids)
        a.insert(0, "window", np.int32(w_idx))
        asg_frames.append(a)
        if pos_table is not None:
            p = pos_table(text, offs)
            p.insert(0, "window", np.int32(w_idx))
            pos_frames.append(p)
    tables = {"tokens": pd.concat(tok_frames, ignore_index=True),
              "assignments": pd.concat(asg_frames, ignore_index=True)}
    if pos_frames:
        tables["pos"] = pd.concat(pos_frames, ignore_index=True)
    tables.update(extra_tables or {})
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "focus_config": cfg.to_dict(),
        "model": {**model_identity(model), "num_layers": int(model.config.num_hidden_layers),
                  "num_heads": int(model.config.num_attention_heads),
                  "num_kv_heads": int(getattr(model.config, "num_key_value_heads", None)
                                      or model.config.num_attention_heads)},
        "windows": len(windows), "seq_len": int(windows[0].input_ids.shape[0]) if windows else 0,
        "documents": sorted({w.doc for w in windows}),
        "packages": package_versions(),
        "command": " ".join(sys.argv),
        "tables": sorted(tables),
        **(meta or {}),
    }
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        for name, df in tables.items():
            df.to_parquet(tmp / f"{name}.parquet", index=False)
        import json
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str))
    return out_dir

"""Small recorded runs for the dashboard tests, made with the real recorder on a tiny model.

``make_tiny_run(path)`` builds (offline, a few seconds on 2 cores):

* a tiny fast tokenizer (byte-free BPE trained on the built-in text below, ``tokenizers``
  wrapped in ``PreTrainedTokenizerFast``) and a tiny random Llama (``conftest.tiny_llama``),
  saved under ``assets`` so the live-probe page can load them with
  ``focus_lab.models.load_model(path)``;
* routers attached with ``FocusConfig(mode="hard", window=8, num_groups=4)`` and saved as
  safetensors (the manifest's ``routers.path``);
* a run directory written by ``focus_lab.record.record_run`` (tokens, assignments, pos when
  spaCy is available) plus an eval table from ``focus_lab.evaluate.evaluate`` and a synthetic
  train_log with the trainer's columns;
* with ``standins=True``: balance, coverage, coverage_distance and dropped_edges tables computed
  here from the tiny model's dense attention, in the column layout the dashboard reads, for
  as long as the recorder (issue 3) does not write them itself. Tables the recorder already
  wrote are never replaced.

Also ``corrupt_run`` and ``other_schema_run`` for the error-message tests.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

TEXT = (
    "It was a bright morning in the village, and Anne walked to the house on the hill. "
    "Her sister had written a long letter, which she carried in her hand. "
    "The captain was waiting by the gate; he smiled when he saw her. "
    "They spoke of the sea, of ships, and of the friends they had lost. "
    "Mr. Elliot arrived later, and nobody was pleased to see him. "
    "Anne thought of the letter again, and of the words her sister had chosen. "
    "In the evening the whole family sat by the fire and read aloud. "
    "The captain told a story about a storm that had nearly sunk his ship. "
    "Everyone listened, and even Mr. Elliot was quiet for a while. "
    "When the story ended, Anne went to the window and looked at the dark sea. "
    "She knew that tomorrow would bring another letter, and perhaps an answer. "
    "The house was silent, but her heart was not."
)
DOC = "tiny-doc"
VOCAB = 97


@dataclass
class TinyWindow:
    doc: str
    input_ids: torch.Tensor  # (T,) long
    offsets: np.ndarray  # (T, 2) char offsets into the doc text


def _tiny_llama(vocab: int, layers: int):
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    try:
        from conftest import tiny_llama
    except ImportError:  # pragma: no cover - conftest always ships with the tests
        tiny_llama = None
    if tiny_llama is not None and vocab == VOCAB:
        return tiny_llama(seed=0, layers=layers)
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return LlamaForCausalLM(cfg).eval()


def make_tokenizer(text: str = TEXT, vocab: int = VOCAB):
    """A fast BPE tokenizer (whitespace/punctuation pre-tokenizer) of at most ``vocab`` entries."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.decoder = decoders.BPEDecoder()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
                                  show_progress=False)
    tk.train_from_iterator([text], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", pad_token="<pad>",
                                   bos_token="<s>", eos_token="</s>")


def make_windows(tokenizer, text: str = TEXT, seq_len: int = 48, doc: str = DOC) -> list[TinyWindow]:
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    ids = np.asarray(enc["input_ids"], dtype=np.int64)
    off = np.asarray(enc["offset_mapping"], dtype=np.int64)
    out = []
    for s in range(0, len(ids) - seq_len + 1, seq_len):
        out.append(TinyWindow(doc, torch.from_numpy(ids[s:s + seq_len].copy()), off[s:s + seq_len].copy()))
    return out


def _spacy_ok() -> bool:
    try:
        from focus_lab.linguistics import load_spacy
        load_spacy()
        return True
    except Exception:
        return False


# -------------------------------------------------------------------------------------------
# stand-in tables (until the recorder writes them)

@torch.no_grad()
def _dense_attention(model, ids: torch.Tensor) -> list[np.ndarray]:
    """Per layer (H, T, T) dense softmax attention of the base model (Focus detached)."""
    out = model(input_ids=ids[None], output_attentions=True, use_cache=False)
    return [a[0].float().numpy() for a in out.attentions]


def _kept_mask(top_k_groups: np.ndarray, group: np.ndarray, window: int) -> np.ndarray:
    """(T, T) bool: the hard mask of PAPER.md §2 (query in its top-k, key in its top-1 group)."""
    T = len(group)
    i = np.arange(T)[:, None]
    j = np.arange(T)[None, :]
    causal = j <= i
    local = (i - j) < window
    same = (top_k_groups[:, :, None] == group[None, None, :]).any(axis=1)
    return causal & (local | same)


def _standin_tables(base_model, windows, asg: pd.DataFrame, pos: pd.DataFrame | None, tokens: pd.DataFrame,
                    num_groups: int, window: int, tau: float, threshold: float = 0.045) -> dict[str, pd.DataFrame]:
    cov_rows, dist_rows, edge_rows, bal_rows = [], [], [], []
    rng = np.random.default_rng(0)
    for w_idx, w in enumerate(windows):
        atts = _dense_attention(base_model, w.input_ids)
        T = len(w.input_ids)
        tok_w = tokens[tokens.window == w_idx].sort_values("position")
        tok_text = tok_w["token"].to_numpy()
        pos_w = pos[pos.window == w_idx].sort_values("position") if pos is not None else None
        rel_fn = None
        if pos_w is not None:
            try:
                from focus_lab.linguistics import relations_for_pairs
                rel_fn = relations_for_pairs
            except ImportError:
                rel_fn = None
        for layer, att in enumerate(atts):
            a = asg[(asg.window == w_idx) & (asg.layer_idx == layer)].sort_values("position")
            if a.empty:
                continue
            group = a["group"].to_numpy()
            topk = np.stack(a["top_k_groups"].to_numpy())
            kept = _kept_mask(topk, group, window)
            rand_g = rng.integers(0, num_groups, size=T)
            rand_kept = _kept_mask(rand_g[:, None].repeat(topk.shape[1], 1), rand_g, window)
            win_kept = _kept_mask(np.full((T, 1), -1), group, window)
            dist = np.arange(T)[:, None] - np.arange(T)[None, :]
            for h in range(att.shape[0]):
                p = att[h]
                for pattern, m in (("focus", kept), ("window", win_kept), ("random", rand_kept)):
                    cov = (p * m).sum(-1)
                    cov_rows.append({"window": w_idx, "layer_idx": layer, "head": h, "pattern": pattern,
                                     "coverage": float(cov.mean()), "min_coverage": float(cov.min())})
                    for lo, hi in ((0, window), (window, 2 * window), (2 * window, 4 * window),
                                   (4 * window, 10 ** 6)):
                        sel = (dist >= lo) & (dist < hi)
                        mass = float(p[sel].sum())
                        if mass <= 0:
                            continue
                        dist_rows.append({"window": w_idx, "layer_idx": layer, "head": h, "pattern": pattern,
                                          "distance_lo": lo, "distance_hi": hi,
                                          "coverage": float((p * m)[sel].sum()) / mass, "mass": mass})
                drop = (~kept) & (dist >= window) & (p > threshold)
                qi, kj = np.nonzero(drop)
                rels = rel_fn(pos_w.reset_index(drop=True), qi, kj) if (rel_fn and len(qi)) else [None] * len(qi)
                for q, k, r in zip(qi, kj, rels):
                    edge_rows.append({"window": w_idx, "layer_idx": layer, "head": h,
                                      "query_position": int(q), "key_position": int(k),
                                      "distance": int(q - k), "weight": float(p[q, k]),
                                      "query_token": str(tok_text[q]), "key_token": str(tok_text[k]),
                                      "query_group": int(group[q]), "key_group": int(group[k]),
                                      "relation": r or ""})
    asg_scores = np.stack(asg["scores"].to_numpy())
    soft = torch.softmax(torch.from_numpy(asg_scores) / tau, dim=-1).numpy()
    for layer, idx in asg.groupby("layer_idx").indices.items():
        hard = np.bincount(asg["group"].to_numpy()[idx], minlength=num_groups) / len(idx)
        sm = soft[idx].mean(0)
        for g in range(num_groups):
            bal_rows.append({"layer_idx": int(layer), "group": g, "hard_share": float(hard[g]),
                             "soft_share": 1.0 / num_groups, "softmax_share": float(sm[g])})
    cov = pd.DataFrame(cov_rows)
    dist = pd.DataFrame(dist_rows)
    cov = cov.groupby(["layer_idx", "head", "pattern"], as_index=False)[["coverage", "min_coverage"]].mean()
    dist = dist.groupby(["layer_idx", "head", "pattern", "distance_lo", "distance_hi"], as_index=False)[
        ["coverage", "mass"]].mean()
    edges = pd.DataFrame(edge_rows, columns=["window", "layer_idx", "head", "query_position", "key_position",
                                             "distance", "weight", "query_token", "key_token", "query_group",
                                             "key_group", "relation"])
    return {"balance": pd.DataFrame(bal_rows), "coverage": cov, "coverage_distance": dist,
            "dropped_edges": edges}


def _train_log(layers: int, num_groups: int, steps: int = 6) -> pd.DataFrame:
    rows = []
    for s in range(1, steps + 1):
        for layer in range(layers):
            top = 1.0 / num_groups + 0.5 / (s + layer)
            rows.append({"step": s, "layer_idx": layer, "loss": 4.6 - 0.1 * s, "lr": 3e-3, "seconds": 0.1 * s,
                         "tokens_per_second": 1000.0, "max_group_share": min(top, 1.0),
                         "min_group_share": max(0.0, (1 - top) / (num_groups - 1) - 0.01 * layer)})
    return pd.DataFrame(rows)


# -------------------------------------------------------------------------------------------

def make_tiny_run(path: str | Path, *, num_groups: int = 4, window: int = 8, top_k: int = 2,
                  layers: int = 2, seq_len: int = 48, with_pos: bool | None = None,
                  standins: bool = True, with_eval: bool = True, with_train_log: bool = True,
                  assets: str | Path | None = None, seed: int = 0) -> Path:
    """Record a tiny run into ``path`` (created / replaced); returns ``path``.

    ``assets`` (default: a hidden sibling ``.<name>-assets``, skipped by ``list_runs``) holds
    the saved tiny model, its tokenizer and the router file the manifest points to.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is fastest, and the machine is shared
    try:
        return _make_tiny_run(Path(path), num_groups, window, top_k, layers, seq_len, with_pos, standins,
                              with_eval, with_train_log, assets, seed)
    finally:
        torch.set_num_threads(threads)


def _make_tiny_run(path, num_groups, window, top_k, layers, seq_len, with_pos, standins, with_eval,
                   with_train_log, assets, seed) -> Path:
    from focus_lab import FocusConfig, attach, detach, save_routers
    from focus_lab.models import load_model
    from focus_lab.record import file_sha256, record_run

    assets = Path(assets) if assets is not None else path.parent / f".{path.name}-assets"
    model_dir = assets / "model"
    tok = make_tokenizer()
    if not (model_dir / "config.json").is_file():
        base = _tiny_llama(len(tok), layers)
        model_dir.mkdir(parents=True, exist_ok=True)
        base.save_pretrained(model_dir)
        tok.save_pretrained(model_dir)
    model, tok = load_model(str(model_dir), verbose=False)
    model.config._attn_implementation = "eager"
    windows = make_windows(tok, seq_len=seq_len)
    with_pos = _spacy_ok() if with_pos is None else with_pos

    cfg = FocusConfig(mode="hard", window=window, num_groups=num_groups, top_k=top_k, seed=seed)
    attach(model, cfg)
    routers_path = save_routers(model, assets / "routers.safetensors")
    extra = {}
    if with_eval:
        from focus_lab.evaluate import evaluate
        extra["eval"] = evaluate(model, windows[:2], progress=False)
        from focus_lab import set_config
        set_config(model, mode="hard", top_k=top_k)
    if with_train_log:
        extra["train_log"] = _train_log(layers, num_groups)
    meta = {"corpus": {"name": "tiny", "heldout": [DOC], "train": []},
            "routers": {"path": str(routers_path), "sha256": file_sha256(routers_path)}}
    record_run(model, tok, windows, {DOC: TEXT}, path, meta=meta, with_pos=with_pos,
               extra_tables=extra, progress=False)

    if standins:
        have = {p.stem for p in path.glob("*.parquet")}
        want = {"balance", "coverage", "coverage_distance", "dropped_edges"}
        if want - have:
            asg = pd.read_parquet(path / "assignments.parquet")
            tokens = pd.read_parquet(path / "tokens.parquet")
            pos = pd.read_parquet(path / "pos.parquet") if (path / "pos.parquet").is_file() else None
            detach(model)
            model.config._attn_implementation = "eager"
            tables = _standin_tables(model, windows, asg, pos, tokens, num_groups, window, cfg.tau)
            for name, df in tables.items():
                if name not in have:
                    df.to_parquet(path / f"{name}.parquet", index=False)
            mf = json.loads((path / "manifest.json").read_text())
            mf["tables"] = sorted({*mf.get("tables", []), *tables})
            mf["standin_tables"] = sorted(want - have)
            (path / "manifest.json").write_text(json.dumps(mf, indent=2, sort_keys=True))
    return path


def corrupt_run(path: str | Path) -> Path:
    """A run directory whose manifest is not JSON."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "manifest.json").write_text('{"schema_version": 1, "focus_config": {')
    return path


def other_schema_run(path: str | Path, source: str | Path | None = None, version: int = 0) -> Path:
    """A run directory of schema ``version`` (copied from ``source`` when given)."""
    path = Path(path)
    if source is not None:
        shutil.copytree(source, path, dirs_exist_ok=True)
        mf = json.loads((path / "manifest.json").read_text())
    else:
        path.mkdir(parents=True, exist_ok=True)
        mf = {}
    mf["schema_version"] = version
    (path / "manifest.json").write_text(json.dumps(mf))
    return path


if __name__ == "__main__":  # python tests/run_fixtures.py <runs-root>
    import time
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "tmp/runs")
    t0 = time.perf_counter()
    make_tiny_run(root / "tiny")
    make_tiny_run(root / "tiny-k2", num_groups=2, top_k=1, seed=1)
    print(f"made tiny runs in {root} in {time.perf_counter() - t0:.1f} s")

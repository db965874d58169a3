"""Small recorded runs for the dashboard tests, made with the real recorder on a tiny model.

``make_tiny_run(path)`` builds (offline, a few seconds on 2 cores):

* a tiny fast tokenizer (byte-free BPE trained on the built-in text below, ``tokenizers``
  wrapped in ``PreTrainedTokenizerFast``) and a tiny random Llama (``focus_lab.hf.tiny.tiny_llama``),
  or with ``model="gemma3"`` a tiny random Gemma-3 whose global layers alone are routed
  (``focus_lab.hf.tiny.tiny_gemma3``: 6 layers, layers 2 and 5 global), saved under ``assets``
  so the live-probe page can load them with ``focus_lab.hf.models.load_model(path)``;
* routers attached with ``FocusConfig(mode="hard", window=8, num_groups=4)`` and saved as
  safetensors (the manifest's ``routers.path``);
* a run directory written by ``focus_lab.recording.recorder.record_run`` (tokens, assignments, pos when
  spaCy is available) plus an eval table from ``focus_lab.eval.evaluate.evaluate`` and a synthetic
  train_log with the trainer's columns;
* the recorder's metric tables (balance, coverage, crossing, dropped_edges, linguistics), as
  ``record_run`` writes them.

``make_main_job_run`` turns such a run into what the main job leaves (shipped routers, the eval
table of the recorded windows); ``corrupt_run`` and ``other_schema_run`` serve the error-message
tests.
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

from focus_lab.hf.tiny import SAMPLE_TEXT as TEXT, bpe_tokenizer, tiny_gemma3, tiny_llama  # noqa: E402
DOC = "tiny-doc"
VOCAB = 97


@dataclass
class TinyWindow:
    doc: str
    input_ids: torch.Tensor  # (T,) long
    offsets: np.ndarray  # (T, 2) char offsets into the doc text


def _tiny_llama(vocab: int, layers: int):
    return tiny_llama(seed=0, layers=layers, vocab_size=vocab)


def _tiny_gemma3(vocab: int, layers: int):
    return tiny_gemma3(seed=0, layers=layers, vocab_size=vocab)


#: the tiny base models ``make_tiny_run`` records from (its ``model``)
BASES = {"llama": _tiny_llama, "gemma3": _tiny_gemma3}


def make_tokenizer(text: str = TEXT, vocab: int = VOCAB):
    """A fast BPE tokenizer (whitespace/punctuation pre-tokenizer) of at most ``vocab`` entries."""
    return bpe_tokenizer([text], vocab)


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
        from focus_lab.recording.linguistics import load_spacy
        load_spacy()
        return True
    except Exception:
        return False


def _train_log(layers, num_groups: int, steps: int = 6) -> pd.DataFrame:
    """Synthetic training rows for ``layers`` (a count: layers 0..n-1, or the routed layers' indices)."""
    rows = []
    for s in range(1, steps + 1):
        for layer in (range(layers) if isinstance(layers, int) else layers):
            top = 1.0 / num_groups + 0.5 / (s + layer)
            rows.append({"step": s, "layer_idx": layer, "loss": 4.6 - 0.1 * s, "lr": 3e-3, "seconds": 0.1 * s,
                         "tokens_per_second": 1000.0, "max_group_share": min(top, 1.0),
                         "min_group_share": max(0.0, (1 - top) / (num_groups - 1) - 0.01 * layer)})
    return pd.DataFrame(rows)


# -------------------------------------------------------------------------------------------

def make_tiny_run(path: str | Path, *, num_groups: int = 4, window: int = 8, top_k: int = 2,
                  layers: int = 2, seq_len: int = 48, with_pos: bool | None = None,
                  with_eval: bool = True, with_train_log: bool = True,
                  assets: str | Path | None = None, seed: int = 0, patterns: tuple = (),
                  standins: bool = False, model: str = "llama", rules: str = "") -> Path:
    """Record a tiny run into ``path`` (created / replaced); returns ``path``.

    ``assets`` (default: a hidden sibling ``.<name>-assets``, skipped by ``list_runs``) holds
    the saved tiny model, its tokenizer and the router file the manifest points to.
    ``patterns``: (layer, head) pairs whose full attention maps the recorder keeps.
    ``standins`` is accepted and ignored (the recorder writes every metric table itself now).
    ``model``: the tiny base, ``"llama"`` (every layer routed) or ``"gemma3"`` (give ``layers=6``:
    layers 2 and 5 attend globally and are the only routed ones, as Gemma-3-270M's 5, 11, 17).
    ``rules``: rules saved in the router file for its hard top-k, e.g. ``"+key_shift"``.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is fastest, and the machine is shared
    try:
        return _make_tiny_run(Path(path), num_groups, window, top_k, layers, seq_len, with_pos,
                              with_eval, with_train_log, assets, seed, patterns, model, rules)
    finally:
        torch.set_num_threads(threads)


def _make_tiny_run(path, num_groups, window, top_k, layers, seq_len, with_pos, with_eval, with_train_log,
                   assets, seed, patterns=(), base_model="llama", rules="") -> Path:
    from focus_lab import FocusConfig, attach, save_routers
    from focus_lab.hf.models import load_model
    from focus_lab.io import file_sha256
    from focus_lab.recording.recorder import record_run

    assets = Path(assets) if assets is not None else path.parent / f".{path.name}-assets"
    model_dir = assets / "model"
    tok = make_tokenizer()
    if not (model_dir / "config.json").is_file():
        base = BASES[base_model](len(tok), layers)
        model_dir.mkdir(parents=True, exist_ok=True)
        base.save_pretrained(model_dir)
        tok.save_pretrained(model_dir)
    model, tok = load_model(str(model_dir), verbose=False)
    windows = make_windows(tok, seq_len=seq_len)
    with_pos = _spacy_ok() if with_pos is None else with_pos

    cfg = FocusConfig(mode="hard", window=window, num_groups=num_groups, top_k=top_k, seed=seed)
    if rules:
        from focus_lab.patterns import Pattern
        cfg = cfg.replace(**Pattern.parse(f"hard_top{top_k}{rules}").changes())
    attach(model, cfg)  # the family's default layers: every one, or Gemma's global layers
    from focus_lab import routers
    routed = sorted(routers(model))
    routers_path = save_routers(model, assets / "routers.safetensors")
    extra = {}
    if with_eval:
        from focus_lab.eval.evaluate import evaluate
        extra["eval"] = evaluate(model, windows[:2], progress=False)
        from focus_lab import set_config
        set_config(model, mode="hard", top_k=top_k)
    if with_train_log:
        extra["train_log"] = _train_log(routed, num_groups)
    meta = {"corpus": {"name": "tiny", "heldout": [DOC], "train": []},
            "routers": {"path": str(routers_path), "sha256": file_sha256(routers_path)}}
    record_run(model, tok, windows, {DOC: TEXT}, path, meta=meta, with_pos=with_pos,
               extra_tables=extra, progress=False, **({"patterns": list(patterns)} if patterns else {}))
    return path


def make_main_job_run(path: str | Path, source: str | Path, patterns: str | None = None) -> Path:
    """A run as the main job (``focus-lab quickstart``) leaves it, on the tiny model: a copy of
    the recorded run ``source`` without its copied eval and train_log tables, whose manifest says
    its routers are the file shipped with focus-lab (``routers.shipped``: the real entry of
    ``focus_lab/routers/MANIFEST.json``, as ``focus-lab record`` writes it for that file), then
    ``focus-lab eval --run`` on it with the quickstart's patterns (default
    ``cli.QUICKSTART_PATTERNS``), through the CLI."""
    from typer.testing import CliRunner
    from focus_lab import cli
    from focus_lab.hf import shipped
    path = Path(path)
    shutil.copytree(source, path)
    mf = json.loads((path / "manifest.json").read_text())
    for name in ("eval", "train_log"):
        (path / f"{name}.parquet").unlink()
    mf["tables"] = [t for t in mf["tables"] if t not in ("eval", "train_log")]
    model = "smollm2-135m-instruct"  # the main job's model (the manifest ships Gemma's file too)
    entry = shipped.manifest()[model]
    mf["routers"]["shipped"] = cli._shipped_provenance(entry["sha256"])
    assert mf["routers"]["shipped"]["model"] == model
    (path / "manifest.json").write_text(json.dumps(mf, indent=2))
    res = CliRunner().invoke(cli.app, ["eval", "--run", str(path), "--patterns", patterns or cli.QUICKSTART_PATTERNS])
    assert res.exit_code == 0, res.output
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


# ------------------------------------------------------------------------------------------
# a passkey probe output (focus_lab.eval.passkey.run_passkey on the tiny model)

PASSKEY_SENTENCES = ["Anne walked to the house on the hill.", "Her sister had written a long letter.",
                     "The captain was waiting by the gate; he smiled.", "They spoke of the sea and of ships!",
                     "Mr. Elliot arrived later, and nobody was pleased.", "Was it late?", "\"Yes,\" she said."]
PASSKEY_TEXT = " ".join(PASSKEY_SENTENCES[i % len(PASSKEY_SENTENCES)] for i in range(140))
PASSKEY_CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
                         "{% if add_generation_prompt %}<s>assistant\n{% endif %}")


def passkey_tokenizer():
    """A fast BPE tokenizer (Metaspace: spaces kept, decoding exact) of 97 entries, the tiny
    Llama's vocabulary, trained on the haystack, the needle with every digit, the intro and the
    question; with a small chat template (the probe's default format is chat)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from focus_lab.eval import passkey as P
    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Metaspace()
    tk.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
                                  show_progress=False)
    tk.train_from_iterator([PASSKEY_TEXT, P.NEEDLE.format(key="0123456789"), P.INTRO,
                            f"\n\n{P.QUESTION} {P.ANSWER_PREFIX}"], trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", pad_token="<pad>",
                                  bos_token="<s>", eos_token="</s>")
    tok.chat_template = PASSKEY_CHAT_TEMPLATE
    return tok


def make_passkey_dir(path: str | Path, *, lengths=(240, 300), depths=(0, 100), keys: int = 1,
                     patterns: str = "dense,hard_top2", formats=("chat",)) -> Path:
    """A passkey output folder written by ``focus_lab.eval.passkey.run_passkey`` on a tiny random
    Llama (2 layers, Focus window 8, 2 sink tokens, K = 4) and ``passkey_tokenizer``: cases.parquet,
    needle_layers.parquet, passkey.html, passkey.json and cells/ (a few seconds)."""
    from focus_lab import FocusConfig
    from focus_lab.eval import passkey as P
    from focus_lab.data import Document
    from focus_lab.eval.evaluate import parse_patterns
    from focus_lab.hf.retrofit import attach
    torch.manual_seed(0)
    tok = passkey_tokenizer()
    model = attach(_tiny_llama(VOCAB, 2), FocusConfig(window=8, sink_tokens=2, mode="hard", num_groups=4))
    hay = P.load_haystack([Document("tiny", PASSKEY_TEXT)], tok, name="tiny")
    P.run_passkey(model, tok, hay, path, lengths=list(lengths), depths=list(depths), keys=keys,
                  patterns=parse_patterns(patterns, 4), formats=list(formats),
                  settings={"model": {"name": "tiny-llama"}, "corpus": "tiny"}, log=lambda _m: None)
    return Path(path)


def make_synthetic_passkey_dir(path: str | Path, seed: int = 0) -> Path:
    """A passkey output with chosen values (the random tiny model never retrieves a key): the
    tables ``passkey.cases_frame`` / ``layers_frame`` build (the probe's exact columns) from
    rows drawn with ``seed``: formats chat and plain, lengths 1024 / 2048, depths 0 / 50 / 100,
    seeds 0..2, patterns dense / window / hard_top2, 3 audited layers per case; a hit wherever
    the key log-prob exceeds -2 nats. Written with ``io.write_parquet`` as the probe does."""
    from focus_lab.eval import passkey as P
    from focus_lab.io import write_json, write_parquet
    rng = np.random.default_rng(seed)
    path = Path(path)
    rows, lrows = [], []
    for fmt in ("chat", "plain"):
        for L in (1024, 2048):
            for d in (0.0, 50.0, 100.0):
                for s in range(3):
                    key = P.key_for_seed(s)
                    for p, kept in (("dense", 1.0), ("window", 0.1), ("hard_top2", 0.55)):
                        lp = float(-rng.uniform(0, 6) * (1.0 if p == "dense" else 2.5))
                        rows.append({"format": fmt, "length": L, "depth": d, "pattern": p, "seed": s, "key": key,
                                     "exact_match": lp > -2.0, "key_logprob": lp, "key_tokens": 5,
                                     "first_key_token_rank": int(lp < -2.0), "distant_pairs_kept": kept,
                                     "needle_edges_kept": float(rng.uniform()), "needle_depth": d / 100,
                                     "needle_position": int(d / 100 * (L - 80)) + 40,
                                     "continuation": key if lp > -2.0 else "123", "mode": p.split("_")[0],
                                     "top_k": 2 if p.startswith("hard") else None, "seconds": 1.0})
                    for layer in range(3):
                        lrows.append({"format": fmt, "length": L, "depth": d, "seed": s, "key": key,
                                      "layer_idx": layer, "dense_mass_to_needle": float(rng.uniform(0, 0.3)),
                                      "max_head_mass_to_needle": float(rng.uniform(0.3, 1.0)),
                                      "kept_top1": float(rng.choice([0.0, 0.2, 0.6, 1.0])),
                                      "kept_top2": float(rng.choice([0.4, 0.8, 1.0]))})
    write_parquet(path / "cases.parquet", P.cases_frame(rows))
    write_parquet(path / "needle_layers.parquet", P.layers_frame(lrows))
    write_json(path / "passkey.json", {"settings": {"model": {"name": "synthetic"}, "keys": 3}, "seconds": 12.0})
    return path


def decode(arr):
    """A plotly figure's array as numpy: plotly 6 serializes arrays as {"bdata": base64, "dtype",
    "shape"}; plain lists pass through as floats."""
    import base64
    import numpy as np
    if isinstance(arr, dict) and "bdata" in arr:
        out = np.frombuffer(base64.b64decode(arr["bdata"]), dtype=np.dtype(arr["dtype"]))
        if "shape" in arr:
            shape = arr["shape"]
            return out.reshape([int(x) for x in shape.split(",")] if isinstance(shape, str) else shape)
        return out
    return np.asarray(arr, dtype=float)


if __name__ == "__main__":  # python tests/run_fixtures.py <runs-root>
    import time
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "tmp/runs")
    t0 = time.perf_counter()
    make_tiny_run(root / "tiny", patterns=((1, 0),))
    make_tiny_run(root / "tiny-k2", num_groups=2, top_k=1, seed=1)
    print(f"made tiny runs in {root} in {time.perf_counter() - t0:.1f} s")

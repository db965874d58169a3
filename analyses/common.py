"""What the experiments and the figure modules of ``analyses/`` share.

* ``Settings`` (``FULL``, ``QUICK``): the sizes of every experiment.
* ``Context``: settings, the output folders (``<out>/data``), a model factory, corpora and
  windows; ``cached_part`` makes one resumable unit of a multi-part experiment
  (``<out>/data/<name>.parts/<part>.parquet``).
* ``--quick`` inputs: built-in texts of three domains and a tiny BPE tokenizer over them
  (``focus_lab.hf.tiny`` builds the tokenizer and the tiny random Llama).
* for the figure and table modules: ``read`` (an experiment's cached result), ``placeholder``,
  ``bench_dir``, ``RECORD_METHODS``, ``METHOD_NAMES``, ``METHOD_COLORS``, ``pareto_front``.

Sources: docs/method.md §1-§6.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from focus_lab.io import with_table  # noqa: F401  (the analyses' --commit rule, in the library)

from focus_lab.method.config import FocusConfig
from focus_lab.io import write_parquet

def _root() -> Path:
    """The checkout holding this package (it has pyproject.toml), or, for a non-editable install
    (analyses/ inside site-packages), the working directory: outputs never go to site-packages."""
    here = Path(__file__).resolve().parent.parent
    return here if (here / "pyproject.toml").is_file() else Path.cwd()


REPO = _root()
# the per-window cells of every committed length table, and the committed passkey probe tables
# (``figures/results/``), reused by the experiments "transfer_length", "transfer_domain" and
# "passkey" (full settings)
FIGURES = REPO / "figures"
LENGTH_CELLS = FIGURES / "results" / "length_cells.parquet"
PASSKEY_TABLES = FIGURES / "results"

# ============================================================================================
# settings and context

@dataclass
class Settings:
    """Sizes of every experiment. ``FULL`` (embedded model and its shipped routers, long context,
    ~2 h on 2 CPU cores) and ``QUICK`` (tiny random model, minutes)."""

    name: str
    seq_len: int = 4096                 # eval / record / fit window length (baselines, domains, records)
    eval_windows: int = 4               # held-out windows per corpus
    fit_windows: int = 2                # training windows for k-means / online k-means
    record_windows: int = 2             # windows per recorded run
    baseline_top_ks: tuple | None = (1, 2)        # top-k of the baselines (None: 1..K)
    focus_top_ks: tuple | None = None             # top-k of Focus itself (None: 1..K)
    soft_seq_len: int = 512             # the soft gate's experiment (causal_leak): O(T^2) float bias
    soft_windows: int = 8
    # (corpus, tokens, windows) of the length-transfer and domain-transfer cells: the length
    # tables' (figures/results/length_cells.parquet, reused where made with the routers in use:
    # common.committed_rows)
    length_cells: tuple = (("austen", 512, 8), ("austen", 1024, 8), ("austen", 2048, 8), ("austen", 4096, 8),
                           ("austen", 8192, 4), ("shakespeare", 512, 8), ("shakespeare", 1024, 8),
                           ("shakespeare", 2048, 8), ("shakespeare", 4096, 8), ("shakespeare", 8192, 4))
    domain_cells: tuple = (("shakespeare", 4096, 8), ("python-docs", 4096, 4))
    cell_patterns: str = "dense,window,hard_top1,hard_top2,random_top1,random_top2,shuffled_top1,shuffled_top2"
    num_groups: int = 4
    window: int = 128
    sink_tokens: int = 4
    router_steps: int = 60              # only when no trained router exists
    router_batch: int = 2
    collapse_groups: int = 8            # docs/method.md §1: the collapse was reported with K = 8
    collapse_steps: int = 12
    collapse_seq_len: int = 512
    ablation_steps: int = 8
    ablation_seq_len: int = 512
    ablation_eval_windows: int = 2
    ablation_grid: dict = field(default_factory=lambda: {
        "num_groups": [2, 8], "window": [64, 256], "tau": [0.05, 0.2], "sinkhorn_iters": [1, 3]})
    lora_steps: int = 60                # LoRA trains at 512 tokens (a 4K backward is out of reach here)
    lora_seq_len: int = 512
    lora_batch: int = 2
    lora_lr: float = 1e-3
    lora_targets: tuple = ("q_proj", "v_proj")
    # passkey probe (focus_lab.eval.passkey): the committed tables in figures/results/ are reused
    passkey_lengths: tuple = (4096, 8184)
    passkey_depths: tuple = (0, 25, 50, 75, 100)
    passkey_keys: int = 3
    passkey_patterns: str = "dense,hard_top2,random_top2"
    bench_args: tuple = ("--sizes", "1024,2048,4096,8192,16384", "--Ks", "4,8", "--ks", "1,2",
                         "--repeats", "2", "--no-e2e", "--check-max-n", "0")


FULL = Settings("full")
QUICK = Settings(
    "quick", seq_len=64, eval_windows=2, fit_windows=2, record_windows=1, window=16, sink_tokens=2,
    baseline_top_ks=None, soft_seq_len=64, soft_windows=2,
    length_cells=(("austen", 64, 2), ("austen", 128, 1), ("austen", 256, 1)),
    domain_cells=(("shakespeare", 64, 2), ("python-docs", 64, 2)),
    router_steps=4, router_batch=1, collapse_groups=4, collapse_steps=3, collapse_seq_len=64,
    ablation_steps=2, ablation_seq_len=64, ablation_eval_windows=1,
    ablation_grid={"num_groups": [2], "window": [8], "tau": [0.2], "sinkhorn_iters": [1]},
    lora_steps=2, lora_seq_len=64, lora_batch=1, passkey_lengths=(96,), passkey_depths=(0, 100),
    passkey_keys=1,
    bench_args=("--sizes", "256,512", "--Ks", "4", "--ks", "1", "--repeats", "1", "--no-e2e",
                "--check-max-n", "0", "--heads", "2", "--kv-heads", "1", "--head-dim", "16", "--window", "32"))


class Context:
    """What experiments share: settings, the output folders, a model factory, corpora, windows."""

    def __init__(self, out: Path, quick: bool, log: Callable[[str], None] = print,
                 routers: Path | None = None):
        self.out = Path(out)
        self.data = self.out / "data"
        self.quick = quick
        self.settings = QUICK if quick else FULL
        self.log = log
        self._tok = None
        self._corpora: dict = {}
        self._windows: dict = {}
        if routers is None and not quick:
            from focus_lab.hf.shipped import shipped_router_file
            routers = shipped_router_file()
        self.default_routers = routers

    # ---------------------------------------------------------------- model and data
    def model(self):
        """A fresh model (its tokenizer is ``self.tokenizer``)."""
        if self.quick:
            from focus_lab.hf.tiny import tiny_llama
            m = tiny_llama(seed=0, layers=2, vocab_size=len(self.tokenizer), max_positions=1024,
                           bos_token_id=0, eos_token_id=0, pad_token_id=0)
            m.config._name_or_path = "tiny-random-llama"
            return m
        from focus_lab.hf.models import load_model
        m, tok = load_model(verbose=False)
        if self._tok is None:
            self._tok = tok
        return m

    @property
    def tokenizer(self):
        if self._tok is None:
            if self.quick:
                self._tok = quick_tokenizer()
            else:
                from focus_lab.hf.models import load_model
                m, self._tok = load_model(verbose=False)
                del m
        return self._tok

    def corpus(self, name: str):
        if name not in self._corpora:
            if self.quick:
                self._corpora[name] = quick_corpus(name)
            else:
                from focus_lab.data import load_corpus
                self._corpora[name] = load_corpus(name)
        return self._corpora[name]

    def windows(self, corpus: str, split: str, seq_len: int, n: int | None) -> list:
        """Windows of a corpus split ("train" / "heldout"), ``n`` spread evenly (None: all)."""
        key = (corpus, split, seq_len, n)
        if key not in self._windows:
            from focus_lab.data import make_windows
            c = self.corpus(corpus)
            self._windows[key] = make_windows(getattr(c, split), self.tokenizer, seq_len, max_windows=n)
        return self._windows[key]

    def texts(self, corpus: str) -> dict[str, str]:
        c = self.corpus(corpus)
        return {d.name: d.text for d in c.train + c.heldout}

    def base_config(self, **changes) -> FocusConfig:
        s = self.settings
        return FocusConfig(num_groups=s.num_groups, window=s.window, top_k=max(1, s.num_groups // 2),
                           sink_tokens=s.sink_tokens).replace(**changes)

    def routers(self) -> Path:
        """The trained router file (experiment "router" must have run)."""
        p = self.data / "router.parquet"
        if not p.is_file():
            raise FileNotFoundError(f"{p} is missing: run experiment 'router' first (focus-lab-figures --only router)")
        return Path(pd.read_parquet(p)["path"].iloc[0])

    def router_train_config(self, path: Path | None = None) -> dict:
        """The training config of the router file ``path`` (default ``self.routers()``):
        ``train_config.json`` beside it, else (a shipped file) its manifest entry's, else {}."""
        path = Path(path) if path is not None else self.routers()
        p = path.parent / "train_config.json"
        if p.is_file():
            return json.loads(p.read_text())["train_config"]
        from focus_lab.hf.shipped import manifest
        for entry in manifest().values():
            if entry.get("file") == path.name:
                # the entry's "steps" are the steps actually run (a run may stop at a checkpoint)
                return {**entry.get("train_config", {}), **({"steps": entry["steps"]} if "steps" in entry else {})}
        return {}

    def router_id(self) -> str:
        """The router file's sha256 (what the committed cells are matched on)."""
        from focus_lab.io import file_sha256
        return file_sha256(self.routers())


# ============================================================================================
# quick mode: a tiny tokenizer and built-in texts

_QUICK_TEXTS = {
    "austen": [
        "Anne had been walking in the garden when the letter arrived, and she read it twice before "
        "she understood that the captain would return to Bath within the week.",
        "Her sister thought the news of no importance; her father thought only of the card he "
        "would leave, and of the figure he would make at the concert.",
        "It is a truth universally acknowledged that a single man in possession of a good fortune "
        "must be in want of a wife, and every family in the village believed it.",
        "Elinor said nothing, for she had learnt that silence was the kindest answer her mother "
        "could receive, and she walked to the window to watch the rain.",
        "The evening passed in conversation and music; Mr. Elliot was attentive, Lady Russell was "
        "pleased, and Anne was tired of them all before the candles were lit.",
        "Persuasion had been her misfortune once, and she resolved that no persuasion of friend or "
        "relation should ever again divide her from the man she loved.",
    ],
    "shakespeare": [
        "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the "
        "slings and arrows of outrageous fortune.",
        "Now is the winter of our discontent made glorious summer by this sun of York, and all the "
        "clouds that lour'd upon our house.",
        "All the world's a stage, and all the men and women merely players; they have their exits "
        "and their entrances, and one man in his time plays many parts.",
        "Friends, Romans, countrymen, lend me your ears; I come to bury Caesar, not to praise him.",
        "What light through yonder window breaks? It is the east, and Juliet is the sun.",
        "The quality of mercy is not strain'd; it droppeth as the gentle rain from heaven upon the "
        "place beneath.",
    ],
    "python-docs": [
        "The for statement in Python iterates over the items of any sequence, a list or a string, "
        "in the order that they appear in the sequence.",
        "If you need to iterate over a sequence of numbers, the built-in function range() comes in "
        "handy; it generates arithmetic progressions.",
        "A dictionary maps hashable keys to arbitrary objects; the main operations are storing a "
        "value with some key and extracting the value given the key.",
        "Exceptions are raised when an error is detected; a try statement may have more than one "
        "except clause, to specify handlers for different exceptions.",
        "Modules can import other modules; it is customary but not required to place all import "
        "statements at the beginning of a module.",
        "The with statement wraps the execution of a block with methods defined by a context "
        "manager, so that cleanup code always runs.",
    ],
}


def _quick_doc(name: str, seed: int, n: int = 60) -> str:
    sents = _QUICK_TEXTS[name]
    rng = np.random.default_rng(seed)
    paras = []
    for _ in range(n // 3):
        paras.append(" ".join(sents[i] for i in rng.choice(len(sents), 3, replace=False)))
    return "\n\n".join(paras) + "\n"


def quick_corpus(name: str):
    """A built-in corpus for --quick: two training documents and one held-out document."""
    from focus_lab.data import Corpus, Document
    base = {"austen": 0, "shakespeare": 100, "python-docs": 200}[name]
    return Corpus(name, [Document(f"{name}-train-{i}", _quick_doc(name, base + i)) for i in range(2)],
                  [Document(f"{name}-heldout", _quick_doc(name, base + 50))])


def quick_tokenizer(vocab: int = 300):
    """A tiny fast BPE tokenizer trained on the built-in texts (offsets for spaCy alignment)."""
    from focus_lab.hf.tiny import bpe_tokenizer
    return bpe_tokenizer([s for v in _QUICK_TEXTS.values() for s in v], vocab, special_tokens=("<unk>",),
                         split_punctuation=True)


# ============================================================================================
# shared by the experiments

def _parts(ctx: Context, name: str) -> Path:
    p = ctx.data / f"{name}.parts"
    p.mkdir(parents=True, exist_ok=True)
    return p


def cached_part(ctx: Context, name: str, part: str, fn: Callable[[], pd.DataFrame]) -> pd.DataFrame:
    """One resumable unit of a multi-part experiment."""
    p = _parts(ctx, name) / f"{part}.parquet"
    if p.is_file():
        ctx.log(f"  [{name}] {part}: cached")
        return pd.read_parquet(p)
    t0 = time.perf_counter()
    df = fn()
    df["part_seconds"] = time.perf_counter() - t0
    write_parquet(p, df)
    ctx.log(f"  [{name}] {part}: {time.perf_counter() - t0:.0f}s")
    return df


def pattern_method(label: str) -> str:
    """The method of a length-table pattern: dense, window, focus (hard_topK), random
    (random_topK) or shuffled (shuffled_topK: the router's own groups, permuted)."""
    for prefix, method in (("hard_top", "focus"), ("random_top", "random"), ("shuffled_top", "shuffled")):
        if label.startswith(prefix):
            return method
    return label


def committed_rows(name: str, cell: str, labels: list[str], windows: list[int], cfg, sha: str,
                   log) -> pd.DataFrame:
    """Rows of the committed length-table cells (``LENGTH_CELLS``: every table's cells in one tidy
    file, a ``table`` column; made by ``analyses/length_table.py``) that this run may take instead
    of evaluating, for ``cell`` (``"<corpus>_<tokens>"``): router-free rows
    (``length_table.reusable_rows``) and rows made with this router (``length_table.same_router_rows``:
    the same file, one differing only in its per-layer budget, ``shipped.same_router_shas``, or
    one holding the same tensors under the same random layers, ``shipped.same_tensor_shas``;
    router patterns only under the per-layer k they run with now). A pattern is taken only when one table holds it on every window;
    tables are tried in name order. Columns: evaluate's + window."""
    from analyses.length_table import (committed_cells, complete_labels, reusable_rows, same_router_rows,
                                       split_cell, window_columns)
    from focus_lab.hf.shipped import capacity_only_shas, same_router_shas, same_tensor_shas
    shas, budget_only, taken, have = same_tensor_shas(sha), same_router_shas(sha) | capacity_only_shas(sha), [], set()
    corpus, tokens = split_cell(cell)
    cells = committed_cells(LENGTH_CELLS)
    cells = cells[(cells["corpus"] == corpus) & (cells["seq_len"] == tokens)]
    for table in sorted(cells["table"].unique()):
        old = cells[cells["table"] == table].drop(columns="table").reset_index(drop=True)
        rows = pd.concat([reusable_rows(old, labels, windows, cfg),
                          same_router_rows(old, labels, windows, cfg, shas, sha, budget_only)]
                         ).drop_duplicates(["label", "window"])
        full = complete_labels(rows, windows) - have
        if full:
            taken.append(rows[rows["label"].isin(full)][window_columns(rows)])
            have |= full
            log(f"  [{name}] {cell}: reusing {sorted(full)} from the committed table {table!r}")
    return pd.concat(taken, ignore_index=True) if taken else pd.DataFrame()


def length_cells(ctx: Context, name: str, specs) -> pd.DataFrame:
    """Per-window perplexities (``evaluate(..., per_window=True)``) of ``settings.cell_patterns``
    for each (corpus, tokens, windows) of ``specs``, on held-out windows; one resumable part per
    cell (``<out>/data/<name>.parts/<corpus>_<tokens>``). Full settings reuse the committed
    length-table cells (``committed_rows``: router-free rows, and rows made with this router, on
    the same windows) and evaluate only the patterns they lack. Columns: evaluate's + window,
    corpus, seq_len, reused (bool), method (``pattern_method``)."""
    from focus_lab.eval.evaluate import evaluate
    from focus_lab.patterns.legacy import parse_legacy_patterns as parse_patterns
    frames = []
    for corpus, T, n in specs:
        def run(corpus=corpus, T=T, n=n):
            ws = ctx.windows(corpus, "heldout", T, n)
            model = ctx.model()
            from focus_lab.hf.retrofit import load_routers
            cfg = load_routers(model, ctx.routers())
            pats = parse_patterns(ctx.settings.cell_patterns, cfg.num_groups)
            rows, todo = [], pats
            if not ctx.quick:
                old = committed_rows(name, f"{corpus}_{T}", [p[0] for p in pats], [int(w.index) for w in ws],
                                     cfg, ctx.router_id(), ctx.log)
                if len(old):
                    rows.append(old.assign(reused=True))
                    todo = [p for p in pats if p[0] not in set(old["label"])]
            if todo:
                rows.append(evaluate(model, ws, todo, progress=False, per_window=True).assign(reused=False))
            df = pd.concat(rows, ignore_index=True)
            df["corpus"], df["seq_len"] = corpus, T
            return df
        df = cached_part(ctx, name, f"{corpus}_{T}", run)
        df["method"] = df["label"].map(pattern_method)
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def convert_router(cls, r, **kw):
    """A router of class ``cls`` (``baselines.SoftmaxRouter``, ``baselines.PrefixCausalRouter``)
    holding router ``r``'s weights, for ``baselines.swap_routers``."""
    new = cls(r.proj.shape[0], r.config, r.layer_idx, **kw)
    new.load_state_dict(r.state_dict(), strict=False)
    return new


def focus_patterns(K: int, soft: bool = True, window: bool = True) -> list:
    """dense, window, soft, hard_top1..K as the committed tables' labels
    (``patterns.legacy.legacy_standard_patterns``), optionally without the soft and the window pattern."""
    from focus_lab.patterns.legacy import legacy_standard_patterns as standard_patterns
    return [p for p in standard_patterns(K) if (soft or p[0] != "soft") and (window or p[0] != "window")]

def evaluate_with_random(model, windows: list, patterns: list, top_k: int) -> pd.DataFrame:
    """``evaluate`` the patterns (method: dense / window / focus), then hard top-``top_k`` with
    balanced random groups at the same sparsity (method: random), one frame."""
    from focus_lab.eval.evaluate import evaluate
    df = evaluate(model, windows, patterns, progress=False)
    df.insert(0, "method", df["label"].map(lambda l: l if l in ("dense", "window") else "focus"))
    r = evaluate(model, windows, [(f"hard_top{top_k}", {"mode": "hard", "assignment": "random"})],
                 progress=False)
    r.insert(0, "method", "random")
    return pd.concat([df, r], ignore_index=True)



RECORD_METHODS = ("focus", "kmeans", "online_kmeans", "moba")


def shipped_window(seq_len: int):
    """The embedded model with the shipped router file loaded, its config, and the first held-out
    Austen window of ``seq_len`` tokens as (1, T) ids: the setup of the in-process benchmarks."""
    import focus_lab
    from focus_lab.data import load_corpus, make_windows
    from focus_lab.hf.shipped import shipped_router_file
    model, tok = focus_lab.load_model()
    cfg = focus_lab.load_routers(model, shipped_router_file())
    ids = make_windows(load_corpus("austen").heldout, tok, seq_len, max_windows=1)[0].input_ids[None]  # (1, T)
    return model, cfg, ids


def bench_dir(out: Path) -> Path | None:
    """Where the benchmark's outputs are: ``<out>/bench_attention`` (the benchmark's own default
    folder when ``out`` is figures/), else ``<out>/data/bench_attention``, else None."""
    for p in (Path(out) / "bench_attention", Path(out) / "data" / "bench_attention"):
        if (p / "kernel.csv").is_file():
            return p
    return None


def shown_path(path: Path | None) -> str:
    """``path`` as a figure shows it: relative to the repository when inside it (no machine's
    absolute paths in committed figures), else as given."""
    if path is None:
        return "-"
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def gpu_kernel_runs(bench: Path | None) -> list[tuple[str, dict[str, pd.DataFrame]]]:
    """Every GPU kernel benchmark beside the CPU one, oldest first: per ``gpu_<tag>_env.json`` in the
    ``bench_dir`` folder (figures/bench_attention/gpu_h100.md, gpu_h200.md), (the GPU's name, e.g.
    "H200", {dtype: rows}) from its ``gpu_<tag>_kernel_<dtype>.csv``; each dtype's rows are the mean
    ``speedup`` per (n, K, k, groups, backend) over repeated rows (``backend`` "auto" where a table
    predates the column). [] when there is none."""
    if bench is None:
        return []
    runs = []
    for env in Path(bench).glob("gpu_*_env.json"):
        info = json.loads(env.read_text())
        runs.append((str(info.get("finished", "")), env.name[len("gpu_"):-len("_env.json")], info.get("gpu", "")))
    out = []
    for _, tag, gpu in sorted(runs):
        tables = {}
        for f in sorted(Path(bench).glob(f"gpu_{tag}_kernel_*.csv")):
            df = pd.read_csv(f)
            df = df.assign(backend=df["backend"] if "backend" in df else "auto")
            tables[f.stem.rsplit("_", 1)[-1]] = (df.groupby(["n", "K", "k", "groups", "backend"], as_index=False)
                                                 .speedup.mean())
        out.append((gpu.replace("NVIDIA ", "") or tag.upper(), tables))
    return out


def gpu_kernel_tables(bench: Path | None) -> tuple[str, dict[str, pd.DataFrame]]:
    """The newest GPU kernel benchmark of ``gpu_kernel_runs`` (the one whose env.json finished
    last); ("", {}) when there is none."""
    runs = gpu_kernel_runs(bench)
    return runs[-1] if runs else ("", {})


# ============================================================================================
# shared by the figure and table modules

# experiments whose perplexities are stored one row per window (``window``: the window's index)
PER_WINDOW = ("baselines", "transfer_length", "transfer_domain", "lora", "causal_leak")


def read(data_dir: Path, name: str, per_window: bool = False) -> pd.DataFrame:
    """An experiment's cached result; FileNotFoundError naming the command that makes it.

    The ``PER_WINDOW`` experiments store one row per window (a ``window`` column); unless
    ``per_window``, those rows are pooled over windows (``evaluate.pool_windows``: token-weighted
    perplexity, summed tokens and seconds, a ``windows`` count) and ``speedup`` is recomputed
    from the pooled tokens/s (over dense's, per corpus and length)."""
    from focus_lab.eval.evaluate import add_speedup, pool_windows
    p = Path(data_dir) / f"{name}.parquet"
    if not p.is_file():
        raise FileNotFoundError(f"{p} is missing: run `focus-lab-figures` (experiment {name!r})")
    df = pd.read_parquet(p)
    if per_window or name not in PER_WINDOW:
        return df
    had_speedup = "speedup" in df.columns
    out = pool_windows(df.drop(columns=[c for c in ("speedup", "part_seconds") if c in df.columns]))
    return add_speedup(out, by=("corpus", "seq_len")) if had_speedup else out


def change_table(df: pd.DataFrame, by=("corpus", "seq_len"), patterns=("method", "label"),
                 reference: tuple = ("dense", "dense")) -> pd.DataFrame:
    """Per-window rows (``read(..., per_window=True)``) summarized per group ``by`` and pattern:
    pooled perplexity, windows, tokens, mean distant pairs kept, tokens/s, and the change vs the
    ``reference`` pattern of the same group in % with its 95% paired bootstrap interval over
    windows (``evaluate.paired_change``; change_pct, ci_lo, ci_hi; NaN for the reference)."""
    from focus_lab.eval.evaluate import paired_change, pool_windows
    by, patterns = list(by), list(patterns)
    rows = []
    for key, g in df.groupby(by, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        ref = g
        for col, val in zip(patterns, reference):
            ref = ref[ref[col] == val]
        pooled = pool_windows(g[[c for c in g.columns if c in set(by) | set(patterns) | {
            "window", "nll", "tokens", "seconds", "distant_pairs_kept", "max_group_share"}]])
        for _, r in pooled.iterrows():
            part = g
            for col in patterns:
                part = part[part[col] == r[col]]
            is_ref = tuple(r[c] for c in patterns) == tuple(reference)
            ch = (float("nan"),) * 3 if is_ref or not len(ref) else paired_change(part, ref)
            rows.append({**dict(zip(by, key)), **{c: r[c] for c in patterns}, "perplexity": r["perplexity"],
                         "windows": int(r["windows"]), "tokens": int(r["tokens"]),
                         "distant_pairs_kept": r["distant_pairs_kept"], "tokens_per_second": r["tokens_per_second"],
                         "change_pct": ch[0], "ci_lo": ch[1], "ci_hi": ch[2]})
    return pd.DataFrame(rows)


def placeholder(title: str, why: str):
    """A figure that says which data is missing (so every output file exists)."""
    import plotly.graph_objects as go
    fig = go.Figure()
    fig.add_annotation(text=f"no data yet: {why}", showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(title=title, template="plotly_white", width=900, height=400)
    return fig


METHOD_NAMES = {"shuffled": "shuffled groups (router's, permuted)", "dense": "dense (full attention)", "window": "sliding window", "window_matched":
                "window at matched sparsity", "focus": "Focus (trained router)", "random": "random groups",
                "kmeans": "k-means groups", "online_kmeans": "online k-means (Routing Transformer)",
                "moba": "MoBA block gate", "lora": "LoRA (equal budget)"}
METHOD_COLORS = {"shuffled": "#8c564b", "dense": "#222222", "window": "#7f7f7f", "window_matched": "#bcbd22", "focus": "#d62728",
                 "random": "#1f77b4", "kmeans": "#2ca02c", "online_kmeans": "#9467bd", "moba": "#ff7f0e",
                 "lora": "#17becf"}


def pareto_front(x: np.ndarray, y: np.ndarray, larger_x_better: bool) -> np.ndarray:
    """Indices of the points on the Pareto frontier (lower y better; larger or smaller x
    better), ordered by x."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(x) & np.isfinite(y)
    idx = np.where(ok)[0]
    order = idx[np.argsort(-x[idx] if larger_x_better else x[idx], kind="stable")]
    front, best = [], np.inf
    for i in order:
        if y[i] < best:
            front.append(i)
            best = y[i]
    return np.array(sorted(front, key=lambda i: x[i]), dtype=int)


def layer_seconds(layers) -> dict[int, float]:
    """Time each decoder layer of ``layers`` (a ``ModuleList``) by a forward pre-hook and hook:
    returns the dict {layer index: seconds} that the hooks add to, for the caller to clear between
    forwards. The hooks stay registered: for benchmark processes only."""
    seconds: dict[int, float] = {}
    start: dict[int, float] = {}
    for i, layer in enumerate(layers):
        layer.register_forward_pre_hook(lambda m, a, i=i: start.__setitem__(i, time.perf_counter()))
        layer.register_forward_hook(
            lambda m, a, o, i=i: seconds.__setitem__(i, seconds.get(i, 0.0) + time.perf_counter() - start[i]))
    return seconds

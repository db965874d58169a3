"""Per-layer top-k budget: which layers need distant attention, and which need more of it.

Hard top-1 keeps about 30% of the distant pairs at 4096 tokens in every layer alike. This
measures, on *validation* windows (the training split of each corpus, never the held-out text
the length table reports), the NLL change when one layer alone leaves top-1: k = 0 (window and
sinks only) or k = 2, every other layer at k = 1 (``FocusConfig.layer_top_k``, docs/method.md
§2.7). Then it allocates: the n layers cheapest at k = 0 and the n layers gaining most at k = 2,
with n the largest number of pairs whose predicted gain exceeds their predicted cost (one layer
down and one up keep about the same share of distant pairs; additivity is assumed, and the length
table then measures the result). It prints and saves the ``--layer-top-k`` spec.

``--base-k 2`` does the same around top-2 (one layer at k = 1 or k = 3, the others at top-2).

``--sweep random`` asks another question at the uniform top-``base_k``: for each layer alone, does
the model predict better with that layer's assignment flipped (its router replaced by balanced
random groups, or, for a layer in the routers' ``random_layers``, its router put back;
docs/method.md §2.6)? ``choose_random_layers`` then flips every layer whose flip lowers the NLL on
both corpora and prints the ``--random-layers`` spec (``random_spec.txt``). Same sparsity in every
variant, so the choice moves no budget: it only asks where the router's groups beat random ones.

Each (layer, k) result is written when done (``sweep.parquet``), so a rerun resumes.
``--commit STUDY`` adds the finished sweep to figures/results/layer_budget.parquet; ``--pool
STUDIES`` allocates over this sweep and committed studies together (each against its own uniform
base), e.g. a sweep on technical text pooled with the literary study ``top2``.

``--save-budget OUT`` writes the routers again (same tensors) with a chosen spec as their file's
budget for top-``base_k`` (``FocusConfig.top_k_budgets``: the file's default per-layer k when
top-``base_k`` is asked, docs/method.md §2.7); the spec is ``--spec`` or this study's committed
choice (``figures/results/layer_budget.json``, key ``top<base_k>``). No evaluation runs.

Usage (background; about 25 s per 4096-token window and variant on 2 cores)::

    python -m analyses.studies.layer_budget --out checkpoints/layer_budget
    python -m analyses.length_table --layer-top-k "$(cat checkpoints/layer_budget/spec.txt)" ...
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd

SCHEMA_VERSION = 1
# the committed choices of this study: {"top1" | "top2" | "random_layers": {"spec": ..., ...}}
BUDGET_JSON = Path(__file__).resolve().parents[2] / "figures" / "results" / "layer_budget.json"


def allocate(sweep: pd.DataFrame, max_pairs: int | None = None, base_k: int = 1) -> tuple[dict[int, int], pd.DataFrame]:
    """The per-layer k from a sweep: pairs (cheapest layer at k = base_k - 1, best layer at
    k = base_k + 1), taken while the pair's predicted NLL change (cost of the drop minus gain of
    the raise) is < 0.

    Args:
        sweep: rows layer_idx, top_k (base_k - 1 or base_k + 1), delta_nll (nats/token vs uniform
            top-base_k, mean over the validation windows).
        max_pairs: at most this many pairs (None: no limit).
        base_k: the uniform k the sweep moved one layer away from (1: top-1, the default).
    Returns: ({layer_idx: k} for the changed layers, the chosen pairs as a table).
    Raises: ValueError when the sweep lacks rows of either k.
    """
    lo, hi = base_k - 1, base_k + 1
    by = sweep.groupby(["layer_idx", "top_k"]).delta_nll.mean().unstack()
    if lo not in by or hi not in by:
        raise ValueError(f"the sweep needs rows with top_k {lo} and {hi}; run analyses/studies/layer_budget.py to the end")
    down = by[lo].sort_values()  # cheapest drop first (delta >= 0 mostly)
    up = by[hi].sort_values()  # largest gain first (most negative delta)
    spec: dict[int, int] = {}
    pairs = []
    d_iter, u_iter = iter(down.items()), iter(up.items())
    while max_pairs is None or len(pairs) < max_pairs:
        d = next(((i, v) for i, v in d_iter if i not in spec), None)
        u = next(((i, v) for i, v in u_iter if i not in spec and (d is None or i != d[0])), None)
        if d is None or u is None or d[1] + u[1] >= 0:
            break
        spec[int(d[0])], spec[int(u[0])] = lo, hi
        pairs.append({"down": int(d[0]), "down_delta": d[1], "up": int(u[0]), "up_delta": u[1],
                      "pair_delta": d[1] + u[1]})
    return spec, pd.DataFrame(pairs)


def choose_random_layers(sweep: pd.DataFrame, current: list[int], min_gain: float = 0.0) -> tuple[list[int], pd.DataFrame]:
    """The random layers after flipping each layer whose flip lowers the NLL on every corpus.

    Args:
        sweep: rows corpus, layer_idx, delta_nll (nats/token of the flipped variant vs the
            unflipped base, mean over each corpus's windows).
        current: the routers' ``random_layers`` (the base).
        min_gain: a flip is taken only when it lowers the NLL by more than this on every corpus
            (nats/token; 0: any decrease).
    Returns: (the new sorted random layers, one row per layer: layer_idx, random_now, the
        per-corpus delta_nll columns, worst (the largest delta), flip).
    Raises: ValueError on an empty sweep.
    """
    if sweep.empty:
        raise ValueError("the sweep has no rows; run analyses/studies/layer_budget.py --sweep random to the end")
    by = sweep.groupby(["layer_idx", "corpus"]).delta_nll.mean().unstack()
    table = by.copy()
    table.insert(0, "random_now", [i in current for i in by.index])
    table["worst"] = by.max(axis=1)
    table["flip"] = table.worst < -min_gain
    new = sorted(set(current) ^ set(table.index[table.flip]))  # a flip toggles the layer's membership
    return [int(i) for i in new], table.reset_index()


def deltas(table: pd.DataFrame) -> pd.DataFrame:
    """The one-layer rows of a sweep with ``delta_nll``: their NLL minus the uniform base's
    (``layer_idx`` -1) on the same (corpus, window), nats/token. Raises ValueError without a
    base row for every window."""
    base = table[table.layer_idx == -1].set_index(["corpus", "window"]).nll
    sweep = table[table.layer_idx >= 0].copy()
    keys = list(zip(sweep.corpus, sweep.window))
    if not set(keys) <= set(base.index):
        raise ValueError("a sweep row has no uniform base on its window; run the sweep to the end")
    sweep["delta_nll"] = sweep.nll.values - base.loc[keys].values
    return sweep


def pooled_study(name: str, base_k: int) -> pd.DataFrame:
    """A committed study's rows (figures/results/layer_budget.parquet) for ``--pool``.
    Raises SystemExit when there is no such study or it moved another k than ``base_k`` -/+ 1."""
    path = BUDGET_JSON.with_suffix(".parquet")
    rows = pd.read_parquet(path) if path.is_file() else pd.DataFrame(columns=["study"])
    if not (rows.study == name).any():
        raise SystemExit(f"--pool {name}: no such study in {path} (studies there: "
                         f"{', '.join(sorted(rows.study.unique())) or 'none'})")
    rows = rows[rows.study == name]
    ks = set(rows[rows.layer_idx >= 0].top_k)
    if not {base_k - 1, base_k + 1} <= ks:
        raise SystemExit(f"--pool {name}: that study moved layers to k in {sorted(ks)}, not {base_k - 1} and "
                         f"{base_k + 1} (--base-k {base_k})")
    return rows.drop(columns="study")


def commit_study(table: pd.DataFrame, name: str) -> None:
    """Write a sweep's rows into figures/results/layer_budget.parquet as study ``name``
    (replacing rows of that name; written to a temporary file, then renamed)."""
    from focus_lab.io import with_table
    from focus_lab.io import write_parquet
    path = BUDGET_JSON.with_suffix(".parquet")
    write_parquet(path, with_table(path, table, name, column="study"))
    print(f"study {name}: {len(table)} rows -> {path}")


def spec_string(spec: dict[int, int]) -> str:
    """{1: 0, 2: 0, 5: 2} -> '1,2:0;5:2' (``config.parse_layer_top_k``'s form)."""
    parts = []
    for k in sorted(set(spec.values())):
        parts.append(",".join(str(i) for i in sorted(i for i, v in spec.items() if v == k)) + f":{k}")
    return ";".join(parts) or "none"


def save_budget(routers: Path | None, out: Path, base_k: int, spec: str | None = None) -> Path:
    """Write ``routers`` (default: the shipped file) again to ``out`` (atomically), tensors and
    extra unchanged, with ``spec`` as ``FocusConfig.top_k_budgets[base_k]`` (default: the committed
    choice ``layer_budget.json['top<base_k>']['spec']``). Returns ``out``.
    Raises SystemExit when no spec is given and none is committed for ``base_k``."""
    from focus_lab.hf.retrofit import read_router_file, write_router_file
    from focus_lab.hf.shipped import resolve_routers
    from focus_lab.method.config import parse_layer_top_k
    if spec is None:
        chosen = json.loads(BUDGET_JSON.read_text()) if BUDGET_JSON.is_file() else {}
        spec = chosen.get(f"top{base_k}", {}).get("spec")
        if not spec:
            raise SystemExit(f"no committed spec for top-{base_k} in {BUDGET_JSON}: give --spec")
    cfg, base, tensors, extra = read_router_file(resolve_routers(routers))
    budgets = {**(cfg.top_k_budgets or {}), base_k: parse_layer_top_k(spec)}
    return write_router_file(out, tensors, cfg.replace(top_k_budgets=budgets), base, extra or None)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--routers", type=Path, default=None, help="default: the shipped routers")
    ap.add_argument("--corpora", default="austen,shakespeare", help="one validation window from each "
                    "corpus's training split")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--windows", type=int, default=1, help="validation windows per corpus")
    ap.add_argument("--base-k", type=int, default=1, help="the uniform top-k every other layer keeps; "
                    "one layer at a time goes to base-k - 1 and base-k + 1 (default 1: top-1)")
    ap.add_argument("--sweep", choices=["top_k", "random"], default="top_k", help="top_k: one layer at "
                    "base-k -/+ 1 (the budget); random: one layer's assignment flipped (router <-> random groups)")
    ap.add_argument("--ks", default=None, help="--sweep top_k: the k's one layer goes to, comma-separated "
                    "(default: base-k - 1 and base-k + 1; k = num_groups makes the layer dense, "
                    "docs/method.md §2.7); the allocation needs both defaults")
    ap.add_argument("--min-gain", type=float, default=0.0, help="--sweep random: flip a layer only when "
                    "the NLL falls by more than this on every corpus (nats/token)")
    ap.add_argument("--out", type=Path, default=Path("checkpoints/layer_budget"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save-budget", type=Path, default=None, metavar="OUT",
                    help="write the routers with the spec as their top-<base-k> budget to OUT, then exit")
    ap.add_argument("--spec", default=None, help="with --save-budget: the spec (default: the committed "
                    "choice for top-<base-k> in figures/results/layer_budget.json)")
    ap.add_argument("--commit", default=None, metavar="STUDY",
                    help="add this sweep's rows to figures/results/layer_budget.parquet as study STUDY "
                         "(rows of that study are replaced)")
    ap.add_argument("--pool", default=None, metavar="STUDIES",
                    help="allocate over this sweep and the committed studies named (comma-separated, "
                         "e.g. top2): every study's NLL changes against its own uniform base, averaged "
                         "over all their windows alike")
    args = ap.parse_args(argv)
    if args.save_budget is not None:
        print(save_budget(args.routers, args.save_budget, args.base_k, args.spec))
        return

    import torch
    from focus_lab.data import load_corpus, make_windows
    from focus_lab.eval.evaluate import evaluate
    from focus_lab.io import atomic_path, write_parquet
    from focus_lab.hf.models import load_model
    from focus_lab.io import file_sha256
    from focus_lab.hf.retrofit import load_routers, routers as routers_of
    from focus_lab.hf.shipped import resolve_routers

    torch.set_num_threads(args.threads)
    routers = resolve_routers(args.routers)
    model, tok = load_model()
    cfg = load_routers(model, routers)
    windows = []
    for corpus in args.corpora.split(","):
        ws = make_windows(load_corpus(corpus).train, tok, args.seq_len, max_windows=args.windows)
        windows += [(corpus, w) for w in ws]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "sweep.parquet"
    done = pd.read_parquet(path) if path.is_file() else pd.DataFrame()
    if len(done) and done.get("sweep", pd.Series("top_k", index=done.index)).ne(args.sweep).any():
        raise SystemExit(f"{path} holds another --sweep's rows; give this sweep its own --out")
    rows = [done] if len(done) else []

    current = sorted(cfg.random_layers or [])
    default_ks = [args.base_k - 1, args.base_k + 1]
    try:
        ks = sorted(int(x) for x in args.ks.split(",")) if args.ks else default_ks  # one layer at a time goes to these
    except ValueError:
        raise SystemExit(f"--ks {args.ks!r}: need comma-separated integers, e.g. 4 or 1,3") from None

    def run(layer: int | None, k: int | None) -> pd.DataFrame:
        changes = {"mode": "hard", "top_k": args.base_k, "layer_top_k": {}}
        if layer is not None and args.sweep == "random":  # the layer's assignment flipped, k unchanged
            changes["random_layers"] = sorted(set(current) ^ {layer})
        elif layer is not None:
            changes["layer_top_k"] = {layer: k}
        out = []
        for corpus, w in windows:
            df = evaluate(model, [w], [(f"hard_top{args.base_k}", changes)], progress=False)
            out.append({"corpus": corpus, "window": w.index, "layer_idx": -1 if layer is None else layer,
                        "top_k": args.base_k if layer is None else k, "nll": float(df.nll[0]),
                        "distant_pairs_kept": float(df.distant_pairs_kept[0]), "seconds": float(df.seconds[0])})
        return pd.DataFrame(out)

    if args.sweep == "random":
        todo = [(None, None)] + [(i, args.base_k) for i in sorted(routers_of(model))]
    else:
        if any(not 0 <= k <= cfg.num_groups for k in ks):
            raise SystemExit(f"--ks {args.ks}: need k's in 0..num_groups={cfg.num_groups}")
        todo = [(None, None)] + [(i, k) for k in ks for i in sorted(routers_of(model))]
    t0 = time.perf_counter()
    for layer, k in todo:
        lid = -1 if layer is None else layer
        if len(done) and ((done.layer_idx == lid) & (done.top_k == (args.base_k if layer is None else k))).any():
            continue
        rows.append(run(layer, k))
        table = pd.concat(rows, ignore_index=True)
        table["seq_len"], table["routers_sha256"], table["sweep"] = args.seq_len, file_sha256(routers), args.sweep
        table["schema_version"] = SCHEMA_VERSION
        write_parquet(path, table)
        print(f"layer {lid} k={k}: nll {rows[-1].nll.mean():.4f} kept {rows[-1].distant_pairs_kept.mean():.3f} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)

    table = pd.concat(rows, ignore_index=True)
    if args.commit:
        commit_study(table, args.commit)
    sweep = deltas(table)
    if args.sweep == "random":
        new, flips = choose_random_layers(sweep, current, args.min_gain)
        print(flips.to_string(index=False))
        text = ",".join(str(i) for i in new) or "none"
        print("--random-layers", text)
        with atomic_path(args.out / "random_spec.txt") as tmp:
            Path(tmp).write_text(text + "\n")
        with atomic_path(args.out / "random_choice.json") as tmp:
            Path(tmp).write_text(json.dumps({"random_layers": new, "base_random_layers": current,
                                             "flips": flips.to_dict("records"), "min_gain": args.min_gain,
                                             "windows": [[c, w.index] for c, w in windows], "seq_len": args.seq_len,
                                             "top_k": args.base_k, "routers": str(routers),
                                             "routers_sha256": file_sha256(routers), "base_config": cfg.to_dict()},
                                            indent=1, default=str))
        return
    if ks != default_ks:
        by = sweep.groupby(["layer_idx", "top_k"]).delta_nll.mean().unstack()  # nats/token vs uniform
        print(by.sort_values(list(by.columns)).to_string(float_format=lambda x: f"{x:+.5f}"))
        return  # no allocation: it pairs base-k - 1 with base-k + 1
    if args.pool:
        sweep = pd.concat([sweep] + [deltas(pooled_study(name, args.base_k)) for name in args.pool.split(",")],
                          ignore_index=True)
    spec, pairs = allocate(sweep, base_k=args.base_k)
    print(pairs.to_string(index=False))
    text = spec_string(spec)
    print("--layer-top-k", text)
    with atomic_path(args.out / "spec.txt") as tmp:
        Path(tmp).write_text(text + "\n")
    with atomic_path(args.out / "allocation.json") as tmp:
        Path(tmp).write_text(json.dumps({"spec": text, "pairs": pairs.to_dict("records"), "pool": args.pool,
                                         "windows": [[c, w.index] for c, w in windows], "seq_len": args.seq_len,
                                         "routers": str(routers), "routers_sha256": file_sha256(routers),
                                         "base_config": cfg.to_dict()}, indent=1, default=str))


if __name__ == "__main__":
    main()

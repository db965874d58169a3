"""Train each router recipe on Austen and evaluate soft and hard top-1..K on Persuasion.

Every recipe (focus_lab/train/recipes.py) trains the same number of steps on the same windows from the
same initialization, then is evaluated on the same held-out windows. Results append to
``<out>/recipes.parquet`` one recipe at a time (resumable: finished recipes are skipped), with
the training cost of each. The dense, sliding-window and random-groups controls are evaluated
once. Usage (background; ~15 min per recipe on 2 CPU cores)::

    nohup .venv/bin/python analyses/studies/recipes_sweep.py --out figures/recipes > logs/recipes.log 2>&1 &
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch

import focus_lab
from focus_lab import FocusConfig, TrainConfig
from focus_lab.data import load_corpus, make_windows
from focus_lab.eval.evaluate import evaluate
from focus_lab.patterns.legacy import legacy_standard_patterns as standard_patterns
from focus_lab.io import write_parquet
from focus_lab.hf.models import load_model
from focus_lab.train.recipes import recipe
from focus_lab.train.loop import train

ORDER = ["sinks", "paper", "sinks_straight_through", "calibrated", "straight_through",
         "coverage", "sinks64", "coverage64",
         "sinks_hard_phase", "sinks_anneal", "hard_phase", "anneal"]
recipe_changes = recipe  # one registry: focus_lab.train.recipes.RECIPES (the sweep adds nothing)


def report(rows: pd.DataFrame, K: int) -> str:
    """Markdown table: recipe x (soft, hard top-1..K) perplexity, distant pairs kept at top-1 /
    top-2, the largest hard group's share, training seconds; controls first."""
    dense = float(rows.loc[(rows.recipe == "controls") & (rows.label == "dense"), "perplexity"].iloc[0])
    head = ["recipe", "soft"] + [f"hard top-{k}" for k in range(1, K + 1)] + \
        ["top-1 / top-2 vs dense", "distant pairs kept (top-1 / top-2)", "largest group (hard)", "train s"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    ctl = rows[rows.recipe == "controls"].set_index("label")
    lines.append(f"| dense (no Focus) | {dense:.2f} |" + " |" * (len(head) - 2))
    for name, pre in (("random groups", "random_hard_top"), ("random groups + 4 sinks", "random_sinks4_hard_top")):
        if f"{pre}1" in ctl.index:
            a, b = ctl.loc[f"{pre}1"], ctl.loc[f"{pre}2"]
            cells = ["", f"{a.perplexity:.2f}", f"{b.perplexity:.2f}"] + [""] * (K - 2)
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {100 * (a.perplexity / dense - 1):+.1f}% / "
                         f"{100 * (b.perplexity / dense - 1):+.1f}% | {a.distant_pairs_kept:.2f} / "
                         f"{b.distant_pairs_kept:.2f} | {a.max_group_share:.2f} | 0 |")
    for name in [r for r in rows.recipe.unique() if r != "controls"]:
        g = rows[rows.recipe == name].set_index("label")
        cells = [f"{g.loc['soft', 'perplexity']:.2f}" if "soft" in g.index else ""]
        cells += [f"{g.loc[f'hard_top{k}', 'perplexity']:.2f}" if f"hard_top{k}" in g.index else ""
                  for k in range(1, K + 1)]
        t1, t2 = g.loc["hard_top1"], g.loc["hard_top2"]
        cells += [f"{100 * (t1.perplexity / dense - 1):+.2f}% / {100 * (t2.perplexity / dense - 1):+.2f}%",
                  f"{t1.distant_pairs_kept:.2f} / {t2.distant_pairs_kept:.2f}", f"{t1.max_group_share:.2f}",
                  f"{g.train_seconds.iloc[0]:.0f}"]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("figures/recipes"))
    ap.add_argument("--recipes", nargs="*", default=ORDER)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--train-seq-len", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--eval-seq-len", type=int, default=1024)
    ap.add_argument("--eval-windows", type=int, default=3)
    ap.add_argument("--num-groups", type=int, default=4)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--report", action="store_true", help="only print the markdown table of --out")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    table = args.out / "recipes.parquet"
    rows = pd.read_parquet(table) if table.is_file() else pd.DataFrame()
    if args.report:
        print(report(rows, args.num_groups))
        return
    done = set(rows["recipe"]) if len(rows) else set()

    model, tok = load_model()
    corp = load_corpus("austen")
    train_w = make_windows(corp.train, tok, args.train_seq_len)
    eval_w = make_windows(corp.heldout, tok, args.eval_seq_len, max_windows=args.eval_windows)
    K = args.num_groups
    base = FocusConfig(num_groups=K, window=args.window, top_k=2)

    def save(new: pd.DataFrame) -> None:
        nonlocal rows
        rows = pd.concat([rows, new], ignore_index=True)
        write_parquet(table, rows)
        show = rows[["recipe", "label", "perplexity", "distant_pairs_kept", "max_group_share", "train_seconds"]]
        print(show.to_string(index=False, float_format=lambda x: f"{x:.4f}"), flush=True)

    if "controls" not in done:
        focus_lab.attach(model, base.replace(assignment="random"))
        pats = [("dense", {"mode": "dense"}), ("window", {"mode": "window", "sink_tokens": 0}),
                ("window_sinks4", {"mode": "window", "sink_tokens": 4})]
        pats += [(f"random_hard_top{k}", {"mode": "hard", "top_k": k, "sink_tokens": 0}) for k in (1, 2)]
        pats += [(f"random_sinks4_hard_top{k}", {"mode": "hard", "top_k": k, "sink_tokens": 4}) for k in (1, 2)]
        df = evaluate(model, eval_w, pats, progress=False)
        df["recipe"], df["train_seconds"] = "controls", 0.0
        focus_lab.detach(model)
        save(df)

    for name in args.recipes:
        if name in done:
            continue
        fch, tch = recipe_changes(name)
        fcfg = base.replace(**fch)
        tcfg = TrainConfig(steps=args.steps, seq_len=args.train_seq_len, batch_size=args.batch_size, **tch)
        t0 = time.perf_counter()
        res = train(model, train_w, fcfg, tcfg, args.out / name, progress=False,
                    meta={"recipe": name})
        dt = time.perf_counter() - t0
        pats = [p for p in standard_patterns(K) if p[0] not in ("dense", "window")]
        df = evaluate(model, eval_w, pats, progress=False)
        df["recipe"], df["train_seconds"] = name, dt
        df["first_loss"], df["last_loss"] = res.first_loss, res.last_loss
        focus_lab.detach(model)
        save(df)


if __name__ == "__main__":
    torch.manual_seed(0)
    main()

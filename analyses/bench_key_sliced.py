"""What key-sliced masked attention (``core.masked_attention`` above ``SDPA_QUERY_CHUNK`` queries on
the host) saves Gemma-3-270M's Focus forward: its 15 sliding layers attend to 512 keys but took
the whole (T, T) masked product, 92% of the body at 32K (docs/studies/gemma-long-context-bounds.md).

One process, one held-out *Persuasion* window per length, the routers attached (``--routers``, default the shipped file); for each
pattern (dense, hard top-1, hard top-2 through the Focus path: the same sliding layers for all)
the body forward (``model.model``, under ``torch.no_grad``, 2 threads) is timed with the whole
masked product (``SDPA_QUERY_CHUNK`` set above T) and key-sliced (512 queries a call), the two
alternating so that both see the same load; the largest difference of the final hidden states is
printed with each pair, and the share of the body the three global layers (5, 11, 17) take. The
ratios printed are those of this run.

    python -m analyses.bench_key_sliced --lengths 4096,8192 --out figures/gemma/bench_key_sliced.csv
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

GLOBAL_LAYERS = (5, 11, 17)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="4096,8192")
    ap.add_argument("--patterns", default="dense,hard_top1,hard_top2")
    ap.add_argument("--paths", default="whole,key_sliced", help="key_sliced alone at lengths where the whole "
                    "product takes too long (rows are added to --out, a length's earlier rows replaced)")
    ap.add_argument("--out", type=Path, default=Path("figures/gemma/bench_key_sliced.csv"))
    ap.add_argument("--routers", type=Path, default=None, help="router file (default: the one shipped for gemma3-270m)")
    a = ap.parse_args(argv)
    import pandas as pd
    import torch

    import focus_lab
    from focus_lab.data import load_corpus, make_windows
    from focus_lab.hf.models import load_model
    from focus_lab.hf.retrofit import forward_state
    from focus_lab.hf.shipped import router_columns, shipped_router_file
    from focus_lab.io import machine, machine_line, write_text
    from focus_lab.method import core
    from focus_lab.patterns.legacy import parse_legacy_patterns
    from analyses.length_table import pattern_in_force

    torch.set_num_threads(2)
    model, tok = load_model("gemma3-270m", verbose=False)
    routers = a.routers or shipped_router_file("gemma3-270m")
    cfg = focus_lab.load_routers(model, routers)
    from analyses.common import layer_seconds
    layer_s = layer_seconds(model.model.layers)  # {layer index: seconds} of the forward
    rows = []
    chunk = core.SDPA_QUERY_CHUNK
    for T in (int(x) for x in a.lengths.split(",")):
        ids = make_windows(load_corpus("austen").heldout, tok, T, max_windows=1)[0].input_ids[None]  # (1, T)
        for label, changes in parse_legacy_patterns(a.patterns, cfg.num_groups):
            label = pattern_in_force(cfg, label) or label  # recorded as the pattern that ran (hard_top1+key_shift)
            state = forward_state(model, **changes)
            hidden = {}
            with torch.no_grad():
                model.model(input_ids=ids[:, :256], use_cache=False, focus=state)  # warm-up
                for path, c in ((p, {"whole": 10 ** 9, "key_sliced": chunk}[p]) for p in a.paths.split(",")):
                    core.SDPA_QUERY_CHUNK = c
                    layer_s.clear()
                    load = os.getloadavg()[0]
                    t0 = time.perf_counter()
                    hidden[path] = model.model(input_ids=ids, use_cache=False, focus=state).last_hidden_state
                    body = time.perf_counter() - t0
                    rows.append({"seq_len": T, "pattern": label, "path": path, "body_s": round(body, 2),
                                 "global_share_of_body": round(sum(layer_s.get(i, 0.0) for i in GLOBAL_LAYERS) / body, 3),
                                 "load_before": round(load, 2)})
            core.SDPA_QUERY_CHUNK = chunk
            if len(hidden) < 2:
                r = rows[-1]
                r["max_abs_diff"] = float("nan")
                print(f"{T:>6} {label:<10} {r['path']} {r['body_s']:7.1f} s  global layers "
                      f"{r['global_share_of_body']:.0%} of the body", flush=True)
                continue
            diff = float((hidden["whole"] - hidden["key_sliced"]).abs().max())
            w, s = rows[-2], rows[-1]
            w["max_abs_diff"] = s["max_abs_diff"] = diff
            print(f"{T:>6} {label:<10} whole {w['body_s']:7.1f} s  key-sliced {s['body_s']:7.1f} s  "
                  f"{w['body_s'] / s['body_s']:.2f}x  global layers {s['global_share_of_body']:.0%} of the "
                  f"key-sliced body  max |diff| {diff:.1e}", flush=True)
    df = pd.DataFrame(rows)
    for T, g in df[df.path == "key_sliced"].groupby("seq_len"):
        d = g.set_index("pattern").body_s
        if "dense" in d:
            print(f"{T:>6} key-sliced: " + ", ".join(f"dense / {p} {d['dense'] / d[p]:.2f}x" for p in d.index
                                                        if p != "dense") + " (body)")
    meta = router_columns(routers)
    df["router_name"], df["commit"] = meta["router_name"], meta["commit"]
    df["machine"] = f"{machine_line(machine())}, torch {torch.__version__}"
    a.out.parent.mkdir(parents=True, exist_ok=True)
    if a.out.is_file():  # earlier lengths stay; this run's lengths replace theirs
        old = pd.read_csv(a.out)
        df = pd.concat([old[~old.seq_len.isin(df.seq_len)], df], ignore_index=True)
    write_text(a.out, df.to_csv(index=False))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

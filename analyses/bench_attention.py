"""Benchmark: dense causal SDPA vs hard Focus as two attention calls + LSE merge (docs/method.md §4).

Kernel part: wall time of ``F.scaled_dot_product_attention(is_causal=True, enable_gqa=True)``
and of ``focus_lab.decomposition.hard_focus_attention`` at n = 1K .. 64K tokens, with the
embedded model's attention shapes (SmolLM2-135M: 9 query heads, 3 KV heads, head_dim 64),
batch 1, fp32, window 128, K in {4, 8}, k in {1, 2}. Groups are balanced (a random
permutation cut into K equal groups; extra top-k slots random) or, with ``--groups FILE``,
produced by a trained router (see ``--make-groups``). Every configuration (and dense) first
gets one untimed call at full size (the decomposition's CPU scratch buffers then exist, as
they do from the second layer of a forward on; ``--cold-start`` warms up on 256 tokens only).
Dense and Focus calls are interleaved in every repeat (dense once, then each Focus config)
and the medians compared, so load from other processes hits both sides alike. The decomposition's phases are timed separately:
``plan`` (sort + segment layout), ``gather``, ``scatter``, ``merge`` (= the overhead) and the
attention calls ``attn_A`` (same-group) and ``attn_B`` (local other-group).

End-to-end part: held-out perplexity and tokens/s of the embedded model at 4K and 8K tokens of
context, dense (the model's own SDPA attention) vs hard Focus (the decomposition) with the
router (``--router``; an untrained one when no router file exists) and with random groups
(``assignment="random"``: balanced by construction, the speed a balanced router would get; its
perplexity is a control, not a result).

Outputs under ``--out`` (default figures/bench_attention/): kernel.csv, kernel.parquet,
kernel.md, e2e.csv, e2e.md, bench_attention.html (+ .png via kaleido), env.json.

Usage:
    python analyses/bench_attention.py                      # everything, n up to 64K
    python analyses/bench_attention.py --max-n 8192 --no-e2e  # quick
    python analyses/bench_attention.py --make-groups checkpoints/x/routers.safetensors \\
        --groups figures/bench_attention/groups.pt          # record trained-router groups
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

# PyTorch's transparent-huge-page allocation for large tensors (read when torch starts): fresh
# 75 MB buffers cost ~75 ms of page faults on this VM without it, ~15-20 ms with it. It is a
# process-wide setting, so dense and Focus calls both get it; --no-thp turns it off.
if "--no-thp" not in sys.argv:
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import pandas as pd  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from focus_lab.decomposition import DecompositionOptions, hard_focus_attention, reference_hard_attention  # noqa: E402

SERIAL_MODE = "auto"  # --serial-bookkeeping, chosen per run
SERIAL_LOAD_FACTOR = 1.5


def serial_bookkeeping() -> bool:
    """This run's choice (recorded per row): on / off, or auto: serial only when the 1-minute
    load average exceeds SERIAL_LOAD_FACTOR x the CPU count (an oversubscribed machine, where
    multi-threaded small ops stall; DecompositionOptions has the measurements)."""
    if SERIAL_MODE != "auto":
        return SERIAL_MODE == "on"
    try:
        return os.getloadavg()[0] > SERIAL_LOAD_FACTOR * (os.cpu_count() or 1)
    except (OSError, AttributeError):
        return False


def options() -> DecompositionOptions:
    return DecompositionOptions(serial_bookkeeping=serial_bookkeeping())

PHASES = ("plan", "gather", "scatter", "merge", "attn_A", "attn_B")
OVERHEAD = ("plan", "gather", "scatter", "merge")


# --------------------------------------------------------------------------------------------
# groups

def balanced_groups(n: int, K: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(query_groups (1, n, k), key_group (1, n)): a random permutation cut into K equal groups
    (sizes differ by at most 1); slots 2..k are random other groups (distinct per token)."""
    gen = torch.Generator().manual_seed(seed)
    kg = torch.randperm(n, generator=gen) % K  # (n,)
    scores = torch.rand(n, K, generator=gen)
    scores[torch.arange(n), kg] = 2.0  # the key group is the top-1
    qg = scores.topk(k, dim=-1).indices  # (n, k)
    return qg[None], kg[None]


def trained_groups(path: Path, n: int, k: int, layer: int | None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Groups of a trained router recorded by ``--make-groups``: the hard top-k of one layer's
    scores (``core.hard_assign``), tiled to n tokens when the recording is shorter.
    Returns (query_groups (1, n, k), key_group (1, n), K)."""
    from focus_lab.core import hard_assign

    rec = torch.load(path, weights_only=False)
    layers = sorted(rec["scores"])
    li = layer if layer is not None else layers[len(layers) // 2]
    s = rec["scores"][li].float()  # (T, K)
    reps = -(-n // s.shape[0])
    s = s.repeat(reps, 1)[:n]
    qg, kg = hard_assign(s[None], rec["tau"], k, rec["group_bias"][li])
    return qg, kg, s.shape[1]


@torch.no_grad()
def make_groups(router_path: str, out: Path, tokens: int, corpus: str) -> None:
    """Run the embedded model with a trained router (a router file, or "init:K" for a fresh,
    untrained one) on held-out text (hard mode, top-1) and save every layer's router scores:
    {"scores": {layer: (T, K)}, "group_bias": {layer: (K,)}, "tau": float, "router": path}."""
    from focus_lab.data import load_corpus, make_windows
    from focus_lab.models import load_model
    from focus_lab.retrofit import load_routers, routers

    import focus_lab

    model, tok = load_model()
    if router_path.startswith("init:"):  # an untrained router: initial weights, K groups
        focus_lab.attach(model, focus_lab.FocusConfig(num_groups=int(router_path[5:]), top_k=1, mode="hard"))
    else:
        load_routers(model, router_path, {"mode": "hard", "top_k": 1})
    corpus_ = load_corpus(corpus)
    win = make_windows(corpus_.heldout, tok, tokens, max_windows=1)[0]
    scores: dict[int, torch.Tensor] = {}
    hooks = [r.register_forward_hook(lambda m, a, o, i=i: scores.__setitem__(i, o[0].float().cpu()))
             for i, r in routers(model).items()]
    model.model(input_ids=win.input_ids[None], use_cache=False)
    for h in hooks:
        h.remove()
    rs = routers(model)
    rec = {"scores": scores, "group_bias": {i: r.group_bias.float().cpu() for i, r in rs.items()},
           "tau": next(iter(rs.values())).config.tau, "router": str(router_path)}
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(rec, out)
    print(f"saved router scores of {len(scores)} layers, {tokens} tokens, to {out}")


# --------------------------------------------------------------------------------------------
# kernel benchmark

def _dense(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def _timed(fn, *a, **kw) -> float:
    t = time.perf_counter()
    fn(*a, **kw)
    return time.perf_counter() - t


def kernel_bench(args) -> pd.DataFrame:
    H, Hkv, D, w = args.heads, args.kv_heads, args.head_dim, args.window
    sizes = [n for n in args.sizes if n <= args.max_n]
    configs = [(K, k) for K in args.Ks for k in args.ks if k <= K]
    rows = []
    dense_hist: dict[int, float] = {}
    for n in sizes:
        gen = torch.Generator().manual_seed(n)
        # transformers' memory layout: (B, T, H, D) viewed as (B, H, T, D)
        q = torch.randn(1, n, H, D, generator=gen).transpose(1, 2)
        k_ = torch.randn(1, n, Hkv, D, generator=gen).transpose(1, 2)
        v = torch.randn(1, n, Hkv, D, generator=gen).transpose(1, 2)
        groups = {}
        for K, k in configs:
            groups[(K, k, "balanced")] = balanced_groups(n, K, k, seed=n * 100 + K * 10 + k)
        if args.groups:
            label = "router-init" if str(torch.load(args.groups, weights_only=False)["router"]).startswith("init:") \
                else "trained"
            for k in args.ks:
                qg, kg, Kt = trained_groups(Path(args.groups), n, k, args.groups_layer)
                groups[(Kt, k, label)] = (qg, kg)
        if n >= args.large_from:  # the largest sizes: fewer configs
            groups = {key: g for key, g in groups.items()
                      if (key[0], key[1]) in args.large_configs and key[2] == "balanced"}
        # skip dense when its extrapolated time exceeds the cap (then no ratio at this n)
        run_dense = n <= args.dense_max_n
        if dense_hist and run_dense:
            m0 = max(dense_hist)
            est = dense_hist[m0] * (n / m0) ** 2
            run_dense = est <= args.dense_max_seconds
        # warm-up at full size, not timed: thread pool, first-call costs, and the
        # decomposition's CPU scratch buffers (reused between calls, as between the 30 layers of
        # a forward; their first touch costs 0.07-0.2 s of page faults per 75 MB buffer). Dense
        # gets its warm-up call too. --cold-start keeps the old small warm-up.
        if args.cold_start:
            small = slice(0, min(n, 256))
            hard_focus_attention(q[:, :, small], k_[:, :, small], v[:, :, small],
                                 groups[next(iter(groups))][0][:, small], groups[next(iter(groups))][1][:, small], w,
                                 options=options())
        else:
            if run_dense:
                _dense(q, k_, v)
            for qg, kg in groups.values():
                hard_focus_attention(q, k_, v, qg, kg, w, options=options())
        t_dense: list[float] = []
        t_focus: dict = {key: [] for key in groups}
        ph: dict = {key: {p: [] for p in PHASES} for key in groups}
        load0 = os.getloadavg()[0]
        repeats = args.large_repeats if n >= args.large_from else args.repeats
        for r in range(repeats):
            if run_dense:
                t_dense.append(_timed(_dense, q, k_, v))
            for key, (qg, kg) in groups.items():
                tim: dict = {}
                t_focus[key].append(_timed(hard_focus_attention, q, k_, v, qg, kg, w, timings=tim,
                                                  options=options()))
                for p in PHASES:
                    ph[key][p].append(tim.get(p, 0.0))
            print(f"  n={n} repeat {r + 1}/{repeats}: dense "
                  f"{t_dense[-1] if t_dense else float('nan'):.3f}s, focus "
                  + ", ".join(f"K{K}k{k}{'' if g == 'balanced' else '-' + g}={t_focus[(K, k, g)][-1]:.3f}s"
                              for K, k, g in groups), flush=True)
        load1 = os.getloadavg()[0]
        md = statistics.median(t_dense) if t_dense else float("nan")
        if t_dense:
            dense_hist[n] = md
        for (K, k, gkind), ts in t_focus.items():
            mf = statistics.median(ts)
            row = {"n": n, "K": K, "k": k, "groups": gkind, "dense_s": md, "focus_s": mf,
                   "speedup": md / mf if t_dense else float("nan"),
                   # median over repeats of (dense / focus) measured back to back
                   "speedup_paired": statistics.median(d / f for d, f in zip(t_dense, ts)) if t_dense
                   else float("nan"),
                   "ideal_speedup": 1 / (k / K + (2 * w) / n) if n > w else 1.0}
            for p in PHASES:
                row[f"{p}_s"] = statistics.median(ph[(K, k, gkind)][p])
            row["overhead_s"] = sum(row[f"{p}_s"] for p in OVERHEAD)
            row["attn_s"] = row["attn_A_s"] + row["attn_B_s"]
            row["overhead_frac"] = row["overhead_s"] / mf
            row["repeats"] = len(ts)
            row["warmup"] = "small" if args.cold_start else "full"
            row["serial_bookkeeping"] = serial_bookkeeping()  # as decided at the end of this n
            row["dense_min_s"] = min(t_dense) if t_dense else float("nan")
            row["focus_min_s"] = min(ts)
            row["loadavg_start"], row["loadavg_end"] = load0, load1
            if n <= args.check_max_n:
                qg, kg = groups[(K, k, gkind)]
                ref = reference_hard_attention(q, k_, v, qg, kg, w)
                row["max_abs_err"] = (hard_focus_attention(q, k_, v, qg, kg, w, options=options()) - ref).abs().max().item()
            else:
                row["max_abs_err"] = float("nan")
            rows.append(row)
            print(f"n={n:>6} K={K} k={k} {gkind:>8}: dense {md:8.3f}s  focus {mf:7.3f}s  "
                  f"x{row['speedup']:5.2f} (paired x{row['speedup_paired']:5.2f})  (overhead {row['overhead_s']:.3f}s, A {row['attn_A_s']:.3f}s, "
                  f"B {row['attn_B_s']:.3f}s)", flush=True)
        del q, k_, v, groups
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# end to end

@torch.no_grad()
def _ppl_and_speed(model, windows) -> tuple[float, float, float]:
    """(perplexity, tokens/s, seconds) over windows; the loss goes through lm_head in chunks
    (the full (T, vocab) logits of 8K tokens would take 1.6 GB)."""
    nll, ntok = 0.0, 0
    t0 = time.perf_counter()
    for w in windows:
        ids = w.input_ids[None]
        h = model.model(input_ids=ids, use_cache=False).last_hidden_state  # (1, T, d)
        for a in range(0, ids.shape[1] - 1, 1024):
            b = min(a + 1024, ids.shape[1] - 1)
            logits = model.lm_head(h[:, a:b]).float()
            nll += F.cross_entropy(logits[0], ids[0, a + 1:b + 1], reduction="sum").item()
            ntok += b - a
    dt = time.perf_counter() - t0
    return math.exp(nll / ntok), sum(w.input_ids.numel() for w in windows) / dt, dt


def end_to_end(args) -> pd.DataFrame | None:
    try:
        from focus_lab.data import load_corpus, make_windows
        from focus_lab.models import load_model
    except ImportError as e:  # TODO(issue 4): needs the model and corpus loaders
        print(f"end-to-end part skipped: {e}")
        return None
    import focus_lab
    from focus_lab.retrofit import load_routers, set_config

    model, tok = load_model()
    router = args.router
    if router == "auto":
        cand = Path("checkpoints/smollm2-austen/routers.safetensors")
        router = str(cand) if cand.is_file() else None
    if router:
        cfg = load_routers(model, router, {"mode": "hard", "top_k": args.e2e_top_k})
        router_label = router
    else:
        cfg = focus_lab.attach(model, focus_lab.FocusConfig(num_groups=args.e2e_K, top_k=args.e2e_top_k,
                                                            window=args.window, mode="hard"))
        cfg = focus_lab.focus_config(model)
        router_label = "untrained (initial router weights)"
    print(f"end-to-end: router {router_label}, K={cfg.num_groups}, k={cfg.top_k}, w={cfg.window}",
          flush=True)
    corpus = load_corpus(args.corpus)
    rows = []

    def use(label: str) -> None:
        if label == "dense":  # the model's own attention (SDPA, is_causal)
            model.set_attn_implementation(model._focus_state.attn_implementation)
        else:  # hard Focus through the decomposition; random groups: the balanced control
            model.set_attn_implementation("focus")
            set_config(model, mode="hard", backend="auto",
                       assignment="random" if label == "hard-random-groups" else cfg.assignment)

    for T in args.e2e_sizes:
        windows = make_windows(corpus.heldout, tok, T, max_windows=args.e2e_windows)
        labels = [x for x in ["dense", "hard"] + (["hard-random-groups"] if args.e2e_random else [])
                  if x in args.e2e_labels]
        secs: dict[str, list[float]] = {x: [] for x in labels}
        ppl: dict[str, float] = {}
        # ABBA order over repeats, so slow drifts of the machine's load hit every label alike
        for r in range(args.e2e_repeats):
            for label in (labels if r % 2 == 0 else labels[::-1]):
                use(label)
                p, tps, dt = _ppl_and_speed(model, windows)
                ppl[label] = p
                secs[label].append(dt)
                print(f"  T={T} {label:>18} (repeat {r + 1}): ppl {p:8.3f}  {tps:7.1f} tok/s  ({dt:.1f}s)",
                      flush=True)
        ntok = sum(w.input_ids.numel() for w in windows)
        for label in labels:
            dt = statistics.median(secs[label])
            rows.append({"tokens": T, "windows": len(windows), "attention": label, "perplexity": ppl[label],
                         "tokens_per_s": ntok / dt, "seconds": dt, "repeats": len(secs[label]),
                         "router": router_label, "K": cfg.num_groups, "k": cfg.top_k, "window": cfg.window,
                         "corpus": f"{args.corpus} (held out)", "loadavg": os.getloadavg()[0]})
        model.set_attn_implementation("focus")
        set_config(model, assignment=cfg.assignment)
    df = pd.DataFrame(rows)
    dense_tps = df[df.attention == "dense"].set_index("tokens")["tokens_per_s"]
    df["speedup_vs_dense"] = df.apply(
        lambda r: r.tokens_per_s / dense_tps[r.tokens] if r.tokens in dense_tps else float("nan"), axis=1)
    return df


# --------------------------------------------------------------------------------------------
# output

def to_markdown(df: pd.DataFrame, cols: list[str], fmt: dict[str, str]) -> str:
    head = "| " + " | ".join(cols) + " |\n|" + "|".join("---:" for _ in cols) + "|\n"
    lines = []
    for _, r in df.iterrows():
        cells = []
        for c in cols:
            v = r[c]
            cells.append(fmt.get(c, "{}").format(v) if not (isinstance(v, float) and math.isnan(v)) else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


KERNEL_COLS = ["n", "K", "k", "groups", "dense_s", "focus_s", "speedup", "speedup_paired", "ideal_speedup",
               "attn_A_s", "attn_B_s", "overhead_s", "plan_s", "gather_s", "scatter_s", "merge_s",
               "max_abs_err", "loadavg_start"]
KERNEL_FMT = {"dense_s": "{:.3f}", "focus_s": "{:.3f}", "speedup": "{:.2f}", "speedup_paired": "{:.2f}",
              "ideal_speedup": "{:.2f}",
              "attn_A_s": "{:.3f}", "attn_B_s": "{:.3f}", "overhead_s": "{:.3f}", "plan_s": "{:.4f}",
              "gather_s": "{:.4f}", "scatter_s": "{:.4f}", "merge_s": "{:.4f}", "max_abs_err": "{:.1e}",
              "loadavg_start": "{:.1f}"}


def plot(df: pd.DataFrame, out: Path, title: str) -> None:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("wall time per call (s)", "speedup over dense SDPA"))
    d = df.drop_duplicates("n")
    fig.add_trace(go.Scatter(x=d.n, y=d.dense_s, name="dense causal SDPA", mode="lines+markers",
                             line=dict(color="black", width=3)), row=1, col=1)
    palette = {(4, 1): "#1f77b4", (4, 2): "#17becf", (8, 1): "#d62728", (8, 2): "#ff7f0e"}
    for (K, k, g), part in df.groupby(["K", "k", "groups"]):
        name = f"Focus K={K} k={k}" + ("" if g == "balanced" else f" ({g} groups)")
        line = dict(dash="solid" if g == "balanced" else "dot", color=palette.get((K, k)))
        fig.add_trace(go.Scatter(x=part.n, y=part.focus_s, name=name, mode="lines+markers",
                                 line=line, legendgroup=name), row=1, col=1)
        fig.add_trace(go.Scatter(x=part.n, y=part.speedup, name=name, mode="lines+markers",
                                 line=line, legendgroup=name, showlegend=False), row=1, col=2)
    fig.add_hline(y=1, line=dict(color="gray", dash="dash"), row=1, col=2)
    fig.add_hline(y=6, line=dict(color="red", dash="dot"), row=1, col=2,
                  annotation_text="goal K=8 k=1 @32K: 6x", annotation_position="top left")
    fig.update_xaxes(type="log", title="tokens n")
    fig.update_yaxes(type="log", row=1, col=1)
    fig.update_layout(title=title, width=1200, height=500, template="plotly_white")
    fig.write_html(out / "bench_attention.html", include_plotlyjs=True)
    try:
        fig.write_image(out / "bench_attention.png", scale=1.5)
    except Exception as e:  # kaleido / Chromium missing
        print(f"PNG not written ({e}); the HTML is")


def _title(args, env) -> str:
    la = env.get("loadavg_start", [float("nan")])[0]
    return (f"Hard Focus (two calls + LSE merge) vs dense causal SDPA, CPU ({env['threads']} threads, "
            f"load avg {la:.1f} at start), H={args.heads}/{args.kv_heads}, D={args.head_dim}, w={args.window}, fp32")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("figures/bench_attention"))
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                    default=[1024, 2048, 4096, 8192, 16384, 32768, 65536])
    ap.add_argument("--max-n", type=int, default=65536, help="largest n to run")
    ap.add_argument("--dense-max-n", type=int, default=1 << 30, help="no dense call above this n")
    ap.add_argument("--dense-max-seconds", type=float, default=300.0,
                    help="skip dense at n when its time extrapolated (n^2) from the last n exceeds this")
    ap.add_argument("--Ks", type=lambda s: [int(x) for x in s.split(",")], default=[4, 8])
    ap.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--serial-bookkeeping", choices=["auto", "on", "off"], default="auto",
                    help="DecompositionOptions.serial_bookkeeping: auto (serial only on an oversubscribed "
                         "machine), on, off")
    ap.add_argument("--cold-start", action="store_true",
                    help="warm up on 256 tokens only (the first timed Focus call then pays for "
                         "growing its scratch buffers); default: one untimed full-size call each")
    ap.add_argument("--large-from", type=int, default=65536,
                    help="from this n on, only --large-configs and --large-repeats")
    ap.add_argument("--large-repeats", type=int, default=1)
    ap.add_argument("--large-configs", default=[(8, 1), (4, 1)],
                    type=lambda s: [tuple(int(x) for x in c.split(":")) for c in s.split(",")],
                    help="K:k pairs run (balanced groups only) at the largest sizes (default 8:1,4:1)")
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--heads", type=int, default=9, help="query heads (SmolLM2-135M: 9)")
    ap.add_argument("--kv-heads", type=int, default=3, help="KV heads (SmolLM2-135M: 3)")
    ap.add_argument("--head-dim", type=int, default=64, help="head_dim (SmolLM2-135M: 64)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--check-max-n", type=int, default=2048,
                    help="compare with the dense masked reference up to this n")
    ap.add_argument("--groups", type=str, default=None, help="router scores recorded by --make-groups")
    ap.add_argument("--groups-layer", type=int, default=None, help="layer of --groups (default: middle)")
    ap.add_argument("--make-groups", type=str, default=None, metavar="ROUTER",
                    help="record a trained router's scores into --groups, then exit")
    ap.add_argument("--groups-tokens", type=int, default=4096)
    ap.add_argument("--no-thp", action="store_true",
                    help="do not set THP_MEM_ALLOC_ENABLE=1 (huge-page allocation of large tensors)")
    ap.add_argument("--no-kernel", action="store_true")
    ap.add_argument("--no-e2e", action="store_true")
    ap.add_argument("--e2e-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[4096, 8192])
    ap.add_argument("--e2e-windows", type=int, default=2)
    ap.add_argument("--e2e-repeats", type=int, default=2,
                    help="forwards per label and size, in ABBA order; the median time is reported")
    ap.add_argument("--e2e-K", type=int, default=8, help="groups of the untrained router")
    ap.add_argument("--e2e-top-k", type=int, default=1)
    ap.add_argument("--router", type=str, default="auto",
                    help="router file for end-to-end ('auto': checkpoints/smollm2-austen if present)")
    ap.add_argument("--corpus", type=str, default="austen")
    ap.add_argument("--e2e-labels", type=lambda s: s.split(","), default=["dense", "hard", "hard-random-groups"],
                    help="end-to-end rows to run (dense, hard, hard-random-groups)")
    ap.add_argument("--no-e2e-random", dest="e2e_random", action="store_false",
                    help="skip the end-to-end row with random balanced groups (assignment='random')")
    ap.add_argument("--replot", action="store_true", help="only redraw the plot from --out/kernel.csv")
    args = ap.parse_args(argv)
    if args.replot:
        env = json.loads((args.out / "env.json").read_text())
        plot(pd.read_csv(args.out / "kernel.csv"), args.out, _title(args, env))
        return 0

    global SERIAL_MODE
    SERIAL_MODE = args.serial_bookkeeping
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.make_groups:
        make_groups(args.make_groups, Path(args.groups or args.out / "groups.pt"), args.groups_tokens, args.corpus)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    env = {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpu": platform.processor()
           or platform.machine(), "nproc": os.cpu_count(), "loadavg_start": os.getloadavg(),
           "argv": sys.argv[1:], "started": time.strftime("%Y-%m-%d %H:%M:%S"),
           "THP_MEM_ALLOC_ENABLE": os.environ.get("THP_MEM_ALLOC_ENABLE"),
           "serial_bookkeeping": args.serial_bookkeeping}
    try:
        env["cpu_model"] = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if "model name" in l)
    except Exception:
        pass
    if not args.no_kernel:
        df = kernel_bench(args)
        df.to_csv(args.out / "kernel.csv", index=False)
        try:
            df.to_parquet(args.out / "kernel.parquet", index=False)
        except Exception as e:
            print(f"parquet not written: {e}")
        md = to_markdown(df, KERNEL_COLS, KERNEL_FMT)
        (args.out / "kernel.md").write_text(md)
        print("\n" + md)
        plot(df, args.out, _title(args, env))
    if not args.no_e2e:
        e2e = end_to_end(args)
        if e2e is not None:
            e2e.to_csv(args.out / "e2e.csv", index=False)
            cols = ["tokens", "windows", "attention", "perplexity", "tokens_per_s", "speedup_vs_dense",
                    "seconds", "repeats", "K", "k", "router", "loadavg"]
            md = to_markdown(e2e, cols, {"perplexity": "{:.3f}", "tokens_per_s": "{:.1f}",
                                         "speedup_vs_dense": "{:.2f}", "seconds": "{:.1f}",
                                         "loadavg": "{:.1f}"})
            (args.out / "e2e.md").write_text(md)
            print("\n" + md)
    env["loadavg_end"] = os.getloadavg()
    env["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    (args.out / "env.json").write_text(json.dumps(env, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

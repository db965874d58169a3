"""Benchmark: hard Focus against dense attention, end to end and per attention call (docs/method.md §4).

One command (``python -m analyses.bench_attention``) measures, on this machine, in one run:

End to end, the embedded SmolLM2-135M with the shipped routers (their file's config: K = 4,
w = 128, 64 sinks, layers 1-9 on random groups; ``--routers`` for another file), one held-out
window of *Persuasion* per length (4096 and 8192 tokens, ``--e2e-sizes``):
  * prefill: tokens/s of the bare forward (decoder + chunked lm_head loss) and of
    ``focus_lab.eval.evaluate.evaluate`` (what ``focus-lab eval`` runs and prints) per pattern (dense,
    window + sinks, hard top-1, hard top-2, random top-2; ``--patterns``). Every repeat runs every
    pattern, round-robin (repeat r starts at pattern r), and the medians are compared, so load from
    other processes hits dense and sparse alike: read the ratios, not the absolute numbers. The
    window pattern's ratio is the bound of what attention sparsity can buy (every distant pair
    skipped); ``pairs_bound`` estimates what a pattern would reach if its kept pairs cost what
    dense's pairs cost. The bare forwards also record where the time goes (``FocusForward.timings``):
    routing, group planning (sort + segments), gather/scatter, the attention calls, the LSE
    merge, mask and hook-point bookkeeping, and everything outside the attention functions.
  * decode: ``model.generate`` (greedy, KV cache) after a prefix of ``L - 16`` tokens for
    contexts L = 2K, 4K, 8K (``--decode-contexts``): the median time per generated token
    (gaps between tokens, prefill excluded) for dense, hard top-1 and hard top-2, through
    ``focus_lab.hf.kv_cache.GrowingCache`` (``--kv-cache dynamic``: transformers' DynamicCache,
    which copies the whole cache every step; measured, that slows hard decoding far more than
    dense, docs/results.md Speed).

Kernel part: wall time of ``F.scaled_dot_product_attention(is_causal=True, enable_gqa=True)``
and of ``focus_lab.method.decomposition.hard_focus_attention`` at n = 1K .. 32K tokens, with the
embedded model's attention shapes (9 query heads, 3 KV heads, head_dim 64), batch 1, fp32,
window 128, K in {4, 8}, k in {1, 2}, balanced groups (a random permutation cut into K equal
groups; extra top-k slots random) or, with ``--groups FILE``, a trained router's (see
``--make-groups``). Dense and Focus calls are interleaved in every repeat and the medians
compared; the decomposition's phases are timed separately. ``--device cuda`` (with ``--no-e2e``)
runs this part on a GPU, ``--dtype bf16`` / ``fp16`` in half precision (dense then repeats the
K/V heads; CUDA work is synchronized around every timed call; figures/bench_attention/gpu_h100.md).
``--backends auto,flash,flex`` times every config with each backend of ``hard_focus_attention``
(column ``backend``: the one "auto" resolved to; figures/bench_attention/gpu_h200.md).

Outputs under ``--out`` (default figures/bench_attention/): results.md (every table, the
command, the machine and its load), e2e.csv (prefill and decode rows), kernel.csv, env.json
(machine: cores, CPU model, torch threads, load averages), bench_attention.html (not committed).
Bad options (an unknown pattern, a length above the model's positions) get one line and exit 2.

Usage:
    python -m analyses.bench_attention                         # everything (about 1 h on 2 cores)
    python -m analyses.bench_attention --no-kernel --no-decode # prefill only
    python -m analyses.bench_attention --no-e2e --sizes 4096,32768
    python -m analyses.bench_attention --bounds shipped        # a saved run's bounds (pairs_bound)
"""

from __future__ import annotations

import argparse
import json
import math
import os
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

from focus_lab.hf.models import DTYPES  # noqa: E402
from focus_lab.method.decomposition import (DecompositionOptions, hard_focus_attention,  # noqa: E402
                                            reference_hard_attention, repeat_kv_heads, resolve_backend)

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
    from focus_lab.method.core import hard_assign

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
    from focus_lab.hf.models import load_model
    from focus_lab.hf.retrofit import load_routers, routers

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
    """Dense causal attention, q: (1, H, n, D), k, v: (1, Hkv, n, D). On CUDA the K/V heads are
    repeated first (a copy, counted): torch's memory-efficient kernel (fp32) takes no GQA, and
    SDPA would then fall back to the O(n^2)-memory math path."""
    if q.device.type == "cuda":
        H = q.shape[1]
        return F.scaled_dot_product_attention(q, repeat_kv_heads(k, H), repeat_kv_heads(v, H), is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _timed(fn, *a, **kw) -> float:
    """Wall seconds of ``fn(*a, **kw)``, CUDA work included (synchronized before and after)."""
    dev = next((x.device for x in a if isinstance(x, torch.Tensor)), torch.device("cpu"))
    _sync(dev)
    t = time.perf_counter()
    fn(*a, **kw)
    _sync(dev)
    return time.perf_counter() - t


def kernel_bench(args) -> pd.DataFrame:
    H, Hkv, D, w = args.heads, args.kv_heads, args.head_dim, args.window
    dev, dtype = torch.device(args.device), DTYPES[args.dtype]
    sizes = [n for n in args.sizes if n <= args.max_n]
    configs = [(K, k) for K in args.Ks for k in args.ks if k <= K]
    rows = []
    dense_hist: dict[int, float] = {}
    for n in sizes:
        gen = torch.Generator().manual_seed(n)
        # transformers' memory layout: (B, T, H, D) viewed as (B, H, T, D)
        q = torch.randn(1, n, H, D, generator=gen).to(dev, dtype).transpose(1, 2)
        k_ = torch.randn(1, n, Hkv, D, generator=gen).to(dev, dtype).transpose(1, 2)
        v = torch.randn(1, n, Hkv, D, generator=gen).to(dev, dtype).transpose(1, 2)
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
        # every config once per backend: key (K, k, groups kind, backend)
        groups = {key + (be,): g for key, g in groups.items() for be in args.backends}
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
            for key, (qg, kg) in groups.items():
                hard_focus_attention(q, k_, v, qg, kg, w, options=options(), backend=key[3])
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
                                           options=options(), backend=key[3]))
                for p in PHASES:
                    ph[key][p].append(tim.get(p, 0.0))
            print(f"  n={n} repeat {r + 1}/{repeats}: dense "
                  f"{t_dense[-1] if t_dense else float('nan'):.3f}s, focus "
                  + ", ".join(f"K{K}k{k}{'' if g == 'balanced' else '-' + g}"
                              f"{'' if be == 'auto' else '-' + be}={t_focus[(K, k, g, be)][-1]:.3f}s"
                              for K, k, g, be in groups), flush=True)
        load1 = os.getloadavg()[0]
        md = statistics.median(t_dense) if t_dense else float("nan")
        if t_dense:
            dense_hist[n] = md
        for (K, k, gkind, be), ts in t_focus.items():
            mf = statistics.median(ts)
            row = {"n": n, "K": K, "k": k, "groups": gkind, "device": dev.type, "dtype": args.dtype,
                   "backend": resolve_backend(be, dev, dtype, top_k=k),
                   "dense_s": md, "focus_s": mf,
                   "speedup": md / mf if t_dense else float("nan"),
                   # median over repeats of (dense / focus) measured back to back
                   "speedup_paired": statistics.median(d / f for d, f in zip(t_dense, ts)) if t_dense
                   else float("nan"),
                   "ideal_speedup": 1 / (k / K + (2 * w) / n) if n > w else 1.0}
            for p in PHASES:
                row[f"{p}_s"] = statistics.median(ph[(K, k, gkind, be)][p])
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
                qg, kg = groups[(K, k, gkind, be)]
                # against the fp32 reference on the same inputs (bf16: the rounding of its output)
                ref = reference_hard_attention(q.float(), k_.float(), v.float(), qg.to(dev), kg.to(dev), w)
                row["max_abs_err"] = (hard_focus_attention(q, k_, v, qg, kg, w, options=options(),
                                                           backend=be).float()
                                      - ref).abs().max().item()
            else:
                row["max_abs_err"] = float("nan")
            rows.append(row)
            print(f"n={n:>6} K={K} k={k} {gkind:>8} {row['backend']:>5}: dense {md:8.3f}s  focus {mf:7.3f}s  "
                  f"x{row['speedup']:5.2f} (paired x{row['speedup_paired']:5.2f})  (overhead {row['overhead_s']:.3f}s, A {row['attn_A_s']:.3f}s, "
                  f"B {row['attn_B_s']:.3f}s)", flush=True)
        del q, k_, v, groups
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# end to end: prefill (bare forward and focus-lab eval) and decode, the embedded model

E2E_PATTERNS = "dense,window,hard_top1,hard_top2,random_top2"
DECODE_PATTERNS = "dense,hard_top1,hard_top2"
# phases of retrofit.FocusForward.timings, grouped as the tables report them
SHARES = {"route": ("route",), "plan": ("plan",), "gather_scatter": ("gather", "scatter"),
          "attention": ("attn_A", "attn_B", "attn_D", "attn_dense", "attn_reference"), "merge": ("merge",),
          "mask_hooks": ("mask", "hooks")}


class BadInput(ValueError):
    """Options the benchmark cannot run; main() prints the message as one line and exits 2."""


def _ints(s: str) -> list[int]:
    try:
        out = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r}: need a comma list of integers") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"{s!r}: need positive integers")
    return out


def check_e2e_args(args, num_groups: int, positions: int | None, window: int, sinks: int) -> tuple[list, list]:
    """The end-to-end patterns [(label, changes)] and decode patterns, checked against the model:
    raises BadInput (one line) for an unknown pattern, a prefill length above the model's
    positions or not above the window + sinks, or a decode context (prefix + ``--new-tokens``)
    above the positions."""
    from focus_lab.method.config import ConfigError
    from focus_lab.patterns.legacy import parse_legacy_patterns as parse_patterns
    try:
        pats = parse_patterns(args.patterns, num_groups)
        dpats = parse_patterns(args.decode_patterns, num_groups)
    except ConfigError as e:
        raise BadInput(str(e)) from None
    if "dense" not in [x for x, _ in pats] or "dense" not in [x for x, _ in dpats]:
        raise BadInput("--patterns and --decode-patterns must include dense (the ratios are against it)")
    lim = positions or 1 << 30
    for T in args.e2e_sizes:
        if T > lim:
            raise BadInput(f"--e2e-sizes {T}: above the model's {lim} positions")
        if T <= window + sinks:
            raise BadInput(f"--e2e-sizes {T}: need more than window + sinks = {window + sinks} tokens")
    for L in args.decode_contexts:
        if L > lim:
            raise BadInput(f"--decode-contexts {L}: prefix + {args.new_tokens} new tokens must fit the model's "
                           f"{lim} positions")
        if L - args.new_tokens < 2:
            raise BadInput(f"--decode-contexts {L}: need more than --new-tokens {args.new_tokens} + 1 tokens")
    return pats, dpats


@torch.no_grad()
def bare_forward(model, ids: torch.Tensor, state) -> float:
    """One forward of ``ids`` (1, T) with the FocusForward ``state``: the decoder, then the loss
    through lm_head in chunks of 1024 positions (the full (T, vocab) logits of 8K tokens take
    1.6 GB). Returns the summed next-token NLL (nats)."""
    h = model.model(input_ids=ids, use_cache=False, focus=state).last_hidden_state  # (1, T, d)
    nll = 0.0
    for a in range(0, ids.shape[1] - 1, 1024):
        b = min(a + 1024, ids.shape[1] - 1)
        nll += F.cross_entropy(model.lm_head(h[:, a:b]).float()[0], ids[0, a + 1:b + 1], reduction="sum").item()
    return nll


def prefill_bench(model, tok, args, pats, save=None) -> pd.DataFrame:
    """Per length and pattern: tokens/s of the bare forward and of ``focus_lab.eval.evaluate.evaluate``
    (what ``focus-lab eval`` runs) on one held-out window, patterns round-robin per repeat
    (repeat r starts at pattern r), medians; the bare forwards record the phase times of every
    routed layer's attention function (``FocusForward.timings``). ``evaluate`` runs at the
    lengths in ``args.eval_sizes`` only. ``save(rows so far)`` is called after each length."""
    from focus_lab.data import load_corpus, make_windows
    from focus_lab.eval.evaluate import evaluate
    from focus_lab.hf.retrofit import forward_state

    corpus = load_corpus(args.corpus)
    rows = []
    for T in args.e2e_sizes:
        win = make_windows(corpus.heldout, tok, T, max_windows=1)[0]
        ids = win.input_ids[None]
        for label, changes in pats:  # warm-up: thread pool, first-call costs, scratch buffers
            bare_forward(model, ids[:, :1024], forward_state(model, **changes))
        res = {label: {"bare": [], "eval": [], "phases": [], "ppl": float("nan"), "kept": float("nan")}
               for label, _ in pats}
        loads = []
        for r in range(args.e2e_repeats):
            for label, changes in pats[r % len(pats):] + pats[:r % len(pats)]:
                st = forward_state(model, **changes)
                st.timings = {}
                t = time.perf_counter()
                bare_forward(model, ids, st)
                dt = time.perf_counter() - t
                res[label]["bare"].append(dt)
                res[label]["phases"].append({**st.timings, "total": dt})
                ev_txt = ""
                if T in args.eval_sizes:
                    t = time.perf_counter()
                    ev = evaluate(model, [win], [(label, changes)], progress=False).iloc[0]
                    res[label]["eval"].append(time.perf_counter() - t)
                    res[label]["ppl"], res[label]["kept"] = float(ev.perplexity), float(ev.distant_pairs_kept)
                    ev_txt = f", eval {T / res[label]['eval'][-1]:6.1f} tok/s, ppl {res[label]['ppl']:.4f}"
                loads.append(os.getloadavg()[0])
                print(f"  T={T} repeat {r + 1} {label:>12}: bare {T / dt:6.1f} tok/s{ev_txt}  "
                      f"(load {loads[-1]:.1f})", flush=True)
        for label, _ in pats:
            d = res[label]
            bare = statistics.median(d["bare"])
            ev = statistics.median(d["eval"]) if d["eval"] else float("nan")
            row = {"phase": "prefill", "tokens": T, "pattern": label, "bare_tokens_per_s": T / bare,
                   "eval_tokens_per_s": T / ev, "eval_over_bare": bare / ev, "perplexity": d["ppl"],
                   "distant_pairs_kept": d["kept"], "bare_s": bare, "eval_s": ev, "repeats": len(d["bare"]),
                   "loadavg_min": min(loads), "loadavg_max": max(loads)}
            # time shares of the bare forward (medians over repeats of each phase's share)
            ph = d["phases"]
            fn = [p.get("attention_fn", 0.0) / p["total"] for p in ph]
            for name, keys in SHARES.items():
                row[f"share_{name}"] = statistics.median(sum(p.get(k, 0.0) for k in keys) / p["total"] for p in ph)
            row["share_other_attention_fn"] = statistics.median(
                (p.get("attention_fn", 0.0) - sum(p.get(k, 0.0) for ks in SHARES.values() for k in ks)) / p["total"]
                for p in ph)
            row["share_outside_attention"] = 1 - statistics.median(fn)
            rows.append(row)
        if save is not None:
            save(_prefill_ratios(pd.DataFrame(rows)))
    return _prefill_ratios(pd.DataFrame(rows))


def _prefill_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """Prefill rows with their ratios to dense (and to the window pattern) at the same length."""
    dense = df[df.pattern == "dense"].set_index("tokens")
    df["speedup_bare"] = df.tokens.map(dense.bare_tokens_per_s).rdiv(df.bare_tokens_per_s)
    df["speedup_eval"] = df.tokens.map(dense.eval_tokens_per_s).rdiv(df.eval_tokens_per_s)
    if (df.pattern == "window").any():  # the bound: what skipping every distant pair gives
        win_s = df[df.pattern == "window"].set_index("tokens").bare_s
        dense_s = dense.bare_s
        df["window_bound"] = df.tokens.map(dense_s / win_s)
        df["share_of_bound"] = (df.tokens.map(dense_s) - df.bare_s) / (df.tokens.map(dense_s) - df.tokens.map(win_s))
        df["pairs_bound"] = pairs_bound(df)
    else:  # no window pattern in the run: no bound to compare with
        df["window_bound"] = df["share_of_bound"] = df["pairs_bound"] = float("nan")
    return df


def pairs_bound(df: pd.DataFrame) -> pd.Series:
    """Per prefill row: the ratio to dense the pattern would reach if each distant pair it keeps
    cost what a pair costs inside dense attention, on top of what the window pattern's attention
    costs (window, sinks, routing and bookkeeping):

        t_bound = outside_dense + attn_window + (kept - kept_window) * attn_dense,
        pairs_bound = t_dense / t_bound

    with ``attn_X = bare_s(X) * (1 - share_outside_attention(X))`` and ``outside_dense`` the
    rest of dense's forward, all at the row's length in this run; ``kept`` is the row's
    ``distant_pairs_kept`` (measured by the eval pass: NaN at lengths outside ``--eval-sizes``)
    and ``kept_window`` the window pattern's (its sink pairs, already in ``attn_window``), so the
    window row's bound is its own ratio. An estimate: it assumes every pair costs the same.
    Bare seconds per forward in, a ratio out; NaN on the dense row (the bound is for sparse
    patterns: the window's own pairs would count twice there)."""
    by = df.set_index(["tokens", "pattern"])
    def one(row) -> float:
        if row.pattern == "dense":
            return float("nan")
        try:
            d, w = by.loc[(row.tokens, "dense")], by.loc[(row.tokens, "window")]
        except KeyError:
            return float("nan")
        attn_d = d.bare_s * (1 - d.share_outside_attention)
        kept = row.distant_pairs_kept - w.distant_pairs_kept
        t = d.bare_s - attn_d + w.bare_s * (1 - w.share_outside_attention) + kept * attn_d
        return d.bare_s / t
    return df.apply(one, axis=1)


class _StepClock:
    """A generate() logits processor that stamps the wall time of every generated token (the
    first stamp ends the prefill; the gaps between stamps are the decode steps)."""

    def __init__(self):
        self.stamps: list[float] = []

    def __call__(self, input_ids, scores):
        self.stamps.append(time.perf_counter())
        return scores


@torch.no_grad()
def decode_bench(model, tok, args, dpats) -> pd.DataFrame:
    """``model.generate`` (greedy, KV cache) after a held-out prefix of ``L - new_tokens``
    tokens, per context L and pattern (set as the model's default config, so generate's forwards
    use it and its FocusCache), patterns round-robin per repeat: per-step time (the median gap
    between consecutive tokens, prefill excluded) and the prefill time."""
    from transformers import LogitsProcessorList

    from focus_lab.data import load_corpus, make_windows
    from focus_lab.hf.kv_cache import GrowingCache, PlainDynamicCache
    from focus_lab.hf.retrofit import focus_config, set_config

    corpus = load_corpus(args.corpus)
    original = focus_config(model)
    rows = []
    try:
        for L in args.decode_contexts:
            prefix = make_windows(corpus.heldout, tok, L, max_windows=1)[0].input_ids[: L - args.new_tokens][None]
            res = {label: {"step": [], "prefill": []} for label, _ in dpats}
            loads = []
            for r in range(args.decode_repeats):
                for label, changes in dpats[r % len(dpats):] + dpats[:r % len(dpats)]:
                    set_config(model, **changes)
                    clock = _StepClock()
                    cache = (GrowingCache if args.kv_cache == "growing" else PlainDynamicCache)(config=model.config)
                    t0 = time.perf_counter()
                    model.generate(prefix, attention_mask=torch.ones_like(prefix), max_new_tokens=args.new_tokens,
                                   past_key_values=cache,
                                   min_new_tokens=args.new_tokens, do_sample=False, use_cache=True,
                                   logits_processor=LogitsProcessorList([clock]), pad_token_id=tok.eos_token_id)
                    gaps = [b - a for a, b in zip(clock.stamps, clock.stamps[1:])]
                    res[label]["step"].append(statistics.median(gaps))
                    res[label]["prefill"].append(clock.stamps[0] - t0)
                    loads.append(os.getloadavg()[0])
                    print(f"  decode L={L} repeat {r + 1} {label:>10}: {1000 * res[label]['step'][-1]:7.1f} ms/token, "
                          f"prefill {prefix.shape[1] / res[label]['prefill'][-1]:6.1f} tok/s (load {loads[-1]:.1f})",
                          flush=True)
            for label, _ in dpats:
                step = statistics.median(res[label]["step"])
                pre = statistics.median(res[label]["prefill"])
                rows.append({"phase": "decode", "tokens": L, "prefix": prefix.shape[1], "pattern": label,
                             "ms_per_token": 1000 * step, "decode_tokens_per_s": 1 / step,
                             "prefill_tokens_per_s": prefix.shape[1] / pre, "new_tokens": args.new_tokens,
                             "repeats": len(res[label]["step"]), "kv_cache": args.kv_cache, "loadavg_min": min(loads),
                             "loadavg_max": max(loads)})
    finally:
        set_config(model, **{k: v for k, v in original.to_dict().items()
                             if k not in ("num_groups", "router_dim", "layers")})
    df = pd.DataFrame(rows)
    dense = df[df.pattern == "dense"].set_index("tokens").ms_per_token
    df["speedup_decode"] = df.tokens.map(dense) / df.ms_per_token
    return df


def end_to_end(args, save=None) -> pd.DataFrame:
    """Prefill (bare and eval) and decode tables of the embedded model with the shipped routers
    (``--routers`` to use others), as ``focus-lab eval`` loads them (the file's config, its random
    layers included). ``save(table so far)`` is called after each prefill length and stage."""
    from focus_lab.hf.models import load_model
    from focus_lab.hf.retrofit import load_routers
    from focus_lab.hf.shipped import resolve_routers

    model, tok = load_model()
    routers = resolve_routers(args.routers)
    cfg = load_routers(model, routers)
    pats, dpats = check_e2e_args(args, cfg.num_groups, getattr(model.config, "max_position_embeddings", None),
                                 cfg.window, cfg.sink_tokens)
    print(f"end to end: routers {routers} (K={cfg.num_groups}, w={cfg.window}, sinks={cfg.sink_tokens}, "
          f"random layers {cfg.random_layers}), patterns {[x for x, _ in pats]}", flush=True)
    parts = []

    def partial(df):
        if save is not None:
            save(_e2e_columns(pd.concat(parts + [df], ignore_index=True), routers, cfg))
    if args.e2e_sizes and not args.no_prefill:
        parts.append(prefill_bench(model, tok, args, pats, partial))
        partial(pd.DataFrame())
    if args.decode_contexts and not args.no_decode:
        parts.append(decode_bench(model, tok, args, dpats))
    df = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    return _e2e_columns(df, routers, cfg)


def _e2e_columns(df: pd.DataFrame, routers, cfg) -> pd.DataFrame:
    """The router file, K, and the columns analyses/fig_pareto.py reads, on the end-to-end rows."""
    if not len(df):
        return df
    df = df.copy()
    df["routers"] = str(routers)
    df["K"] = cfg.num_groups
    # the columns analyses/fig_pareto.py reads: prefill rows as "dense" / "hard" (router groups) /
    # "hard-random-groups" / "window" with their bare-forward ratio; decode rows as "decode"
    kind = df.pattern.map(lambda p: "hard" if p.startswith("hard_") else "hard-random-groups"
                          if p.startswith("random_") else p)
    df["attention"] = kind.where(df.phase == "prefill", "decode")
    df["router"] = str(routers)
    df["speedup_vs_dense"] = df.speedup_bare if "speedup_bare" in df else float("nan")
    return df


PREFILL_COLS = ["tokens", "pattern", "bare_tokens_per_s", "speedup_bare", "eval_tokens_per_s", "speedup_eval",
                "eval_over_bare", "share_of_bound", "pairs_bound", "perplexity", "distant_pairs_kept"]
SHARE_COLS = ["tokens", "pattern", "share_route", "share_plan", "share_gather_scatter", "share_attention",
              "share_merge", "share_mask_hooks", "share_other_attention_fn", "share_outside_attention"]
DECODE_COLS = ["tokens", "prefix", "pattern", "ms_per_token", "decode_tokens_per_s", "speedup_decode",
               "prefill_tokens_per_s"]
E2E_FMT = {"bare_tokens_per_s": "{:.1f}", "eval_tokens_per_s": "{:.1f}", "speedup_bare": "{:.2f}",
           "speedup_eval": "{:.2f}", "eval_over_bare": "{:.2f}", "share_of_bound": "{:.2f}", "pairs_bound": "{:.2f}",
           "perplexity": "{:.4f}", "distant_pairs_kept": "{:.3f}", "ms_per_token": "{:.1f}",
           "decode_tokens_per_s": "{:.2f}", "speedup_decode": "{:.2f}", "prefill_tokens_per_s": "{:.1f}",
           "prefix": "{:.0f}",
           **{c: "{:.3f}" for c in SHARE_COLS if c.startswith("share")}}


def bounds_markdown(e2e: pd.DataFrame, table: str, corpus: str) -> str:
    """The prefill rows of a saved run (e2e.csv) with ``window_bound`` and ``pairs_bound``
    (``pairs_bound()``) as markdown. Pairs kept the run did not measure (lengths outside
    ``--eval-sizes``) are taken from window 0 of the committed length table ``table``
    (``analyses/length_table.py``; the benchmark forwards that same first held-out window of
    ``corpus``) when that table's cell was made with the run's router file; ``kept_from`` says
    where each value comes from. Raises SystemExit when the table has no such rows."""
    from analyses.length_table import committed_cells
    from focus_lab.io import file_sha256

    pre = e2e[e2e.phase == "prefill"].copy()
    cells = committed_cells()
    cells = cells[(cells.table == table) & (cells.corpus == corpus) & (cells.window == 0)]
    if cells.empty:
        raise SystemExit(f"--bounds {table}: no window-0 cells of {corpus} in that committed table")
    routers = pre.routers.dropna().iloc[0] if "routers" in pre and pre.routers.notna().any() else None
    sha = file_sha256(Path(routers)) if routers and Path(routers).is_file() else None
    if sha is None and routers:  # the run's file is gone (a worktree): if it was the shipped one, this checkout's
        from focus_lab.hf.shipped import resolve_routers
        shipped = resolve_routers(None)
        if Path(routers).parts[-3:] == shipped.parts[-3:]:
            sha = file_sha256(shipped)
    cells = cells[cells.routers_sha256 == sha].set_index(["seq_len", "label"]).distant_pairs_kept
    pre["kept_from"] = pre.distant_pairs_kept.notna().map({True: "this run", False: ""})
    for i, r in pre[pre.distant_pairs_kept.isna()].iterrows():
        if (r.tokens, r.pattern) in cells.index:
            pre.loc[i, "distant_pairs_kept"] = cells.loc[(r.tokens, r.pattern)]
            pre.loc[i, "kept_from"] = f"table {table}, window 0"
    pre["pairs_bound"] = pairs_bound(pre)
    fmt = {**E2E_FMT, "window_bound": "{:.2f}"}
    return ("`pairs_bound`: the ratio to dense if each distant pair kept cost what a pair costs in "
            "dense attention, on top of the window pattern's attention time (`pairs_bound()`).\n\n"
            + to_markdown(pre, ["tokens", "pattern", "speedup_bare", "window_bound", "pairs_bound",
                                "distant_pairs_kept", "kept_from"], fmt))


def e2e_markdown(df: pd.DataFrame) -> str:
    """The end-to-end tables (prefill speed, time shares, decode) as markdown."""
    out = []
    pre = df[df.phase == "prefill"] if len(df) else df
    if len(pre):
        bound = ", ".join(f"{int(t)}: x{b:.2f}" for t, b in pre.groupby("tokens").window_bound.first().items()) \
            if "window_bound" in pre else "-"
        out.append("### Prefill: tokens/s of the bare forward and of `focus-lab eval` (ratios vs dense)\n\n"
                   f"Window bound (dense time / window time, bare): {bound}. `share_of_bound`: the part of "
                   "the window pattern's saving a pattern gets, (t_dense - t) / (t_dense - t_window). `pairs_bound`: "
                   "the ratio to dense if each distant pair kept cost what a pair costs in dense attention, "
                   "on top of the window pattern's attention time (`pairs_bound()`; needs the eval's pairs kept).\n\n"
                   + to_markdown(pre, PREFILL_COLS, E2E_FMT))
        out.append("### Where the bare forward's time goes (shares of its wall time)\n\n"
                   "route: router + groups; plan: sort + segment layout; gather_scatter; attention: the "
                   "kernel calls; merge: the LSE merge; mask_hooks: mask read, path choice, hook points; "
                   "other_attention_fn: the rest of the attention function; outside_attention: the model "
                   "outside its attention functions (projections, MLP, norms, lm_head, loss).\n\n"
                   + to_markdown(pre, SHARE_COLS, E2E_FMT))
    dec = df[df.phase == "decode"] if len(df) else df
    if len(dec):
        out.append("### Decode: `model.generate` through the KV cache (per-step time, median over steps)\n\n"
                   + to_markdown(dec, DECODE_COLS, E2E_FMT))
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# output

def to_markdown(df: pd.DataFrame, cols: list[str], fmt: dict[str, str]) -> str:
    cols = [c for c in cols if c in df.columns]  # older tables lack newer columns
    head = "| " + " | ".join(cols) + " |\n|" + "|".join("---:" for _ in cols) + "|\n"
    lines = []
    for _, r in df.iterrows():
        cells = []
        for c in cols:
            v = r[c]
            cells.append(fmt.get(c, "{}").format(v) if not (isinstance(v, float) and math.isnan(v)) else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


KERNEL_COLS = ["n", "K", "k", "groups", "backend", "dense_s", "focus_s", "speedup", "speedup_paired", "ideal_speedup",
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
    if "backend" not in df.columns:  # tables written before the --backends option
        df = df.assign(backend="")
    several = df.backend.nunique() > 1
    for (K, k, g, be), part in df.groupby(["K", "k", "groups", "backend"]):
        name = f"Focus K={K} k={k}" + ("" if g == "balanced" else f" ({g} groups)") + (f" [{be}]" if several else "")
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
    fig.write_html(out / "bench_attention.html", include_plotlyjs=True)  # not committed (5 MB); figure 2 is
    # drawn from kernel.csv and e2e.csv by analyses/fig_speedup_length.py


def _title(args, env) -> str:
    la = env.get("loadavg_start", [float("nan")])[0]
    where = (f"{env['gpu']}" if env.get("gpu") else
             f"CPU ({env['threads']} threads, load avg {la:.1f} at start)")
    return (f"Hard Focus (two calls + LSE merge) vs dense causal SDPA, {where}, "
            f"H={args.heads}/{args.kv_heads}, D={args.head_dim}, w={args.window}, {getattr(args, 'dtype', 'fp32')}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("figures/bench_attention"))
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--no-thp", action="store_true",
                    help="do not set THP_MEM_ALLOC_ENABLE=1 (huge-page allocation of large tensors)")
    k = ap.add_argument_group("kernel part (one attention call, random q/k/v)")
    k.add_argument("--no-kernel", action="store_true")
    k.add_argument("--sizes", type=_ints, default=[1024, 2048, 4096, 8192, 16384, 32768])
    k.add_argument("--max-n", type=int, default=65536, help="largest n to run")
    k.add_argument("--dense-max-n", type=int, default=1 << 30, help="no dense call above this n")
    k.add_argument("--dense-max-seconds", type=float, default=300.0,
                   help="skip dense at n when its time extrapolated (n^2) from the last n exceeds this")
    k.add_argument("--Ks", type=_ints, default=[4, 8])
    k.add_argument("--ks", type=_ints, default=[1, 2])
    k.add_argument("--repeats", type=int, default=3)
    k.add_argument("--serial-bookkeeping", choices=["auto", "on", "off"], default="auto",
                   help="DecompositionOptions.serial_bookkeeping: auto (serial only on an oversubscribed "
                        "machine), on, off")
    k.add_argument("--cold-start", action="store_true",
                   help="warm up on 256 tokens only (the first timed Focus call then pays for "
                        "growing its scratch buffers); default: one untimed full-size call each")
    k.add_argument("--large-from", type=int, default=65536,
                   help="from this n on, only --large-configs and --large-repeats")
    k.add_argument("--large-repeats", type=int, default=1)
    k.add_argument("--large-configs", default=[(8, 1), (4, 1)],
                   type=lambda s: [tuple(int(x) for x in c.split(":")) for c in s.split(",")],
                   help="K:k pairs run (balanced groups only) at the largest sizes (default 8:1,4:1)")
    k.add_argument("--window", type=int, default=128)
    k.add_argument("--backends", type=lambda s: [b for b in s.split(",") if b], default=["auto"],
                   help="hard_focus_attention backends, comma-separated (auto, torch, flash, flex; "
                        "default auto), each config timed with each")
    k.add_argument("--device", default="cpu", help="device of the kernel part: cpu or cuda (kernel part only)")
    k.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="q/k/v dtype of the kernel part")
    k.add_argument("--heads", type=int, default=9, help="query heads (SmolLM2-135M: 9)")
    k.add_argument("--kv-heads", type=int, default=3, help="KV heads (SmolLM2-135M: 3)")
    k.add_argument("--head-dim", type=int, default=64, help="head_dim (SmolLM2-135M: 64)")
    k.add_argument("--check-max-n", type=int, default=2048,
                   help="compare with the dense masked reference up to this n")
    k.add_argument("--groups", type=str, default=None, help="router scores recorded by --make-groups")
    k.add_argument("--groups-layer", type=int, default=None, help="layer of --groups (default: middle)")
    k.add_argument("--make-groups", type=str, default=None, metavar="ROUTER",
                   help="record a trained router's scores into --groups, then exit")
    k.add_argument("--groups-tokens", type=int, default=4096)
    e = ap.add_argument_group("end to end (the embedded model, the shipped routers)")
    e.add_argument("--no-e2e", action="store_true", help="skip prefill and decode")
    e.add_argument("--no-prefill", action="store_true")
    e.add_argument("--no-decode", action="store_true")
    e.add_argument("--routers", type=str, default=None, help="router file (default: the shipped one)")
    e.add_argument("--corpus", type=str, default="austen")
    e.add_argument("--patterns", default=E2E_PATTERNS, help=f"prefill patterns (default {E2E_PATTERNS})")
    e.add_argument("--e2e-sizes", type=_ints, default=[4096, 8192], help="prefill lengths (tokens)")
    e.add_argument("--eval-sizes", type=lambda x: [] if x == "none" else _ints(x), default=None,
                   help="lengths at which evaluate() is timed too (default: every --e2e-sizes; 'none')")
    e.add_argument("--e2e-repeats", type=int, default=2,
                   help="bare + eval forwards per pattern and length, round-robin; medians reported")
    e.add_argument("--decode-patterns", default=DECODE_PATTERNS)
    e.add_argument("--decode-contexts", type=_ints, default=[2048, 4096, 8192],
                   help="context lengths L of decoding: a prefix of L - new-tokens tokens, then "
                        "--new-tokens generated (L must fit the model's positions)")
    e.add_argument("--new-tokens", type=int, default=16)
    e.add_argument("--decode-repeats", type=int, default=2)
    e.add_argument("--kv-cache", choices=["growing", "dynamic"], default="growing",
                   help="decode's KV cache: growing (focus_lab.hf.kv_cache.GrowingCache, appends in place; "
                        "default) or dynamic (transformers' DynamicCache, one full copy per step)")
    e.add_argument("--replot", action="store_true", help="only redraw the plot from --out/kernel.csv")
    e.add_argument("--bounds", metavar="TABLE", default=None,
                   help="only print the prefill bounds of --out/e2e.csv (window_bound, pairs_bound); a "
                        "pattern's pairs kept missing at a length (no eval there) comes from window 0 of "
                        "the committed length table TABLE (e.g. shipped) when its router file is the same")
    args = ap.parse_args(argv)
    if args.bounds:
        print(bounds_markdown(pd.read_csv(args.out / "e2e.csv"), args.bounds, args.corpus))
        return 0
    if args.replot:
        env = json.loads((args.out / "env.json").read_text())
        plot(pd.read_csv(args.out / "kernel.csv"), args.out, _title(args, env))
        return 0
    if args.eval_sizes is None:
        args.eval_sizes = args.e2e_sizes
    if min(args.repeats, args.e2e_repeats, args.decode_repeats, args.new_tokens) < 1:
        print("bench_attention: --repeats, --e2e-repeats, --decode-repeats and --new-tokens must be >= 1",
              file=sys.stderr)
        return 2

    if args.device != "cpu":
        from focus_lab.hf.models import resolve_device
        try:
            args.device = resolve_device(args.device)
        except ValueError as e:
            print(f"bench_attention: {e}", file=sys.stderr)
            return 2
        if not args.no_e2e:
            print("bench_attention: --device cuda runs the kernel part only; add --no-e2e", file=sys.stderr)
            return 2
    if not args.no_kernel:
        for be in args.backends:
            try:
                resolve_backend(be, torch.device(args.device), DTYPES[args.dtype])
            except ValueError as e:
                print(f"bench_attention: --backends {be}: {e}", file=sys.stderr)
                return 2
    global SERIAL_MODE
    SERIAL_MODE = args.serial_bookkeeping
    torch.set_num_threads(args.threads)
    if args.make_groups:
        make_groups(args.make_groups, Path(args.groups or args.out / "groups.pt"), args.groups_tokens, args.corpus)
        return 0
    env = machine()
    env.update({"argv": sys.argv[1:] if argv is None else list(argv), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                "THP_MEM_ALLOC_ENABLE": os.environ.get("THP_MEM_ALLOC_ENABLE"),
                "serial_bookkeeping": args.serial_bookkeeping})
    args.out.mkdir(parents=True, exist_ok=True)
    md = [f"# Benchmark tables ({env['started']}, {env['cpu_model']}, {env['nproc']} cores, "
          + (f"{env['gpu']} (CUDA {env['cuda']}, kernel part on {args.device}, {args.dtype}), " if env.get("gpu") else "")
          + f"{env['threads']} torch threads, load average at start {env['loadavg_start'][0]:.1f})\n",
          "Command: `python -m analyses.bench_attention " + " ".join(env["argv"]) + "`\n"]
    kernel = e2e = None

    def save_e2e(df: pd.DataFrame, final: bool = False) -> None:  # also the partial tables of a long run
        if not len(df):
            return
        write_csv(df, args.out / "e2e.csv")
        text = "## End to end: SmolLM2-135M, shipped routers\n\n" + e2e_markdown(df)
        write_text("\n".join(md + [text, "(run in progress)\n" if not final else ""]), args.out / "results.md")
        if final:
            md.append(text)
            print("\n" + text)
    if not args.no_e2e:
        try:
            e2e = end_to_end(args, save_e2e)
        except BadInput as err:
            print(f"bench_attention: {err}", file=sys.stderr)
            return 2
        save_e2e(e2e, final=True)
    if not args.no_kernel:
        kernel = kernel_bench(args)
    if kernel is not None:
        write_csv(kernel, args.out / "kernel.csv")
        text = to_markdown(kernel, KERNEL_COLS, KERNEL_FMT)
        md.append("## Kernel: one attention call (dense causal SDPA vs hard_focus_attention)\n\n" + text)
        print("\n" + text)
        plot(kernel, args.out, _title(args, env))
    env["loadavg_end"] = os.getloadavg()
    env["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    md.append(f"Load average at the end: {env['loadavg_end'][0]:.1f} (1 min), {env['loadavg_end'][1]:.1f} (5 min).\n")
    write_text("\n".join(md), args.out / "results.md")
    write_text(json.dumps(env, indent=1), args.out / "env.json")
    return 0


def machine() -> dict:
    """The machine a run measured on (``focus_lab.io.machine``) and the load average at the start."""
    from focus_lab.io import machine as _machine
    return {**_machine(), "loadavg_start": os.getloadavg()}


def write_text(text: str, path: Path) -> None:
    """Write ``text`` to a temporary file next to ``path``, then rename it into place."""
    from focus_lab.io import atomic_path
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text)


def write_csv(df: pd.DataFrame, path: Path) -> None:
    from focus_lab.io import atomic_path
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False)


if __name__ == "__main__":
    raise SystemExit(main())

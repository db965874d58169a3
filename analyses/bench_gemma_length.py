"""The length bound of Gemma-3-270M on this CPU: one forward of a held-out window (Persuasion) at
each length, dense (the model's own attention) against the Focus path in hard top-1 and hard
top-2 with freshly initialised routers (issue 73; docs/studies/gemma-long-context-bounds.md).

Each cell (length x pattern) runs in a child process of its own, so its peak RSS is its own
(``os.wait4``'s ``ru_maxrss``). A child loads the model, warms up on 256 tokens, then times one
forward under ``torch.no_grad`` (inference_mode fails on the Focus path) with 2 threads, split
in two: the decoder body (``model.model``, with a pre/post hook on each decoder layer, so the
share of the global layers 5, 11, 17 is measured in the same forward) and the LM head with the NLL in chunks of 512
positions (the full (T, 262144) fp32 logits alone would be 34 GB at 32K), timed on the first
8191 positions and scaled linearly in T beyond (``head_measured_tokens``; the head's cost is
the same matmul per position whatever the pattern). Focus cells attach
``FocusConfig(num_groups=4, window=128, sink_tokens=64, mode="hard", top_k=k)`` (the SmolLM2
file's shape) with fresh routers (``random_topK``: balanced random groups instead, the control;
``--routers FILE``: that router file's routers instead of fresh ones); ``focus_dense`` attaches
them in dense mode: the Focus path's dense forward, whose sliding layers run as in hard mode
(``core.masked_attention``), where ``dense`` is the model's own attention;
the share of causal pairs the groups keep is estimated from the routers' scores (argmax / top-k,
no group bias).

A cell is skipped when its projected peak (4x what the same pattern's body forward added to the
loaded model at half the length, ``body_peak_gib - rss_loaded_gib``, plus the loaded model)
exceeds ``--max-gib``. Cells already in ``--out`` are not re-run; the table is written after
every cell, with the load averages (``os.getloadavg``) before and after it. The ratios printed are those of this run's cells.

    python -m analyses.bench_gemma_length --lengths 4096,8192 --out figures/gemma/bench_length.csv
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GLOBAL_LAYERS = (5, 11, 17)
HEAD_CHUNK = 512  # positions per LM-head chunk: (512, 262144) fp32 logits, 0.5 GiB
HEAD_TOKENS = 8191  # positions the LM head is timed on; beyond, its time is scaled linearly
PATTERNS = ("dense", "hard_top1", "hard_top2")


def _cell(T: int, pattern: str, out: Path, seed: int, routers: Path | None = None) -> None:
    """Run one cell in this process and write its measurements as JSON to ``out``."""
    import resource

    import torch
    import torch.nn.functional as F

    torch.set_num_threads(2)
    from focus_lab.data import load_corpus, make_windows
    from focus_lab.hf.models import load_model

    def gib(kb: float) -> float:
        return kb / 2**20

    model, tok = load_model("gemma3-270m", verbose=False)
    ids = make_windows(load_corpus("austen").heldout, tok, T, max_windows=1)[0].input_ids[None]  # (1, T)
    scores = {}
    if pattern != "dense":
        import focus_lab
        from focus_lab.method.config import FocusConfig
        torch.manual_seed(seed)
        mode = "dense" if pattern == "focus_dense" else "hard"
        top_k = 2 if pattern == "focus_dense" else int(pattern[-1])
        assignment = "random" if pattern.startswith("random") else "router"
        if routers is None:
            focus_lab.attach(model, FocusConfig(num_groups=4, window=128, top_k=top_k, sink_tokens=64, mode=mode,
                                                assignment=assignment))
        else:
            from focus_lab.hf.router_files import load_routers
            load_routers(model, routers)
            focus_lab.set_config(model, mode=mode, top_k=top_k, assignment=assignment)
        for i, layer in enumerate(model.model.layers):
            router = getattr(layer.self_attn, "focus_router", None)
            if router is not None:
                router.register_forward_hook(lambda m, a, o, i=i: scores.__setitem__(i, o.detach()))
    from analyses.common import layer_seconds
    layer_s = layer_seconds(model.model.layers)  # {layer index: seconds} of the forward
    rss_loaded = gib(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    # torch.no_grad, not inference_mode: under inference_mode the Focus path fails
    # (focus_lab/hf/state.py PlainCausalCheck reads attention_mask._version, which inference tensors
    # do not track); every cell runs under no_grad so the cells compare
    with torch.no_grad():
        model.model(input_ids=ids[:, :256], use_cache=False)  # warm-up
        layer_s.clear()
        t0 = time.perf_counter()
        h = model.model(input_ids=ids, use_cache=False).last_hidden_state  # (1, T, d)
        body = time.perf_counter() - t0
        rss_body = gib(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # the peak up to the body's end
        t1 = time.perf_counter()
        nll = 0.0
        cap = model.config.final_logit_softcapping
        head_tokens = min(T - 1, HEAD_TOKENS)  # the head is linear in T: timed on at most 8K positions
        for s in range(0, head_tokens, HEAD_CHUNK):
            e = min(s + HEAD_CHUNK, head_tokens)
            logits = model.lm_head(h[:, s:e]).float()  # (1, c, V)
            if cap:
                logits = cap * torch.tanh(logits / cap)
            nll += float(F.cross_entropy(logits[0], ids[0, s + 1:e + 1], reduction="sum"))
        head = (time.perf_counter() - t1) * (T - 1) / head_tokens  # scaled to all T - 1 positions
    share_kept = None
    if scores and not pattern.startswith("random") and pattern != "focus_dense":  # approximate share of causal pairs whose key is in one of the query's groups
        k = int(pattern[-1])
        shares = []
        for s in scores.values():
            s = s[0].float()  # (T, K)
            kg = s.argmax(-1)  # (T,)
            qg = s.topk(k, -1).indices  # (T, k)
            cnt = F.one_hot(kg, s.shape[-1]).cumsum(0)  # (T, K): keys of each group up to i
            kept = cnt.gather(1, qg).sum(-1).double()  # (T,)
            shares.append(float(kept.sum() / (T * (T + 1) / 2)))
        share_kept = sum(shares) / len(shares)
    total_layers = sum(layer_s.values())
    res = {"T": T, "pattern": pattern, "body_s": body, "head_s": head, "total_s": body + head,
           "layers_s": total_layers, "global_layers_s": sum(layer_s.get(i, 0.0) for i in GLOBAL_LAYERS),
           "global_share_of_body": sum(layer_s.get(i, 0.0) for i in GLOBAL_LAYERS) / body,
           "nll_per_token": nll / head_tokens, "head_measured_tokens": head_tokens, "rss_loaded_gib": rss_loaded, "body_peak_gib": rss_body,
           "group_pairs_share": share_kept, "threads": torch.get_num_threads(), "grad_mode": "no_grad",
           "attn_implementation": model.config._attn_implementation}
    out.write_text(json.dumps(res))


def _run_cell(T: int, pattern: str, seed: int, routers: Path | None = None) -> dict:
    """One cell in a child process: its JSON, its peak RSS and wall seconds, the load before/after."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "cell.json"
        load0 = os.getloadavg()
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "analyses.bench_gemma_length", "--cell", str(T), pattern,
                                 "--cell-out", str(out), "--seed", str(seed)]
                                + (["--routers", str(routers)] if routers else []))
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        code = os.waitstatus_to_exitcode(status)
        res = json.loads(out.read_text()) if out.is_file() else {"T": T, "pattern": pattern}
    load1 = os.getloadavg()
    res.update(peak_rss_gib=usage.ru_maxrss / 2**20, process_s=wall, exit_code=code,
               load1_before=load0[0], load5_before=load0[1], load1_after=load1[0], load5_after=load1[1],
               status="ok" if code == 0 else f"failed (exit {code})")
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="4096,8192")
    ap.add_argument("--patterns", default=",".join(PATTERNS))
    ap.add_argument("--out", type=Path, default=Path("figures/gemma/bench_length.csv"))
    ap.add_argument("--max-gib", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--routers", type=Path, default=None, help="a router file instead of fresh routers")
    ap.add_argument("--cell", nargs=2, metavar=("T", "PATTERN"), help=argparse.SUPPRESS)
    ap.add_argument("--cell-out", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.cell:
        _cell(int(a.cell[0]), a.cell[1], a.cell_out, a.seed, a.routers)
        return 0
    import pandas as pd
    rows = pd.read_csv(a.out).to_dict("records") if a.out.is_file() else []
    from focus_lab.io import machine as this_machine
    from focus_lab.io import machine_line
    machine = f"{machine_line(this_machine())}, 2 torch threads"  # the threads each cell sets
    for T in (int(x) for x in a.lengths.split(",")):
        for pattern in a.patterns.split(","):
            if any(r["T"] == T and r["pattern"] == pattern and r["status"] == "ok" for r in rows):
                continue
            half = [r for r in rows if r["T"] == T // 2 and r["pattern"] == pattern and r["status"] == "ok"]
            res = {"T": T, "pattern": pattern}
            if half:
                h = half[-1]
                body_peak = h.get("body_peak_gib")
                body_peak = h["peak_rss_gib"] if body_peak is None or math.isnan(body_peak) else body_peak
                projected = h["rss_loaded_gib"] + 4 * (body_peak - h["rss_loaded_gib"])
                res["projected_gib"] = projected
                if projected > a.max_gib:
                    res["status"] = f"skipped: projected {projected:.1f} GiB > {a.max_gib:g}"
                    print(f"T={T} {pattern}: {res['status']}", flush=True)
                    rows.append(res)
                    continue
            print(f"T={T} {pattern}: running (load {os.getloadavg()[0]:.2f}) ...", flush=True)
            res.update(_run_cell(T, pattern, a.seed, a.routers))
            res["routers"] = str(a.routers) if a.routers else "fresh"
            res["machine"] = machine
            res["created"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            print(f"T={T} {pattern}: {res['status']}, total {res.get('total_s', float('nan')):.1f} s "
                  f"(body {res.get('body_s', float('nan')):.1f}, head {res.get('head_s', float('nan')):.1f}), "
                  f"peak {res['peak_rss_gib']:.2f} GiB, global layers "
                  f"{100 * res.get('global_share_of_body', float('nan')):.0f}% of the body, "
                  f"load {res['load1_before']:.2f}->{res['load1_after']:.2f}", flush=True)
            rows = [r for r in rows if not (r["T"] == T and r["pattern"] == pattern)] + [res]
            a.out.parent.mkdir(parents=True, exist_ok=True)
            pd.DataFrame(rows).to_csv(a.out, index=False)
    print(f"machine: {machine}")
    dense = {r["T"]: r for r in rows if r["pattern"] == "dense" and r.get("status") == "ok"}
    for r in rows:
        if r.get("status") == "ok" and r["pattern"] != "dense" and r["T"] in dense:
            d = dense[r["T"]]
            print(f"T={r['T']} {r['pattern']}: dense/pattern body {d['body_s'] / r['body_s']:.2f}x, "
                  f"end to end {d['total_s'] / r['total_s']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

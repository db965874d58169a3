"""What the rules' hooks cost a forward: the same forward with the hook mechanism running (every
routed layer builds a ``core.RouteStep`` and a ``core.PairStep`` and calls each rule in force) and
with it bypassed (``FocusConfig.rules_in_force`` patched to return no rule), interleaved in one
process on one window, for patterns whose rules in force change nothing through a hook (the
per-layer k and random-group layers act through ``top_k_at`` / ``assignment_at``), so both ways
compute the same logits, which the script checks. The ratio per pattern is the median over rounds
of (bypassed seconds / hooked seconds): below 1 means the mechanism costs time.

    python -m analyses.bench_rule_hooks --rounds 7 --seq-len 4096
"""

from __future__ import annotations

import argparse
import statistics
import time
from unittest import mock

import torch

PATTERNS = ("hard_top2", "default_top1", "random_default")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seq-len", type=int, default=4096)
    a = ap.parse_args(argv)
    from analyses.common import shipped_window
    from focus_lab.hf.retrofit import forward_state
    from focus_lab.method.config import FocusConfig
    from focus_lab.patterns import Pattern
    model, cfg, ids = shipped_window(a.seq_len)  # ids: (1, T)
    changes = {p: Pattern.parse(p, cfg).changes() for p in PATTERNS}
    secs = {(p, w): [] for p in PATTERNS for w in ("hooked", "bypassed")}
    logits = {}

    def run(p: str, way: str) -> None:
        state = forward_state(model, **changes[p])
        patch = mock.patch.object(FocusConfig, "rules_in_force", lambda self: ()) if way == "bypassed" \
            else mock.patch.object(FocusConfig, "rules_in_force", FocusConfig.rules_in_force)
        with patch, torch.no_grad():
            t = time.perf_counter()
            out = model(input_ids=ids, focus=state, use_cache=False, logits_to_keep=1).logits
            secs[(p, way)].append(time.perf_counter() - t)
        logits.setdefault(p, {})[way] = out

    for p in PATTERNS:  # warm-up
        run(p, "hooked")
    for k in secs:
        secs[k].clear()
    for r in range(a.rounds):
        for p in PATTERNS:
            for way in (("hooked", "bypassed") if r % 2 == 0 else ("bypassed", "hooked")):
                run(p, way)
    from focus_lab.io import machine, machine_line
    print(f"machine: {machine_line(machine())}, torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads; {a.rounds} rounds, one window of {a.seq_len} "
          "tokens, interleaved")
    print(f"{'pattern':<16} {'hooked s':>9} {'bypassed s':>11} {'ratio':>7} {'min':>6} {'max':>6}  logits equal")
    ok = True
    for p in PATTERNS:
        ratios = [b / h for h, b in zip(secs[(p, "hooked")], secs[(p, "bypassed")])]
        same = torch.equal(logits[p]["hooked"], logits[p]["bypassed"])
        ok &= same
        print(f"{p:<16} {statistics.median(secs[(p, 'hooked')]):9.3f} {statistics.median(secs[(p, 'bypassed')]):11.3f} "
              f"{statistics.median(ratios):7.3f} {min(ratios):6.3f} {max(ratios):6.3f}  {same}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

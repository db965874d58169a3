"""Whether a pattern spelled as rules costs anything: forwards under the config a committed label
gave (``patterns.legacy.legacy_changes`` on the router file's config) against forwards under the
same rules spelled as a pattern (``Pattern.changes``), interleaved in one process on one window.

Each round runs every pattern once each way, in alternating order; the ratio per pattern is the
median over rounds of (legacy seconds / pattern seconds), so > 1 means the pattern is faster.
The logits must be equal, which the script checks.

    python -m analyses.bench_pattern_overhead --rounds 5 --seq-len 4096
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

PAIRS = (("dense", "dense"), ("window", "window"), ("hard_top1", "default_top1"), ("hard_top2", "default"),
         ("random_top2", "random_default"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seq-len", type=int, default=4096)
    a = ap.parse_args(argv)
    from analyses.common import shipped_window
    from focus_lab.hf.retrofit import forward_state
    from focus_lab.patterns import Pattern
    from focus_lab.patterns.legacy import legacy_changes
    model, cfg, ids = shipped_window(a.seq_len)  # ids: (1, T)
    ways = {(old, new): (cfg.replace(**legacy_changes(old, cfg.num_groups)),
                         cfg.replace(**Pattern.parse(new, cfg).changes())) for old, new in PAIRS}
    times: dict[tuple, list[tuple[float, float]]] = {k: [] for k in ways}
    same = True
    with torch.no_grad():
        for r in range(a.rounds):
            for key, (legacy, pattern) in ways.items():
                order = ((0, legacy), (1, pattern)) if r % 2 == 0 else ((1, pattern), (0, legacy))
                secs, logits = [0.0, 0.0], [None, None]
                for i, c in order:
                    t0 = time.perf_counter()
                    logits[i] = model(input_ids=ids, use_cache=False, focus=forward_state(model, **c.to_dict())).logits
                    secs[i] = time.perf_counter() - t0
                same &= bool(torch.equal(logits[0], logits[1]))
                times[key].append((secs[0], secs[1]))
    from focus_lab.io import machine, machine_line
    print(f"machine: {machine_line(machine())}, {torch.get_num_threads()} "
          f"torch threads; {a.rounds} rounds x 1 window of {a.seq_len} tokens, the two spellings interleaved")
    print(f"{'legacy label':<14} {'pattern':<16} {'legacy s':>9} {'pattern s':>9} {'ratio':>6} {'min':>6} {'max':>6}")
    for (old, new), ts in times.items():
        ratios = [x / y for x, y in ts]
        print(f"{old:<14} {new:<16} {statistics.median(x for x, _ in ts):9.2f} {statistics.median(y for _, y in ts):9.2f} "
              f"{statistics.median(ratios):6.3f} {min(ratios):6.3f} {max(ratios):6.3f}")
    print(f"logits equal in every forward: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())

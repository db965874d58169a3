"""docs/recipes.md's stage table: what each stage of SmolLM2's router chain (``focus-lab routers
build``, ``focus_lab.train.chain.stages``) ran and cost in one chain, read from that chain's own
record (``chain.json``, committed as ``figures/results/smollm2_chain.json``): the command, wall
seconds, peak resident memory, the highest 1-minute load average seen while the stage ran (about 2
when the chain had the 2-core machine to itself), and how the result compares with the shipped file."""

from __future__ import annotations

import json
import re

from analyses.doc_blocks import REPO, Generated, MissingInput, block, router_label

CHAIN = "figures/results/smollm2_chain.json"
#: stage name -> what it is, in the chain's order (focus_lab.train.chain.stages)
STAGES = {"s1_sinks64_512": "1. `sinks64` at 512 tokens", "s2_distill64_4096": "2. `distill64` at 4096 tokens",
          "s3_mix_seed0": "3. two domains at 4096, seed 0", "s3_mix_seed1": "3. seed 1, from seed 0",
          "s3_mix_seed2": "3. seed 2, from seed 1", "s4_soup": "4. the average of 2 and 3",
          "s5_budget": "5. the top-2 budget", "s6_needle_corpus": "6. the needle corpus",
          "s7_needle_mix_seed0": "7. the needle mix", "s8_budget": "8. the top-2 budget again",
          "s9_capacity": "9. the group capacity"}


def _command(cmd: str, out: str) -> str:
    """The command as the table shows it: the chain's folder as ``<out>``, the rule strings of the
    budget and the capacity named, not spelled (focus_lab.train.chain.BUDGET, RANDOM_LAYERS, CAPACITY)."""
    from focus_lab.train.chain import BUDGET, CAPACITY, RANDOM_LAYERS
    cmd = cmd.replace(out.rstrip("/") + "/", "<out>/")
    cmd = cmd.replace(f"+{BUDGET}", "+<budget>").replace(f"+{RANDOM_LAYERS}", "+<random layers 1-9>")
    cmd = cmd.replace(f"+{CAPACITY}", "+<capacity>")
    cmd = re.sub(r"--corpus \S*/(mix_austen_shakespeare)", r"--corpus data/\1", cmd)
    return cmd.removeprefix("focus-lab ")


@block("recipe-stages", CHAIN)
def recipe_stages() -> Generated:
    """One row per stage of the chain's record (``STAGES`` order), then the whole chain: seconds
    summed, the largest peak, the highest load; then the result against the reference file."""
    rec = json.loads((REPO / CHAIN).read_text())
    stages = rec.get("stages", {})
    missing = [s for s in STAGES if s not in stages]
    if missing:
        raise MissingInput(f"{CHAIN} (stages {', '.join(missing)})")
    out = re.search(r"--out (\S+)/s1_sinks64_512", stages["s1_sinks64_512"]["command"]).group(1)
    lines = ["| stage | command (`focus-lab ...`; `<out>`: the chain's folder) | seconds | peak RSS | highest load |",
             "|---|---|---:|---:|---:|"]
    for name, what in STAGES.items():
        s = stages[name]
        lines.append(f"| {what} | `{_command(s['command'], out)}` | {s['seconds']:.0f} | {s['peak_rss_gb']:.2f} GiB | "
                     f"{s['max_load_1min']:.1f} |")
    total = sum(stages[n]["seconds"] for n in STAGES)
    peak = max(stages[n]["peak_rss_gb"] for n in STAGES)
    load = max(stages[n]["max_load_1min"] for n in STAGES)
    lines.append(f"| **all** | `routers build` | **{total:.0f} s = {total / 60:.1f} min** | {peak:.2f} GiB | {load:.1f} |")
    from focus_lab.io import machine_line
    from focus_lab.train.chain import BUDGET, CAPACITY, RANDOM_LAYERS
    lines += ["", f"`<budget>`: `{BUDGET}`; `<random layers 1-9>`: `{RANDOM_LAYERS}`; `<capacity>`: `{CAPACITY}`."]
    ref = rec.get("against_reference")
    if ref:
        same = "equal, bit for bit, to" if ref["equal"] else f"within {ref['max_abs_diff']:.1e} of"
        lines += ["", f"The result's {ref['routed_tensors']} routed-layer tensors are {same} those of the shipped "
                  f"file, {router_label(ref['reference_sha256'])}"
                  + ("; its random layers are the same." if ref.get("same_random_layers") else
                     "; its random layers differ.")]
    inputs = (f"{CHAIN}: `focus-lab routers build --out {out}`, its record last written at commit "
              f"{rec.get('commit', 'unknown')}; {machine_line(rec.get('machine', {}))}")
    return Generated(inputs, "\n".join(lines))

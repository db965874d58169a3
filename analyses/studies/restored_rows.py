"""Which query rows lose a retrieval? Put back every distant pair of chosen query rows, in chosen
layers, and measure the answer's teacher-forced log-prob again.

The retrieval trace (``focus_lab.eval.retrieval``, docs/retrieval.md) follows one kind of pair:
the answer's rows to the needle's value tokens. A case can fail while those pairs are all kept
(passkey at 8192 tokens, seed 3: 0.997 of the needle attention kept, the answer 5.5 nats below
dense). This study restores, through the ``kept`` hook point (``hooks.Pairs``, additions only: the
hard decomposition stays in place), every pair ``(i, j)``, ``j <= i``, of a set of query rows in a
set of layers, optionally only towards a set of keys, and reads the answer's log-prob (nats, the
sum over the tokens that carry an answer, as the suite's ``answer_logprob``) from one forward of
prompt + answer. Row sets of a case (``row_sets``):

- ``answer``: the rows that predict the answer's tokens (``P - 1 .. P + n - 2``);
- ``question``: the last ``question_tokens`` prompt rows (the question and the answer prefix) and
  the answer's rows;
- ``needle``: the needle's value tokens (``case.needle_positions``);
- ``sentence``: the needle's value tokens and ``radius`` tokens either side (the needle sentence).

Restoring every row in every layer gives dense's log-prob exactly (tests/test_retrieval.py).

    python -m analyses.studies.restored_rows --task passkey --length 8192 --seeds 3,18   # ~75 s a forward

Source: docs/retrieval.md (the trace); docs/studies/needle-mix-distillation.md (what it explains).
"""

from __future__ import annotations

import argparse
from typing import Sequence

import pandas as pd
import torch

#: (label, row set, layers ("all" or (first, last)), key set or None) of the default study; a set
#: named ``a+b`` is the union of the row sets a and b
DEFAULT_SPECS: tuple[tuple[str, str, object, str | None], ...] = (
    ("answer rows", "answer", "all", None),
    ("needle sentence rows", "sentence", "all", None),
    ("question rows", "question", "all", None),
    ("question rows -> needle sentence", "question", "all", "sentence"),
    ("question and needle sentence rows", "question+sentence", "all", None),
    ("question rows, layers 0-9", "question", (0, 9), None),
    ("question rows -> needle sentence, layers 1-9", "question", (1, 9), "sentence"),
    ("question rows, layers 10-19", "question", (10, 19), None),
    ("question rows, layers 20-29", "question", (20, 29), None),
)


def row_sets(case, question_tokens: int = 64, radius: int = 24) -> dict[str, torch.Tensor]:
    """Query row sets of a retrieval case (module docstring), each a sorted (m,) long tensor of
    positions in prompt + answer. Raises ValueError when the prompt is shorter than
    ``question_tokens``."""
    P, n = len(case.input_ids), len(case.answer_ids)
    if P < question_tokens:
        raise ValueError(f"the prompt has {P} tokens, fewer than question_tokens={question_tokens}")
    needle = torch.as_tensor(case.needle_positions, dtype=torch.long)  # (m,)
    lo, hi = max(0, int(needle.min()) - radius), min(P, int(needle.max()) + radius + 1)
    return {"answer": torch.arange(P - 1, P - 1 + n),
            "question": torch.arange(P - question_tokens, P - 1 + n),
            "needle": needle.sort().values,
            "sentence": torch.arange(lo, hi)}


def restore_patch(rows: torch.Tensor, layers: Sequence[int], keys: torch.Tensor | None = None) -> dict:
    """``kept`` hooks (``hooks.hooks``) that add, in each of ``layers``, every causal pair (row i,
    key j <= i) of the query ``rows`` (batch row 0; keys restricted to ``keys`` when given).

    Args:
        rows: (m,) long query positions; keys: (n,) long key positions, or None for every key.
    """
    from focus_lab.hf.hooks import Pairs
    keys = torch.arange(int(rows.max()) + 1) if keys is None else keys  # (n,)
    r, c = (keys[None, :] <= rows[:, None]).nonzero(as_tuple=True)  # (P,) each: the causal (row, key) cells
    add = torch.stack([torch.zeros_like(r), rows[r], keys[c]], 1)  # (P, 3): (b, i, j)
    return {f"layers.{layer}.kept": (lambda kept, hook, add=add: Pairs(add=add)) for layer in layers}


@torch.no_grad()
def answer_logprob(model, case, changes: dict, patch: dict | None = None) -> float:
    """The answer's teacher-forced log-prob (nats; the tokens ``case.answer_index``) under the
    FocusConfig ``changes`` with the hooks ``patch``: one forward of prompt + answer, no cache."""
    from focus_lab.eval.probe import forward as _forward
    from focus_lab.hf.hooks import hooks
    from focus_lab.hf.retrofit import forward_state
    n = len(case.answer_ids)
    dev = next(model.parameters()).device
    ids = torch.cat([case.input_ids, case.answer_ids]).to(dev)  # (P + n,)
    with hooks(model, patch or {}):  # logits of the answer's rows only (logits_to_keep), not (P + n, V)
        logits = _forward(model, ids, keep=n + 1, use_cache=False, focus=forward_state(model, **changes)).logits
    logp = torch.log_softmax(logits[0, -(n + 1):-1].float(), -1)  # (n, V)
    tok = logp.gather(1, ids[-n:, None])[:, 0]  # (n,)
    return float(tok[torch.as_tensor(case.answer_index, device=dev)].sum())


def restored_rows_table(model, case, pattern: str = "hard_top2",
                        specs: Sequence[tuple[str, str, object, str | None]] = DEFAULT_SPECS) -> pd.DataFrame:
    """One row per restoration of ``specs`` (and the plain ``dense`` and ``pattern``): task, length,
    seed, restored, answer_logprob (nats), recovered (share of the pattern's loss against dense
    that comes back)."""
    from focus_lab.patterns.legacy import legacy_changes as pattern_changes
    from focus_lab.hf.retrofit import forward_state
    K = forward_state(model).config.num_groups
    n_layers = model.config.num_hidden_layers
    hard = pattern_changes(pattern, K)
    sets = row_sets(case)

    def union(name: str) -> torch.Tensor:
        """(m,) sorted positions of the row sets named ``a+b+...``."""
        return torch.cat([sets[n] for n in name.split("+")]).unique()

    out = [("dense", answer_logprob(model, case, pattern_changes("dense", K))),
           (pattern, answer_logprob(model, case, hard))]
    for label, rows, layers, keys in specs:
        layer_ids = range(n_layers) if layers == "all" else range(layers[0], min(layers[1], n_layers - 1) + 1)
        patch = restore_patch(union(rows), layer_ids, None if keys is None else union(keys))
        out.append((f"{pattern} + {label}", answer_logprob(model, case, hard, patch)))
    dense, plain = out[0][1], out[1][1]
    return pd.DataFrame([{"task": case.task, "length": case.length, "seed": case.seed, "restored": lab,
                          "answer_logprob": lp, "recovered": (lp - plain) / (dense - plain) if dense != plain else float("nan")}
                         for lab, lp in out])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="passkey")
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--seeds", default="3,18")
    ap.add_argument("--pattern", default="hard_top2")
    ap.add_argument("--routers", default=None, help="default: the shipped file")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save", default=None, help="write the table as parquet here")
    args = ap.parse_args(argv)
    from analyses.bench_attention import to_markdown
    from analyses.studies import retrieval_setup
    from focus_lab.eval import retrieval as rt
    task = rt.parse_tasks(args.task)[0]
    model, tok, hay = retrieval_setup(args.routers, args.threads)
    frames = []
    for seed in (int(s) for s in args.seeds.split(",")):
        frames.append(restored_rows_table(model, rt.make_case(task, hay, tok, args.length, seed), args.pattern))
        print(to_markdown(frames[-1], ["task", "length", "seed", "restored", "answer_logprob", "recovered"],
                          {"answer_logprob": "{:.2f}", "recovered": "{:.2f}"}), flush=True)
    if args.save:
        from focus_lab.io import write_parquet
        write_parquet(args.save, pd.concat(frames, ignore_index=True))


if __name__ == "__main__":
    main()

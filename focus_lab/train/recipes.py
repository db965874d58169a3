"""Router training recipes that try to close the soft-to-hard gap.

Training sees the soft Sinkhorn gate; inference uses a hard, causal top-k mask (docs/method.md §2).
Each recipe is a named set of FocusConfig and TrainConfig changes, so ``focus-lab train
--recipe NAME`` and the analyses use the same definitions.

| recipe | what changes | source / reasoning |
|---|---|---|
| paper | soft Sinkhorn gate; hard top-k = argmax of raw scores | docs/method.md §1-§2, the paper's recipe |
| calibrated | + per-group bias = EMA of Sinkhorn's column potentials, added before the causal top-k | Sinkhorn's column scaling is what balances groups; a fixed per-group offset reproduces it without looking ahead [ours] |
| straight_through | + forward with the hard mask, backward through the soft gate | straight-through estimator (Bengio et al. 2013) |
| anneal | + tau annealed 0.1 -> 0.02 | temperature annealing toward the hard limit (Gumbel-softmax practice) |
| hard_phase | + last 30% of steps against Gumbel-sampled hard masks (straight-through) | Gumbel top-k (Kool et al. 2019) |
| sinks | calibrated + the first 4 tokens always visible | attention sinks (StreamingLLM, Xiao et al. 2023); docs/method.md §6 |
| sinks_straight_through | sinks + straight_through | both |
| sinks_anneal | sinks + anneal | both |
| sinks_hard_phase | sinks + hard_phase | both |
| random_sinks | random groups + sinks, no training (control at equal sparsity) | control |
| sinks64 | calibrated + the first 64 tokens always visible | the recorder's dropped-dependency audit: 92% of the dropped dense mass lands on secondary sinks (" ", " the") at positions 7-70, just past 4 sinks; the eval-time sweep (figures/recipes/sinks_sweep.md) showed 64 sinks recover most of the gap [ours] |
| coverage64 | coverage with 64 sinks | both |
| distill64 | 64 sinks + the distill objective: each router learns, from dense forwards only, to make its layer's soft-gated output (through the output projection) match the dense output on sampled queries; affordable at 4K-8K tokens (``focus_lab.train.distill``) | SeerAttention's per-layer gate distillation, DuoAttention's output-distortion target [ours] |
| distill64_topk | distill64 against the top-1 and top-2 masks of inference, relaxed (``core.soft_top_k_membership``: a query's k best groups count as kept) instead of the soft gate, which models top-1 only | the hard-aware objective the length table asked for (docs/recipes.md) [ours] |
| coverage | sinks + the coverage objective: each router learns, from dense forwards only, to put a query and the distant keys its layer attends to in one group (``core.coverage_loss``) | the recorder showed hard top-k PPL tracks the dense attention mass the mask drops (docs/method.md §6); a direct, per-layer target for it needs no backward pass through the model [ours] |
"""

from __future__ import annotations

from focus_lab.method.config import ConfigError

DEFAULT_RECIPE = "sinks64"  # best hard-mode recipe measured (docs/cli.md "Router recipes")

RECIPES: dict[str, tuple[dict, dict]] = {
    "paper": ({"bias_momentum": 0.0}, {}),
    "calibrated": ({}, {}),
    "straight_through": ({"straight_through": True}, {}),
    "anneal": ({}, {"tau_final": 0.02}),
    "hard_phase": ({}, {"hard_phase": 0.3}),
    "sinks": ({"sink_tokens": 4}, {}),
    "sinks_straight_through": ({"sink_tokens": 4, "straight_through": True}, {}),
    "sinks_anneal": ({"sink_tokens": 4}, {"tau_final": 0.02}),
    "sinks_hard_phase": ({"sink_tokens": 4}, {"hard_phase": 0.3}),
    "random_sinks": ({"sink_tokens": 4, "assignment": "random"}, {}),
    "coverage": ({"sink_tokens": 4}, {"objective": "coverage"}),
    "sinks64": ({"sink_tokens": 64}, {}),
    "coverage64": ({"sink_tokens": 64}, {"objective": "coverage"}),
    "distill64": ({"sink_tokens": 64}, {"objective": "distill"}),
    "distill64_topk": ({"sink_tokens": 64}, {"objective": "distill", "distill_top_k": (1, 2)}),
}


def recipe(name: str) -> tuple[dict, dict]:
    """(FocusConfig changes, TrainConfig changes) of a named recipe; ConfigError lists the names."""
    if name not in RECIPES:
        raise ConfigError(f"unknown recipe {name!r}; choose one of {', '.join(RECIPES)}")
    f, t = RECIPES[name]
    return dict(f), dict(t)

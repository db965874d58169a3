"""Re-calibrate the routers' per-group bias at a target length, forward passes only.

The group bias (docs/method.md §1 [ours]) is the EMA of Sinkhorn's column potentials seen in
training: the per-group offset that balances the causal hard top-k. Routers trained on
512-token windows carry the offsets of 512-token windows. Here the same potentials are
measured on windows of the target length, in hard mode (each layer sees the inputs it will see
at inference), and the bias is set to their mean (centred). No gradient, no optimizer.
"""

from __future__ import annotations

import torch

from focus_lab.hf.hooks import hooks
from focus_lab.hf.retrofit import forward_state, routers


@torch.no_grad()
def calibrate_bias(model, windows: list, progress: bool = True) -> dict[int, torch.Tensor]:
    """Set every router's ``group_bias`` to the mean Sinkhorn column potential on ``windows``.

    Args:
        model: Focus-attached causal LM; windows: ``input_ids: (T,)`` each, at the target length.
    Returns:
        {layer_idx: (K,) new bias in logit units (score / tau), mean 0}.
    Raises:
        ValueError: no window given, or Focus not attached.
    The model's config is not changed (the forwards get their own FocusForward); the routers'
    train/eval modes in force before the call are restored.
    """
    if not windows:
        raise ValueError("calibrate_bias: no windows; the corpus is shorter than one window")
    rs = routers(model)
    state = forward_state(model, mode="hard", bias_momentum=0.0)  # potentials computed, bias frozen
    sums: dict[int, torch.Tensor] = {}
    counts: dict[int, int] = {}

    def potentials(query_groups, hook):  # the layer's Sinkhorn column potentials, (B, K)
        col = hook.call.routing.col_potential
        if col is not None:
            i = hook.layer_idx
            sums[i] = sums.get(i, 0) + col.float().sum(0)  # (K,) summed over the batch
            counts[i] = counts.get(i, 0) + col.shape[0]

    modes = {i: r.training for i, r in rs.items()}
    try:
        for r in rs.values():
            r.train()  # a training router runs Sinkhorn (Router.assign) even in hard mode
        from tqdm.auto import tqdm
        with hooks(model, {"query_groups": potentials}):  # fires after the routing
            for w in tqdm(windows, desc="calibrate bias", disable=not progress, dynamic_ncols=True):
                model(input_ids=w.input_ids[None], use_cache=False, focus=state)
    finally:
        for i, r in rs.items():
            r.train(modes[i])
    new = {}
    for i, r in rs.items():
        if i in sums:
            b = sums[i] / counts[i]
            r.group_bias.copy_(b - b.mean())
            new[i] = r.group_bias.clone()
    return new

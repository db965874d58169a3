"""docs/intervene.md's first code block, run as written on a tiny model, against an independent
computation: the mask built by brute force from the moved groups, given to the layer through the
kept patch point (the dense masked reference), must give the same losses."""

import re
from pathlib import Path

import torch

import focus_lab
from focus_lab import FocusConfig
from focus_lab.recording.recorder import next_token_nll
from conftest import tiny_llama

DOC = Path(__file__).resolve().parent.parent / "docs" / "intervene.md"
T, W, G = 40, 4, 3


def _block(n: int) -> str:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)[n]


@torch.no_grad()
def test_moving_tokens_into_a_group_equals_the_brute_force_mask_of_the_moved_groups():
    ns: dict = {}
    exec(_block(0), ns)
    model = tiny_llama(layers=2)
    focus_lab.attach(model, FocusConfig(window=W, mode="hard", num_groups=G, top_k=2))
    ids = torch.randint(3, 97, (T,), generator=torch.Generator().manual_seed(1))
    moved = torch.zeros(T, dtype=torch.bool)
    moved[::3] = True
    hard = focus_lab.forward_state(model, mode="hard")
    delta = ns["move_into_group"](model, ids, moved, 1, 2, hard)
    assert delta.shape == (T - 1,) and delta.abs().max() > 0
    # independent: the routing's own groups, moved by hand, and the hard rule by brute force
    with focus_lab.cache(model, ["layers.1.query_groups", "layers.1.key_group"]) as c:
        model(input_ids=ids[None], use_cache=False, focus=hard)
    qg, kg = c["layers.1.query_groups"][0].clone(), c["layers.1.key_group"][0].clone()
    qg[moved, 0], kg[moved] = 2, 2
    mask = torch.zeros(1, T, T, dtype=torch.bool)
    for i in range(T):
        for j in range(i + 1):
            mask[0, i, j] = i - j < W or int(kg[j]) in qg[i].tolist()
    base = next_token_nll(model, ids, focus=hard)
    with focus_lab.hooks(model, {"layers.1.kept": lambda kept, hook: mask}):
        want = next_token_nll(model, ids, focus=hard) - base
    assert torch.allclose(delta, want, atol=1e-5)
    assert not model.model.layers[1].self_attn.__dict__.get("_focus_hooks")


def test_the_measured_example_uses_the_function_of_the_first_block():
    code = _block(1)
    assert "move_into_group(" in code and 'mode="hard"' in code and '"NOUN"' in code

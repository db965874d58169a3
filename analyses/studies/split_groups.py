"""More groups at the same sparsity: a router file with K groups split into one with f * K.

Each centroid ``c_g: (router_dim,)`` becomes ``f`` centroids ``c_g + noise * |c_g| * u`` (``u``
unit random directions, one per copy, the copies' perturbations summing to zero), its group bias
is copied to each, and every top-k of the file's config (``top_k``, ``layer_top_k``,
``top_k_budgets``) is multiplied by ``f``: hard top-(f k) of f K groups then keeps about the same
share of the distant pairs as top-k of K (docs/method.md §2.5). With ``noise = 0`` the copies
tie and the split file's hard mask equals the original's at top-(f k) (a key takes the first
copy of its group, a query both copies of each of its groups); training (``focus-lab train
--num-groups fK --init-routers OUT``) then separates them. Random layers keep balanced random
groups, now fK of them. The base model's identity and the router projections are unchanged.

Usage::

    python -m analyses.studies.split_groups --routers IN --factor 2 --out OUT
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


def split_groups(routers: Path | None, out: Path, factor: int = 2, noise: float = 0.1, seed: int = 0) -> Path:
    """Write ``routers`` (default: the shipped file) to ``out`` with each group split in ``factor``.

    Args:
        routers: a router file with K groups (``layers.{i}.centroids: (K, router_dim)``,
            ``layers.{i}.group_bias: (K,)``).
        out: the file to write (atomically); its ``centroids: (factor * K, router_dim)``, copies of
            one group adjacent (group g becomes groups ``factor * g ... factor * g + factor - 1``).
        factor: copies per group, >= 1. noise: perturbation of each copy, relative to its
            centroid's norm (0: exact copies). seed: seed of the perturbations.
    Returns: ``out``. Raises ValueError for factor < 1 or noise < 0, and
    ``RouterMismatchError`` when ``routers`` is not a router file.
    """
    from focus_lab.hf.retrofit import read_router_file, write_router_file
    from focus_lab.hf.shipped import resolve_routers
    if factor < 1 or noise < 0:
        raise ValueError(f"need factor >= 1 and noise >= 0 (got factor={factor}, noise={noise})")
    cfg, base, tensors, extra = read_router_file(resolve_routers(routers))
    gen = torch.Generator().manual_seed(seed)
    new = {}
    for name, t in tensors.items():
        if name.endswith(".centroids"):
            K, d = t.shape
            u = torch.randn(K, factor, d, generator=gen)                     # (K, f, d_g)
            u = u - u.mean(dim=1, keepdim=True)                              # copies' offsets sum to 0
            u = u / u.norm(dim=-1, keepdim=True).clamp_min(1e-12)
            scale = noise * t.norm(dim=-1, keepdim=True).unsqueeze(1)        # (K, 1, 1)
            new[name] = (t.unsqueeze(1) + scale * u).reshape(K * factor, d).contiguous()  # (fK, d_g)
        elif name.endswith(".group_bias"):
            new[name] = t.repeat_interleave(factor).contiguous()            # (fK,)
        else:
            new[name] = t
    budgets = None if cfg.top_k_budgets is None else \
        {t * factor: {i: k * factor for i, k in m.items()} for t, m in cfg.top_k_budgets.items()}
    layer_top_k = None if cfg.layer_top_k is None else {i: k * factor for i, k in cfg.layer_top_k.items()}
    split = cfg.replace(num_groups=cfg.num_groups * factor, top_k=cfg.top_k * factor,
                        top_k_budgets=budgets, layer_top_k=layer_top_k)
    info = {"from": str(routers), "factor": factor, "noise": noise, "seed": seed}
    return write_router_file(out, new, split, base, {**(extra or {}), "split_groups": info})


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--routers", type=Path, default=None, help="default: the shipped routers")
    ap.add_argument("--factor", type=int, default=2)
    ap.add_argument("--noise", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        print(split_groups(args.routers, args.out, args.factor, args.noise, args.seed))
    except ValueError as e:
        raise SystemExit(f"split_groups: {e}")


if __name__ == "__main__":
    main()

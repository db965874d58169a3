"""Fit a key router's key projection in closed form from the dense model's distant attention.

A router with its own key projection (docs/method.md §1.6) puts key j in query i's group when
``norm(h_j) @ W_k`` lands near ``norm(h_i) @ W_g`` (the same centroids score both). This
script chooses ``W_k`` per layer by weighted ridge regression onto the query side, the weight
of each (query i, key j) pair being the dense model's head-mean attention on it, over the
pairs only groups decide (``i - j >= window``, ``j >= sink_tokens``):

    W_k = argmin  sum_ij A_ij || x_j W_k - x_i W_g ||^2 + lam * m * || W_k - W_g ||^2
        = (X^T diag(a) X + lam m I)^-1 (X^T A^T X W_g + lam m W_g)

with ``x = norm(h)`` (T, d_model), ``a_j = sum_i A_ij`` and ``m`` the mean of ``diag(X^T diag(a) X)``
per unit of ``a`` (so ``lam`` is relative). ``W_g``, the centroids and the random layers stay
as they are, and so does the group bias unless ``--calibrate`` re-calibrates it on the same
windows (``calibrate_bias``, the keys' column potentials). Forward passes only: no gradient.

Usage (about 40 s per 4096-token window on 2 CPU cores)::

    python -m analyses.studies.key_fit --corpus data/mix_broad --windows 8 --lam 0.1 \\
        --out checkpoints/key_fit/routers.safetensors
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


@torch.no_grad()
def fit_key_projection(model, windows: list, lam: float = 0.1) -> dict[int, float]:
    """Set every routed layer's ``key_proj`` by the weighted ridge regression above.

    Args: model: Focus-attached with ``key_router=True``; windows: ``input_ids (T,)`` each;
        lam: ridge strength relative to the mean input energy (>= 0).
    Returns: {layer_idx: relative change ||W_k - W_g|| / ||W_g||}.
    Raises: ValueError when the routers have no key projection.
    """
    import focus_lab
    from focus_lab.hf.hooks import hooks
    from focus_lab.method.core import distant_mask, rms_normalize
    from focus_lab.method.metrics import attention_scale, head_mean_attention

    rs = focus_lab.routers(model)
    cfg = focus_lab.focus_config(model)
    if not cfg.key_router:
        raise ValueError("fit_key_projection: attach or load the routers with key_router=True")
    gram: dict[int, torch.Tensor] = {}
    cross: dict[int, torch.Tensor] = {}
    mass: dict[int, float] = {}

    def acc(out, hook):
        i = hook.layer_idx
        r = rs.get(i)
        if r is None or not r.routes(cfg):
            return
        c = hook.call
        x = rms_normalize(c.router_in[0]).double()  # (T, d)
        A = head_mean_attention(c.query, c.key, attention_scale(c.module, c.query.shape[-1]))[0]  # (T, T)
        pos = torch.arange(A.shape[0])
        far = distant_mask(pos, pos, cfg.window, cfg.sink_tokens)
        A = (A * far).double()  # (T, T) distant attention the groups decide
        a = A.sum(0)  # (T,) weight of each key
        gram[i] = gram.get(i, 0) + x.T @ (a[:, None] * x)  # (d, d)
        cross[i] = cross.get(i, 0) + x.T @ (A.T @ (x @ r.proj.double()))  # (d, d_g)
        mass[i] = mass.get(i, 0.0) + float(a.sum())

    state = focus_lab.forward_state(model, mode="dense")
    with hooks(model, {"attn_out": acc}):
        for w in windows:
            model(input_ids=w.input_ids[None], use_cache=False, focus=state)
    change = {}
    for i, G in gram.items():
        r = rs[i]
        G, B = G / mass[i], cross[i] / mass[i]
        m = float(G.diagonal().mean())
        wg = r.proj.double()
        wk = torch.linalg.solve(G + lam * m * torch.eye(G.shape[0], dtype=G.dtype), B + lam * m * wg)
        r.key_proj.copy_(wk.float())
        change[i] = float((wk - wg).norm() / wg.norm())
    return change


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--routers", type=Path, default=None, help="start: default the shipped routers")
    ap.add_argument("--corpus", default="data/mix_broad", help="training text (its training documents)")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--lam", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calibrate", action="store_true", help="then re-calibrate the group bias on the "
                    "same windows (the keys' column potentials)")
    ap.add_argument("--out", type=Path, required=True, help="router file to write")
    args = ap.parse_args(argv)

    import focus_lab
    from focus_lab.data import load_corpus, make_windows
    from focus_lab.hf.models import load_model
    from focus_lab.hf.retrofit import read_router_file
    from focus_lab.hf.shipped import resolve_routers
    from focus_lab.train.calibrate import calibrate_bias

    torch.set_num_threads(args.threads)
    model, tok = load_model(verbose=False)
    src = resolve_routers(args.routers)
    file_cfg = read_router_file(src)[0]
    focus_lab.attach(model, file_cfg.replace(key_router=True))
    focus_lab.load_routers(model, src)
    windows = make_windows(load_corpus(args.corpus).train, tok, args.seq_len, max_windows=args.windows)
    change = fit_key_projection(model, windows, args.lam)
    print("||W_k - W_g|| / ||W_g|| per layer:", {i: round(v, 3) for i, v in sorted(change.items())})
    if args.calibrate:
        calibrate_bias(model, windows, progress=False)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    focus_lab.save_routers(model, args.out, extra={"key_fit": {"source": str(src), "corpus": args.corpus,
                                                               "windows": len(windows), "lam": args.lam}})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

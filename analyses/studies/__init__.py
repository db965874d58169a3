"""The studies behind the docs: sweeps, budgets, audits and the shipped routers' training chain.

Each is a script (``python -m analyses.studies.<name>``) whose result a page of docs/ cites; the
figure pipeline (``analyses.figures``) never imports them. Source: docs/method.md, docs/recipes.md,
one page per study in docs/studies/.
"""


def window_study_args(ap, out: str, patterns: str) -> None:
    """The options every per-window study of held-out text shares (``copy_loss``,
    ``copy_pairs``): --routers, --corpora, --seq-len, --windows, --patterns, --threads, --out,
    --report (only print the table of an earlier run's parquet)."""
    import argparse  # noqa: F401  (ap is an argparse.ArgumentParser)
    from pathlib import Path
    ap.add_argument("--routers", type=Path, default=None, help="default: the shipped routers")
    ap.add_argument("--corpora", default="austen,man-pages")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--windows", type=int, default=2, help="held-out windows per corpus")
    ap.add_argument("--patterns", default=patterns)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path(out))
    ap.add_argument("--report", type=Path, default=None, metavar="PARQUET",
                    help="only print the table of an earlier run's parquet")


def load_study(args):
    """The embedded model with ``args.routers`` (default: the shipped file) on ``args.threads``
    torch threads. Returns (model, tokenizer, router path, its sha256, FocusConfig, patterns
    parsed from ``args.patterns``)."""
    import torch

    from focus_lab.patterns.legacy import parse_legacy_patterns as parse_patterns
    from focus_lab.hf.models import load_model
    from focus_lab.hf.retrofit import load_routers
    from focus_lab.hf.shipped import resolve_routers
    from focus_lab.io import file_sha256
    torch.set_num_threads(args.threads)
    model, tok = load_model(verbose=False)
    routers = resolve_routers(args.routers)
    cfg = load_routers(model, routers)
    return model, tok, routers, file_sha256(routers), cfg, parse_patterns(args.patterns, cfg.num_groups)


def retrieval_setup(routers=None, threads: int = 2):
    """The embedded model with ``routers`` (default: the shipped file) and *Persuasion*'s held-out
    text as a haystack, as ``focus-lab probe retrieval`` builds them by default, on ``threads``
    torch threads: for the studies that rerun single retrieval cases (``restored_rows``,
    ``group_capacity``). Returns (model, tokenizer, haystack)."""
    import torch

    from focus_lab.data import load_corpus
    from focus_lab.eval.passkey import load_haystack
    from focus_lab.hf.models import load_model
    from focus_lab.hf.retrofit import load_routers
    from focus_lab.hf.shipped import resolve_routers
    torch.set_num_threads(threads)
    model, tok = load_model(None)
    load_routers(model, resolve_routers(routers, None))
    return model, tok, load_haystack(load_corpus("austen").heldout, tok, name="persuasion")


def pending_windows(args, tok, suffix: str = ""):
    """Yield (corpus, window, cell path) for each held-out window of ``args.corpora`` (the first
    ``args.windows`` of ``args.seq_len`` tokens per corpus) whose cell
    ``<args.out>/cells/<corpus>_<seq_len>_<index><suffix>.parquet`` is not written yet: a
    study resumes where it stopped."""
    from focus_lab.data import load_corpus, make_windows
    cells = args.out / "cells"
    cells.mkdir(parents=True, exist_ok=True)
    for corpus in args.corpora.split(","):
        for w in make_windows(load_corpus(corpus).heldout, tok, args.seq_len, max_windows=args.windows):
            path = cells / f"{corpus}_{args.seq_len}_{w.index}{suffix}.parquet"
            if not path.is_file():
                yield corpus, w, path

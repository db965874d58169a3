"""docs/studies/copies-by-layer.md: the share of the distant induction pairs (copies) and of all
distant pairs each layer's own mask keeps (``analyses.studies.copy_pairs``'s per-layer rows,
figures/results/copy_pairs_layers.parquet), for the shipped file and the 90-step key-shift file
``E``, hard top-1 and top-2, one held-out window of 4096 tokens per domain."""

from __future__ import annotations

import pandas as pd

from analyses.doc_blocks import LENGTH_CELLS, REPO, Generated, MissingInput, block, router_label

PAGE = "docs/studies/copies-by-layer.md"
PROSE_PAGES = (PAGE,)
ALLOWED = {PAGE: set()}

LAYERS = "figures/results/copy_pairs_layers.parquet"
RANDOM_LAYERS = range(1, 10)  # balanced random groups in both files
DOMAINS = {"austen": "*Persuasion*", "man-pages": "man pages", "debian-reference": "Debian Reference",
           "python-docs": "Python docs"}
#: per file (its sha256's first 8 hex digits): its name on the page and, per pattern, the committed
#: length table whose rows carry the per-layer k that file runs the pattern with
FILES = {"5710775e": ("shipped", {"hard_top1": ("shipped", "hard_top1"), "hard_top2": ("shipped", "hard_top2")}),
         "adea43ed": ("`E`, with the shift", {"hard_top1": ("keyshift90_domains", "hard_top1_keyshift"),
                                              "hard_top2": ("keyshift90_domains", "hard_top2_keyshift")})}


def _rows() -> pd.DataFrame:
    df = pd.read_parquet(REPO / LAYERS)
    df["file"] = df.routers_sha256.str[:8]
    missing = set(FILES) - set(df.file)
    if missing:
        raise MissingInput(f"{LAYERS} (routers {', '.join(sorted(missing))})")
    return df


def _k(cells: pd.DataFrame, table: str, label: str, base: int) -> dict[int, int]:
    """{layer: k} of a pattern: the layer top-k its committed rows record, ``base`` elsewhere."""
    from focus_lab.method.config import parse_layer_top_k
    g = cells[(cells["table"] == table) & (cells.label == label)]
    specs = set(g.layer_top_k.astype(str))
    if len(specs) != 1:
        raise MissingInput(f"{LENGTH_CELLS} (table {table}: one layer top-k for {label}, found {sorted(specs)})")
    spec = specs.pop()
    return {layer: parse_layer_top_k(spec).get(layer, base) if spec else base for layer in range(30)}


def _budgets() -> dict[tuple[str, str], dict[int, int]]:
    from analyses.length_table import committed_cells
    cells = committed_cells(REPO / LENGTH_CELLS)
    return {(f, p): _k(cells, t, label, int(p[-1])) for f, (_, pats) in FILES.items() for p, (t, label) in pats.items()}


def _routed(g: pd.DataFrame, k: dict[int, int]) -> pd.DataFrame:
    """The layers that route: not a random layer, k >= 1."""
    return g[~g.layer_idx.isin(RANDOM_LAYERS) & g.layer_idx.map(lambda i: k[i] >= 1)]


def _inputs(df: pd.DataFrame) -> str:
    r = df.iloc[0]
    return (f"{LAYERS}; " + "; ".join(f"{name}: {router_label(df.loc[df.file == f, 'routers_sha256'].iloc[0])}"
                                      for f, (name, _) in FILES.items())
            + f"; window {int(r.window)} of {int(r.seq_len)} tokens of each of " + ", ".join(DOMAINS)
            + "; patterns hard_top1, hard_top2 (each file's own per-layer k, from its length table's rows), no extra pairs")


@block("copies-by-layer", LAYERS, LENGTH_CELLS)
def copies_by_layer() -> Generated:
    """Per file, pattern and domain: the means over the routed layers (not 1-9, k >= 1) of the
    copies kept and the distant pairs kept, and their ratio."""
    df, ks = _rows(), _budgets()
    lines = ["| routers | pattern | " + " | ".join(DOMAINS.values()) + " |", "|---|---|" + "---|" * len(DOMAINS)]
    for f, (name, pats) in FILES.items():
        for p in pats:
            cells = []
            for d in DOMAINS:
                g = _routed(df[(df.file == f) & (df.pattern == p) & (df.corpus == d)], ks[(f, p)])
                if not len(g):
                    raise MissingInput(f"{LAYERS} ({f} {p} on {d})")
                c, a = g.copies_kept.mean(), g.pairs_kept.mean()
                cells.append(f"{c:.2f} / {a:.2f} ({c / a:.1f}x)")
            lines.append(f"| {name} | top-{p[-1]} | " + " | ".join(cells) + " |")
    return Generated(_inputs(df), "\n".join(lines))


@block("copies-by-layer-layers", LAYERS, LENGTH_CELLS)
def copies_by_layer_layers() -> Generated:
    """Per layer: the copies kept by each file and pattern, lowest-highest over the four domains'
    windows (``k = 0``: the layer keeps only the window and sinks)."""
    df, ks = _rows(), _budgets()
    cols = [(f, p) for f, (_, pats) in FILES.items() for p in pats]
    lines = ["| layer | " + " | ".join(f"{FILES[f][0]}, top-{p[-1]}" for f, p in cols) + " |",
             "|---:|" + "---:|" * len(cols)]
    for layer in range(int(df.layer_idx.max()) + 1):
        cells = []
        for f, p in cols:
            g = df[(df.file == f) & (df.pattern == p) & (df.layer_idx == layer)]
            if ks[(f, p)][layer] == 0:
                cells.append("k = 0")
            else:
                cells.append(f"{g.copies_kept.min():.2f}-{g.copies_kept.max():.2f}")
        label = f"{layer} (random groups)" if layer in RANDOM_LAYERS else str(layer)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return Generated(_inputs(df), "\n".join(lines))

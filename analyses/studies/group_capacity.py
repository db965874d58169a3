"""The group capacity study's tables (docs/studies/group-capacity.md): hard top-2 with the cap
(``hard_top2_cap``, ``FocusConfig.group_capacity`` = 0.5, docs/method.md §2.9) against the shipped
hard top-2, on the retrieval suite and on perplexity, from the committed data.

    python -m analyses.studies.group_capacity
    python -m analyses.studies.group_capacity --layers     # per layer, one case per task (a model forward each)
    python -m analyses.studies.group_capacity --sweep      # the capacities 0.5-0.8 on technical text
    python -m analyses.studies.group_capacity --by-layer   # the cap in some layers only
    python -m analyses.studies.group_capacity --evict      # the keys over the cap evicted, layer 0 left out
    python -m analyses.studies.group_capacity --leave-one-out hard_top2_cap@0+13+15-16+21+24-25+28-29  # which layer
    python -m analyses.studies.group_capacity --save-capacity OUT [--routers FILE]   # E7 into a router file
    python -m analyses.studies.group_capacity --layers --tasks niah_single_1 \
        --patterns hard_top2_nocap,hard_top2_cap,hard_top2_cap60,hard_top2_cap70,hard_top2_cap80   # ... and their pairs
    python -m analyses.studies.group_capacity --layers ... --save figures/group-capacity/layers.parquet
    python -m analyses.studies.group_capacity --leave-one-out ... --save figures/group-capacity/leave_one_out.parquet

Retrieval (``figures/results/retrieval_cases.parquet``): per task and length where both patterns
ran, dense's score, each pattern's score relative to dense with the paired 95% interval over cases
and its distant pairs kept, then the cap minus hard top-2 in answer log-prob (nats), paired over
cases. Perplexity (``figures/results/length_cells.parquet``, table ``capacity``): per corpus and
length, each pattern's change over dense (%), the cap's paired change over hard top-2 with its
95% bootstrap interval over windows (> 0: the cap is worse), distant pairs kept and the largest
group's share of the keys (mean over layers and windows). The sweep (tables ``capacity`` and
``capacity_sweep``): per corpus, each capacity's paired change over hard top-2 (%, 95% interval).

``--save PATH`` keeps what ``--layers`` or ``--leave-one-out`` print as tidy rows (``SAVED_COLUMNS``:
``schema_version``, the router file's name and sha256, the input, the pattern, the per-layer or
per-case quantities, the code's commit) in the parquet ``PATH``, merged by ``SAVED_KEYS`` into the
rows already there (a rerun of a row replaces it; other rows stay) and written atomically, so that
several invocations build one table (docs/studies/group-capacity-layers.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from analyses.bench_attention import to_markdown

PATTERNS = ("hard_top2", "hard_top2_cap")
SWEEP = ("hard_top2_cap", "hard_top2_cap60", "hard_top2_cap70", "hard_top2_cap80")  # c = 0.5 .. 0.8
SWEEP_TABLES = ("capacity", "capacity_sweep")
LAYER_TABLE = "capacity_layers"  # the per-layer caps' length cells
# c = 0.5 in one layer or a few (a layer diagnosis on the man pages and Debian Reference), and at 0.7 in layer 14
LAYER_PROBES = ("hard_top2_cap@14", "hard_top2_cap70@14", "hard_top2_cap@15", "hard_top2_cap@18", "hard_top2_cap@20",
                "hard_top2_cap@24", "hard_top2_cap@29", "hard_top2_cap@0+13+16+21+25+28")
# the layer sets tried in full: the layers niah_single_1's noise sentences collapse in, then those
# without layer 14 (which costs technical text) and with 24 and 29 (which do not)
LAYER_SETS = ("hard_top2_cap@0+13-16+21+25+28", "hard_top2_cap@0+13+15-16+21+24-25+28-29")
# the last set without layer 0 (whose cap costs the needles), its keys over the capacity in no group
EVICT_SET = "hard_top2_evict@13+15-16+21+24-25+28-29"
EVICT_TABLE = "capacity_evict"  # its length cells
EVICT_LAYER_PROBES = tuple(f"hard_top2_evict@{l}" for l in (13, 15, 16, 21, 24, 25, 28, 29))  # one layer each
EVICT_LAYER_TABLE = "capacity_evict_layers"
EVICT_SET_7 = "hard_top2_evict@13+15-16+21+25+28-29"  # E without layer 24, which carries its technical cost
EVICT_TABLES = {EVICT_SET: EVICT_TABLE, EVICT_SET_7: "capacity_evict7"}
# the shipped file carries E7 for top-2 (``--save-capacity``), so the committed retrieval tables
# name the rows of this study's patterns as they run under it: "hard top-2" here is the
# previous default (``_nocap``), E7 is the plain name (``retrieval_table --rename``). The length
# cells keep the names they were made with: their router file is in each row.
NOCAP = "hard_top2_nocap"  # the study's baseline, hard top-2 without any capacity, whatever the file carries
RETRIEVAL_LABELS = {"hard_top2": NOCAP, "hard_top2_match": "hard_top2_match_nocap",
                    EVICT_SET_7: "hard_top2"}
# what ``--layers`` runs by default with the shipped file: hard top-2 without its capacity (the
# study's "hard top-2") against the cap everywhere
LAYER_PATTERNS = (NOCAP, "hard_top2_cap")

SCHEMA_VERSION = 1  # of the rows ``--save`` writes
#: the rows' columns per mode, ``schema_version`` first; ``moved_from``: the pattern ``moved``
#: compares with (the invocation's first); ``variant``: the pattern, "hard_top2_nocap" or "without L"
SAVED_COLUMNS = {
    "layers": ["schema_version", "routers", "routers_sha256", "input", "length", "seed", "pattern", "moved_from",
               "layer_idx", "k", "assignment", "pairs", "largest_group", "moved", "commit"],
    "leave_one_out": ["schema_version", "routers", "routers_sha256", "task", "length", "seed", "pattern", "variant",
                      "answer_logprob", "commit"],
}
#: what names a row: a row saved again under the same key replaces the old one
SAVED_KEYS = {"layers": ["routers_sha256", "input", "length", "seed", "pattern", "moved_from", "layer_idx"],
              "leave_one_out": ["routers_sha256", "task", "length", "seed", "pattern", "variant"]}


def retrieval_rows(cases: pd.DataFrame, patterns=PATTERNS) -> pd.DataFrame:
    """One row per (task, length) holding both ``patterns`` (hard top-2, a cap): dense score,
    cases, each pattern's score relative to dense (ratio [lo, hi]) and distant pairs kept, and
    the cap's answer log-prob minus hard top-2's, paired over cases (nats, [lo, hi])."""
    from focus_lab.eval.retrieval_tables import paired_difference, summary
    if NOCAP in set(cases.pattern):  # the committed tables, renamed: their labels back to the study's
        label = {p: RETRIEVAL_LABELS.get(p, p) for p in patterns}
        cases = cases[cases.pattern.isin(["dense", *label.values()])]
        cases = cases.assign(pattern=cases.pattern.map({v: k for k, v in label.items()} | {"dense": "dense"}))
    a, b = patterns
    have = cases.groupby(["task", "length", "seed"]).pattern.agg(set)
    keep = have[have.map(lambda s: {"dense", a, b} <= s)].index
    c = cases.set_index(["task", "length", "seed"]).loc[keep].reset_index()
    c = c[c.pattern.isin(["dense", a, b])]
    s = summary(c).set_index(["task", "length", "pattern"])
    lp = paired_difference(c, b, a, "answer_logprob").set_index(["task", "length"])
    rows = []
    for (task, L), g in c.groupby(["task", "length"], sort=True):
        d = s.loc[(task, L, "dense")]
        row = {"task": task, "tokens": L, "cases": int(d.cases), "dense score": d.score}
        for p in patterns:
            r = s.loc[(task, L, p)]
            row[f"{p} vs dense"] = f"{r.relative:.2f} [{r.relative_lo:.2f}, {r.relative_hi:.2f}]"
            row[f"{p} pairs"] = r.distant_pairs_kept
        m = lp.loc[(task, L)]
        row["cap - hard_top2 (nats)"] = f"{m.difference:+.2f} [{m.lo:+.2f}, {m.hi:+.2f}]"
        rows.append(row)
    return pd.DataFrame(rows)


def cells_with(cells: pd.DataFrame, labels):
    """Yield (corpus, seq_len, its cells) for each (corpus, seq_len) of the length cells whose
    rows hold every pattern of ``labels``; a window's duplicate rows (tables sharing their dense
    and hard top-2 windows) dropped."""
    cells = cells.drop_duplicates(["corpus", "seq_len", "window", "label"])
    for (corpus, L), g in cells.groupby(["corpus", "seq_len"], sort=True):
        if set(labels) <= set(g.label):
            yield corpus, L, g


def change_over(cells: pd.DataFrame, a: str, b: str) -> str:
    """Pattern ``a``'s paired perplexity change over ``b`` on ``cells``' windows, written
    ``+m [+lo, +hi]`` (%, 95% interval; ``length_table.paired_delta``)."""
    from analyses.length_table import paired_delta
    m, lo, hi = paired_delta(cells, a, b)
    return f"{m:+.2f} [{lo:+.2f}, {hi:+.2f}]"


def perplexity_rows(cells: pd.DataFrame, patterns=PATTERNS) -> pd.DataFrame:
    """One row per (corpus, seq_len) of the length cells holding dense and both ``patterns``
    (hard top-2, a cap)."""
    from analyses.length_table import paired_delta
    rows = []
    for corpus, L, g in cells_with(cells, ("dense", *patterns)):
        ppl = {p: g[g.label == p] for p in ("dense", *patterns)}
        row = {"corpus": corpus, "tokens": L, "windows": g[g.label == patterns[1]].window.nunique()}
        for p in patterns:
            row[f"{p} vs dense %"] = paired_delta(g, p, "dense")[0]
        row["cap - hard_top2 (%)"] = change_over(g, patterns[1], patterns[0])
        for p in patterns:
            row[f"{p} pairs"] = ppl[p].distant_pairs_kept.mean()
            row[f"{p} largest group"] = ppl[p].max_group_share.mean()
        rows.append(row)
    return pd.DataFrame(rows)


def sweep_rows(cells: pd.DataFrame, patterns=SWEEP) -> pd.DataFrame:
    """One row per (corpus, seq_len) holding hard top-2 and every pattern of ``patterns`` (the
    cells of ``SWEEP_TABLES`` together, a window's duplicate rows dropped): windows, hard top-2's
    change over dense (%), and each pattern's paired change over hard top-2 (%, [lo, hi]; > 0:
    the cap is worse)."""
    from analyses.length_table import paired_delta
    rows = []
    for corpus, L, g in cells_with(cells, ("dense", "hard_top2", *patterns)):
        row = {"corpus": corpus, "tokens": L, "windows": g[g.label == "hard_top2"].window.nunique(),
               "hard_top2 vs dense %": paired_delta(g, "hard_top2", "dense")[0]}
        for p in patterns:
            row[f"{p} - hard_top2 (%)"] = change_over(g, p, "hard_top2")
        rows.append(row)
    return pd.DataFrame(rows)


def over_hard_top2(cells: pd.DataFrame, patterns=LAYER_PROBES) -> pd.DataFrame:
    """One row per pattern of ``patterns``, one column per corpus (at its length) where the
    cells hold both it and hard top-2: the pattern's paired perplexity change over hard top-2
    (``change_over``: %, 95% interval over windows; > 0: the cap is worse)."""
    return pd.DataFrame([{"pattern": p, **{f"{corpus} {L}": change_over(g, p, "hard_top2")
                                           for corpus, L, g in cells_with(cells, ("hard_top2", p))}}
                         for p in patterns])


def layer_rows(tasks=("niah_single_1", "passkey"), length: int = 4096, seed: int = 0,
               patterns=LAYER_PATTERNS, threads: int = 2, late: int = 1024, routers=None) -> pd.DataFrame:
    """Per routed layer, one forward of each input under each pattern with the shipped routers:
    the layer's k, the distant pairs its groups keep (``core.distant_pairs_kept``), the largest
    group's share of the keys, and ``moved``: the share of the keys at positions >= ``late``
    whose group differs from the first pattern's (the keys a capacity moves), read at the
    ``attn_out`` hook point. An input is a task's case (seed ``seed``, ``length`` tokens) or
    ``CORPUS:INDEX``, that held-out window of ``length`` tokens (``data.make_windows``). About
    20 s a forward on 2 CPU cores at 4096 tokens. ``routers``: a router file (default: the shipped
    one). Columns: ``input`` (the task or ``CORPUS:INDEX``), ``length``, ``seed``, ``pattern``,
    ``moved_from`` (the first pattern), ``layer_idx``, ``k``, ``assignment``, ``pairs``,
    ``largest_group``, ``moved``."""
    import torch
    from analyses.studies import retrieval_setup
    from focus_lab.data import load_corpus, make_windows
    from focus_lab.eval import retrieval as rt
    from focus_lab.patterns.legacy import legacy_changes as pattern_changes
    from focus_lab.hf.hooks import hooks
    from focus_lab.hf.retrofit import forward_state
    from focus_lab.method.core import distant_pairs_kept, hard_group_shares
    model, tok, hay = retrieval_setup(routers, threads=threads)
    num_groups = forward_state(model).config.num_groups
    rows = []
    for task in tasks:
        if ":" in task:
            corpus, index = task.split(":")
            wins = {w.index: w for w in make_windows(load_corpus(corpus).heldout, tok, length)}
            if not index.isdigit() or int(index) not in wins:
                raise SystemExit(f"--tasks {task}: {corpus}'s held-out text has windows 0..{max(wins)} "
                                 f"of {length} tokens")
            ids = torch.as_tensor(wins[int(index)].input_ids)  # (T,)
        else:
            ids = rt.make_case(rt.parse_tasks(task)[0], hay, tok, length, seed).input_ids  # (T,)
        first = {}  # {layer_idx: (T,) the first pattern's key groups}
        for pattern in patterns:
            state = forward_state(model, cache=False, **pattern_changes(pattern, num_groups))

            def seen(out, hook) -> None:
                r, cfg = hook.call.routing, state.config
                if r is None:
                    return
                kg = r.key_group[0]  # (T,)
                ref = first.setdefault(hook.layer_idx, kg.clone())
                rows.append({"input": task, "length": length, "seed": None if ":" in task else seed,
                             "pattern": pattern, "moved_from": patterns[0], "layer_idx": hook.layer_idx,
                             "k": cfg.top_k_at(hook.layer_idx), "assignment": cfg.assignment_at(hook.layer_idx),
                             "pairs": distant_pairs_kept(r.query_groups, r.key_group, cfg.window, cfg.sink_tokens),
                             "largest_group": float(hard_group_shares(kg, num_groups).max()),
                             "moved": float((kg[late:] != ref[late:]).float().mean())})

            with torch.no_grad(), hooks(model, {"attn_out": seen}):
                model(ids[None], focus=state)
    return pd.DataFrame(rows)


def leave_one_out_rows(pattern: str, task: str = "niah_single_1", length: int = 8192, seeds=(6, 19),
                       threads: int = 2, routers=None, without=None, skip=frozenset()) -> pd.DataFrame:
    """Which capped layer costs the needle: per case, the answer's teacher-forced log-prob (nats,
    summed over the answer's value tokens, as ``retrieval.run_case`` scores it) under hard top-2,
    under ``pattern`` (a cap with ``@LAYERS``) and under ``pattern`` without each of its layers in
    turn (``variant``: "hard_top2_nocap", the pattern, "without L" for layer L). One forward of prompt +
    answer per row, no KV cache: about 40 s at 8192 tokens on 2 CPU cores. ``routers``: a router
    file (default: the shipped one); ``without``: the layers to leave out in turn (default: each of
    the pattern's); ``skip``: the (seed, variant) pairs not to run (rows saved already). Columns:
    ``task``, ``length``, ``seed``, ``pattern``, ``variant``, ``answer_logprob``."""
    import torch
    from analyses.studies import retrieval_setup
    from focus_lab.eval import retrieval as rt
    from focus_lab.patterns.legacy import legacy_changes as pattern_changes
    from focus_lab.hf.retrofit import forward_state
    model, tok, hay = retrieval_setup(routers, threads=threads)
    num_groups = forward_state(model).config.num_groups
    changes = pattern_changes(pattern, num_groups)
    layers = changes.get("capacity_layers")
    if not layers:
        raise SystemExit(f"--leave-one-out {pattern}: name the capped layers, e.g. hard_top2_cap@0+13+15")
    variants = [(NOCAP, pattern_changes(NOCAP, num_groups)), (pattern, changes)]
    if without is not None and set(without) - set(layers):
        raise SystemExit(f"--without {sorted(set(without) - set(layers))}: not among {pattern}'s layers {layers}")
    variants += [(f"without {l}", {**changes, "capacity_layers": [x for x in layers if x != l]})
                 for l in layers if without is None or l in without]
    rows = []
    for seed in seeds:
        case = rt.make_case(rt.parse_tasks(task)[0], hay, tok, length, seed)
        n = len(case.answer_ids)
        ids = torch.cat([case.input_ids, case.answer_ids])[None]  # (1, P + n)
        for variant, ch in variants:
            if (seed, variant) in skip:
                continue
            with torch.no_grad():
                logits = model(input_ids=ids, use_cache=False, focus=forward_state(model, **ch),
                               logits_to_keep=n + 1).logits[0, :-1]  # (n, V)
            rows.append({"task": task, "length": length, "seed": seed, "pattern": pattern, "variant": variant,
                         "answer_logprob": rt.answer_logprob(logits, case)})
    return pd.DataFrame(rows)


def save_rows(path, rows: pd.DataFrame, mode: str, routers=None, commit: str | None = None) -> pd.DataFrame:
    """Merge the rows of ``layer_rows`` (``mode`` "layers") or ``leave_one_out_rows``
    ("leave_one_out") into the parquet ``path``: each row gets ``schema_version``, the router file
    it ran with (``routers``, default the shipped one: its manifest name, else its file name, and
    its sha256) and the code's commit (``commit``: read when the run started; default now); rows of
    ``path`` with the same ``SAVED_KEYS`` are replaced, the others kept. Written atomically
    (``io.write_parquet``). Returns the whole table."""
    from focus_lab.hf.shipped import code_commit, named_file, resolve_routers
    from focus_lab.io import file_sha256, write_parquet
    f = resolve_routers(routers)
    sha = file_sha256(f)
    new = rows.assign(schema_version=SCHEMA_VERSION, routers=named_file(sha) or Path(f).name, routers_sha256=sha,
                      commit=commit or code_commit())[SAVED_COLUMNS[mode]]
    new["seed"] = new["seed"].astype("Int64")  # none for a held-out window
    path, key = Path(path), SAVED_KEYS[mode]
    if path.is_file():
        old = pd.read_parquet(path)
        if list(old.columns) != SAVED_COLUMNS[mode]:
            raise SystemExit(f"--save {path}: its columns are not those of --{mode.replace('_', '-')} rows "
                             f"({', '.join(SAVED_COLUMNS[mode])}); give another path")
        ours = pd.MultiIndex.from_frame(new[key].astype(str))
        old = old[~pd.MultiIndex.from_frame(old[key].astype(str)).isin(ours)]
        new = pd.concat([old, new], ignore_index=True)
    write_parquet(path, new)
    print(f"{len(rows)} rows merged into {path} ({len(new)} rows)")
    return new


def layer_means(rows: pd.DataFrame) -> pd.DataFrame:
    """The saved ``--layers`` rows (``save_rows``) as one row per router file, input, length, seed
    and pattern: the distant pairs kept and the largest group's share, each the mean over the
    layers the forward routed (a pattern run in several invocations counted once: its pairs do not
    depend on ``moved_from``)."""
    key = ["routers", "routers_sha256", "input", "length", "seed", "pattern"]
    one = rows.drop_duplicates([*key, "layer_idx"])
    return (one.groupby(key, dropna=False, sort=False)
            .agg(layers=("layer_idx", "nunique"), pairs=("pairs", "mean"), largest_group=("largest_group", "mean"))
            .reset_index())


def save_capacity(routers, out, pattern: str = EVICT_SET_7, top_k: int = 2):
    """Write ``routers`` (default: the shipped file) again to ``out`` (atomically), tensors,
    budget and extra unchanged, with ``pattern``'s group capacity (``FocusConfig.group_capacity``,
    ``capacity_layers``, ``capacity_overflow``; default E7) in force for ``top_k`` only
    (``capacity_top_k``, docs/method.md §2.9). Returns ``out``."""
    from focus_lab.patterns.legacy import split_legacy as split_suffixes
    from focus_lab.hf.retrofit import read_router_file, write_router_file
    from focus_lab.hf.shipped import resolve_routers
    cfg, base, tensors, extra = read_router_file(resolve_routers(routers))
    _, changes = split_suffixes(pattern)
    if not changes.get("group_capacity"):
        raise SystemExit(f"{pattern!r} sets no group capacity: give a pattern ending in _cap or _evict")
    return write_router_file(out, tensors, cfg.replace(**{**changes, "capacity_top_k": [top_k]}), base, extra or None)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="figures/results/retrieval_cases.parquet")
    ap.add_argument("--cells", default="figures/results/length_cells.parquet")
    ap.add_argument("--table", default="capacity", help="the length cells' table")
    ap.add_argument("--layers", action="store_true", help="per routed layer, one case per task (runs the model)")
    ap.add_argument("--tasks", default="niah_single_1,passkey",
                    help="with --layers: tasks, or CORPUS:INDEX for a held-out window (man-pages:167)")
    ap.add_argument("--patterns", default=",".join(LAYER_PATTERNS), help="with --layers")
    ap.add_argument("--sweep", action="store_true", help="each capacity of SWEEP against hard top-2, perplexity")
    ap.add_argument("--by-layer", action="store_true",
                    help="the cap in some layers only: LAYER_PROBES and LAYER_SETS against hard top-2")
    ap.add_argument("--evict", action="store_true", help="EVICT_SET against hard top-2: retrieval and perplexity")
    ap.add_argument("--leave-one-out", metavar="PATTERN",
                    help="a cap with @LAYERS: the answer's log-prob with each layer left out in turn")
    ap.add_argument("--length", type=int, default=8192, help="with --leave-one-out: tokens")
    ap.add_argument("--seeds", default="6,19", help="with --leave-one-out: case seeds")
    ap.add_argument("--save-capacity", metavar="OUT", default=None,
                    help="write --routers (default: the shipped file) to OUT with E7's capacity for top-2 (the shipped file's)")
    ap.add_argument("--routers", default=None,
                    help="the router file (default: the shipped one): to start from with --save-capacity, "
                         "to run with --layers and --leave-one-out")
    ap.add_argument("--without", default=None, help="with --leave-one-out: only these layers left out (0,13)")
    ap.add_argument("--resume", action="store_true",
                    help="with --leave-one-out and --save: skip the rows PATH holds already (same file, case, pattern)")
    ap.add_argument("--save", metavar="PATH", default=None,
                    help="with --layers or --leave-one-out: merge the rows into the parquet PATH "
                         "(figures/group-capacity/layers.parquet, .../leave_one_out.parquet)")
    a = ap.parse_args(argv)
    if a.save:  # the code that runs: read before a long run, not after it
        from focus_lab.hf.shipped import code_commit
        commit = code_commit()
    if a.save_capacity:
        print(save_capacity(a.routers, a.save_capacity))
        return
    if a.leave_one_out:
        task, skip = a.tasks.split(",")[0], set()
        if a.resume and a.save and Path(a.save).is_file():
            from focus_lab.hf.shipped import resolve_routers
            from focus_lab.io import file_sha256
            old = pd.read_parquet(a.save)
            old = old[(old.routers_sha256 == file_sha256(resolve_routers(a.routers))) & (old.task == task)
                      & (old.length == a.length) & (old.pattern == a.leave_one_out)]
            skip = set(zip(old.seed, old.variant))
        d = leave_one_out_rows(a.leave_one_out, task, a.length,
                               tuple(int(x) for x in a.seeds.split(",")), routers=a.routers,
                               without=None if a.without is None else [int(x) for x in a.without.split(",")], skip=skip)
        if not len(d):
            print("every row is saved already")
            return
        if a.save:
            save_rows(a.save, d, "leave_one_out", a.routers, commit)
        w = d.pivot_table(index="variant", columns="seed", values="answer_logprob", sort=False)
        print(w.round(2).to_string())
        return
    if a.by_layer or a.evict:
        every = pd.read_parquet(a.cells)
        probes, table, sets = ((EVICT_LAYER_PROBES, EVICT_LAYER_TABLE, EVICT_TABLES) if a.evict
                               else (LAYER_PROBES, LAYER_TABLE, dict.fromkeys(LAYER_SETS, LAYER_TABLE)))
        p = over_hard_top2(every[every.table == table], probes)
        print(to_markdown(p, list(p.columns), {}))
        cases = pd.read_parquet(a.cases)
        for pattern, table in sets.items():
            cells = every[every.table == table]
            print(f"\n{pattern}\n")
            r = retrieval_rows(cases, ("hard_top2", pattern))
            print(to_markdown(r, list(r.columns), {c: "{:.2f}" for c in r.columns if c.endswith("pairs") or c == "dense score"}))
            q = perplexity_rows(cells, ("hard_top2", pattern))
            print()
            print(to_markdown(q, list(q.columns), {c: ("{:+.2f}" if c.endswith("%") else "{:.2f}")
                                                    for c in q.columns if c.endswith(("%", "pairs", "group"))}))
        return
    if a.sweep:
        cells = pd.read_parquet(a.cells)
        p = sweep_rows(cells[cells.table.isin(SWEEP_TABLES)])
        print(to_markdown(p, list(p.columns), {"hard_top2 vs dense %": "{:+.2f}"}))
        return
    if a.layers:
        d = layer_rows(tuple(a.tasks.split(",")), patterns=tuple(a.patterns.split(",")), routers=a.routers)
        w = d.pivot_table(index=["layer_idx", "k", "assignment"], columns=["input", "pattern"],
                          values=["pairs", "largest_group", "moved"]).round(2)
        print(w.to_string())
        print(d.groupby(["input", "pattern"])[["pairs", "largest_group"]].mean().round(3).to_string())
        if a.save:
            save_rows(a.save, d, "layers", a.routers, commit)
        return
    r = retrieval_rows(pd.read_parquet(a.cases))
    print(to_markdown(r, list(r.columns), {c: "{:.2f}" for c in r.columns if c.endswith("pairs") or c == "dense score"}))
    cells = pd.read_parquet(a.cells)
    p = perplexity_rows(cells[cells.table == a.table])
    if len(p):
        print()
        print(to_markdown(p, list(p.columns), {c: ("{:+.2f}" if c.endswith("%") else "{:.2f}")
                                                for c in p.columns if c.endswith(("%", "pairs", "group"))}))


if __name__ == "__main__":
    main()

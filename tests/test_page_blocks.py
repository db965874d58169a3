"""The generated blocks of recipes.md (stage table), passkey_reference.md (prompt formats),
reliability.md (recorder memory), studies/gemma-long-context-bounds.md (forward and training-step
costs), run_schema.md (the recorder's overhead), studies/secondary-sinks.md (the recorded
tables) and studies/group-capacity.md / group-capacity-layers.md (the one-forward probes): cells of
each recomputed by hand from the committed data."""

from __future__ import annotations

import json
import re

import pandas as pd
from by_hand import on_page, table_row

from analyses import doc_blocks
from analyses.doc_blocks import REPO


_row = doc_blocks.table_row  # the cells of a block's row, by its leading cells


def test_recipe_stages_total_and_a_stage_from_the_chain_record():
    rec = json.loads((REPO / "figures/results/smollm2_chain.json").read_text())
    total = sum(s["seconds"] for s in rec["stages"].values())
    text = doc_blocks.render("recipe-stages")
    assert f"**{total:.0f} s = {total / 60:.1f} min**" in _row(text, "**all**")[2]
    s7 = rec["stages"]["s7_needle_mix_seed0"]
    row = _row(text, "7. the needle mix")
    assert row[2] == f"{s7['seconds']:.0f}" and row[3] == f"{s7['peak_rss_gb']:.2f} GiB"
    assert "<out>/s5_budget.safetensors" in row[1] and "checkpoints/" not in row[1]
    assert f"within {rec['against_reference']['max_abs_diff']:.1e}" in text


def test_passkey_formats_counts_the_committed_cases_by_hand():
    df = pd.read_parquet(REPO / "figures/results/passkey_cases.parquet")
    chat = df[(df.table == "prompt_formats_1k_2k") & (df.format == "chat") & (df.length == 2048)]
    assert len(chat) == 9  # 3 keys x 3 depths
    row = _row(doc_blocks.render("passkey-formats"), "`chat`")
    assert row[3] == f"{int(chat.exact_match.sum())}/9"
    assert row[5].strip("*") == f"{chat.key_logprob.mean():.2f}"


def test_record_memory_error_recomputed_from_a_row():
    df = pd.read_parquet(REPO / "figures/results/record_memory.parquet")
    r = df.iloc[0]
    text = doc_blocks.render("record-memory")
    line = next(l for l in text.splitlines() if l.startswith(f"| {r.label}:"))
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    assert cells[1] == f"{r.estimate_gib:.2f} GiB" and cells[2] == f"{r.measured_gib:.2f} GiB"
    assert cells[3] == f"{100 * (r.estimate_gib / r.measured_gib - 1):+.0f}%"
    assert "--out" not in cells[0]
    phases = {c[len("phase_"):-len("_gib")]: r[c] for c in df.columns if re.fullmatch(r"phase_.+_gib", c)}
    assert cells[4] == max(phases, key=lambda k: phases[k] if pd.notna(phases[k]) else -1)


def _csv(rel: str) -> list[dict]:
    import csv
    with open(REPO / rel, newline="") as f:
        return list(csv.DictReader(f))


def test_gemma_bounds_forward_cells_from_the_bench_rows_by_hand():
    rows = _csv("figures/gemma/bench_length.csv")
    cell = {(int(r["T"]), r["pattern"]): r for r in rows}
    text = doc_blocks.render("gemma-bounds-forward")
    assert "gemma-bounds-forward" in {f.name for f in doc_blocks.find_blocks(
        (REPO / "docs/studies/gemma-long-context-bounds.md").read_text())}
    d, t1 = cell[(8192, "dense")], cell[(8192, "hard_top1")]
    row = [c.strip() for c in next(l for l in text.splitlines() if l.startswith("| 8192 | `hard_top1` |")).strip("|").split("|")]
    assert row[5] == f"{float(d['total_s']) / float(t1['total_s']):.2f}x"
    assert row[6] == f"{100 * float(t1['global_layers_s']) / float(t1['body_s']):.0f}% ({float(t1['global_layers_s']):.0f} s)"
    assert row[8] == f"{float(t1['body_peak_gib']) - float(t1['rss_loaded_gib']):.1f}"
    # the dense forward by part at 32768: the 15 sliding layers are the decoder layers less the 3 global ones
    d32 = cell[(32768, "dense")]
    sliding = float(d32["layers_s"]) - float(d32["global_layers_s"])
    part = [c.strip() for c in next(l for l in text.splitlines() if l.startswith("| 32768 |") and "each" in l).strip("|").split("|")]
    assert part[1] == f"{sliding:.1f} ({100 * sliding / float(d32['body_s']):.0f}%, {sliding / 15:.1f} each)"
    total = float(d32["total_s"])
    assert part[-1] == f"{total / (total - float(d32['global_layers_s'])):.2f}x"
    # the cell that did not finish: its recorded status and peak, no seconds
    stopped = cell[(32768, "hard_top1")]
    assert stopped["status"] != "ok" and not stopped["body_s"]
    assert stopped["status"].rstrip(".") in text
    line = next(l for l in text.splitlines() if l.startswith("| 32768 | `hard_top1` |"))
    assert f"| {float(stopped['peak_rss_gib']):.1f} |" in line and "did not finish" in line


def test_gemma_bounds_train_cells_from_the_step_rows_by_hand():
    rows = _csv("figures/gemma/train_step_cost.csv")

    def steps(model, stage, L):
        return [float(r["step_seconds"]) for r in rows if r["model"] == model and r["stage"] == stage and int(r["seq_len"]) == L]
    g = steps("gemma3-270m", "s2_distill64", 4096)
    s = steps("smollm2-135m-instruct", "s2_distill64", 4096)
    assert len(g) == 3 and len(s) == 3
    text = doc_blocks.render("gemma-bounds-train")
    row = next(l for l in text.splitlines() if l.startswith("| Gemma-3-270M | 2 (`distill64`) | 4096 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3] == f"{sum(g) / 3:.1f} ({', '.join(f'{x:.1f}' for x in g)})"
    assert cells[5] == f"{(sum(g) / 3) / (sum(s) / 3):.2f}x"
    chain = json.loads((REPO / "figures/results/smollm2_chain.json").read_text())["stages"]["s2_distill64_4096"]
    assert "--stop-after 30" in chain["command"]
    per = chain["seconds"] / 30
    assert f"{per:.1f} s a step at most" in text and f"{(sum(s) / 3) / per:.1f}x that" in text


def test_record_overhead_ratios_recomputed_from_the_committed_medians():
    # docs/run_schema.md's overhead table: a recorded forward's CPU and wall median over the plain
    # forward's at the same threads and length, from the committed rows, not the stored ratios
    assert "record-overhead" in {f.name for f in doc_blocks.find_blocks((REPO / "docs/run_schema.md").read_text())}
    df = pd.read_parquet(REPO / "figures/results/bench_record.parquet")
    assert set(df.schema_version) == {1} and df.commit.notna().all() and df.machine.notna().all()
    text = doc_blocks.render("record-overhead")
    for (threads, tokens), g in df.groupby(["threads", "tokens"]):
        g = g.set_index("timed")
        plain, rec, tab = g.loc["plain forward"], g.loc["recorded forward"], g.loc["tables()"]
        cells = _row_of(text, f"{threads} | {tokens}")
        assert cells[2] == f"{plain.cpu_s:.2f} / {plain.wall_s:.2f} s"
        assert cells[3] == f"{rec.cpu_s:.2f} / {rec.wall_s:.2f} s"
        assert cells[4] == f"{rec.cpu_s / plain.cpu_s:.2f}x" and cells[5] == f"{rec.wall_s / plain.wall_s:.2f}x"
        assert cells[6] == f"{tab.wall_s:.2f} s"
        assert cells[7] == f"{plain.load_1min_before:.1f} / {plain.load_1min_after:.1f}"
    assert all(c in text for c in set(df.commit)) and f"medians of {df.reps.min()} alternated pairs" in text


def _row_of(text: str, first_two: str) -> list[str]:
    """The cells of the table row of ``text`` that starts with the cells ``first_two`` ("a | b")."""
    found = [line for line in text.splitlines() if line.startswith(f"| {first_two} |")]
    assert len(found) == 1, (first_two, text)
    return [c.strip() for c in found[0].strip().strip("|").split("|")]


# --------------------------------------------------------------------------------------------
# studies/secondary-sinks.md: the recorded tables from figures/results/secondary_sinks.parquet

def _sinks() -> pd.DataFrame:
    df = pd.read_parquet(REPO / "figures/results/secondary_sinks.parquet")
    assert set(df.schema_version) == {1} and df.commit.notna().all()
    assert set(df.routers_sha256) == {"9bb56c76400b99cf4c7a5b7b6fb08f6650a87d0f4974db29fecaec894781789f"}
    return df


def _page_block(name: str) -> str:
    from tests.by_hand import on_page
    return on_page("secondary-sinks.md", name)


def test_secondary_sinks_drops_cells_from_the_summary_rows_by_hand():
    df = _sinks()
    d = df[df.seq_len == 8192]
    one = {r.quantity: r.value for r in d[(d.layer_idx < 0) & (d.pattern == "")].itertuples()}
    weight = {r.layer_idx: r.value for r in d[d.quantity == "the_weight"].itertuples()}
    top6 = sorted(weight, key=lambda l: -weight[l])[:6]
    kept = [v for l, v in ((r.layer_idx, r.value) for r in d[d.quantity == "the_group_kept"].itertuples()) if l in top6]
    row = _row_of(_page_block("secondary-sinks-drops"), "1 x 8192")
    assert row[1] == f"{int(one['dropped_edges']):,}"
    assert row[3] == f"**{round(100 * one['the_share'])}%** ({int(one['the_keys'])} keys)"
    assert row[5] == ", ".join(str(l) for l in top6)
    assert row[6] == f"{round(100 * min(kept))}-{round(100 * max(kept))}%"
    assert row[8] == f"{one['delta_top_decile']:.3f} / {one['delta_rest']:.3f}"


def test_secondary_sinks_coverage_and_layer_cells_from_the_summary_rows_by_hand():
    df = _sinks()
    cov = df[(df.quantity == "coverage") & (df.seq_len == 8192) & (df.distance_lo == 512)]
    f, r = (cov[cov.pattern == p].value.item() for p in ("focus", "random"))
    header, _, *rows = [l for l in _page_block("secondary-sinks-coverage").splitlines() if l.startswith("|")]
    i = [c.strip() for c in header.strip("|").split("|")].index("512-1K")
    cells = next([c.strip() for c in l.strip("|").split("|")] for l in rows if l.startswith("| 8K:"))
    assert cells[i] == f"{f:.2f} / {r:.2f}"
    layer = df[(df.quantity == "coverage_beyond_window") & (df.seq_len == 8192)]
    diff = layer[layer.pattern == "focus"].set_index("layer_idx").value - layer[layer.pattern == "random"].set_index(
        "layer_idx").value
    early = diff[diff.index.isin(range(1, 10))]
    text = _page_block("secondary-sinks-layers")
    assert _row_of(text, "1-9")[2] == f"{early.min():+.2f} to {early.max():+.2f}"
    assert _row_of(text, "7")[2] == f"{diff[7]:+.2f}"
    the = df[(df.quantity == "the_weight") & (df.seq_len == 8192)].set_index("layer_idx").value
    assert _row_of(text, "the others")[3] == f"{round(100 * the[~the.index.isin(range(1, 10))].sum() / the.sum())}%"


def _layer_pairs(layers: pd.DataFrame, inp: str, pattern: str) -> float:
    """The distant pairs a pattern keeps on one input, mean over its layers (one row a layer)."""
    g = layers[(layers.input == inp) & (layers.pattern == pattern)].drop_duplicates("layer_idx")
    assert len(g) == 30, (inp, pattern, len(g))
    return float(g.pairs.sum() / len(g))


def test_group_capacity_one_forward_cells_by_hand():
    # the saved one-forward rows (group_capacity --layers --save): a pattern's pairs, mean over its
    # 30 layers, in the capacity table, the eviction-capacity table and the per-layer eviction table
    layers = pd.read_parquet(REPO / "figures/group-capacity/layers.parquet")
    assert (layers.schema_version == 1).all() and set(layers.routers) == {"smollm2-135m/needle-mix-capacity"}
    caps = on_page("group-capacity.md", "group-capacity-capacities")
    assert table_row(caps, "none (hard top-2)")[1] == f"{_layer_pairs(layers, 'niah_single_1', 'hard_top2_nocap'):.2f}"
    assert table_row(caps, "0.7")[2] == f"{_layer_pairs(layers, 'man-pages:167', 'hard_top2_cap70'):.2f}"
    L = "13+15-16+21+24-25+28-29"
    ev = on_page("group-capacity-layers.md", "group-capacity-evict-capacity")
    assert table_row(ev, "E at c = 0.6")[3] == f"{_layer_pairs(layers, 'debian-reference:2', f'hard_top2_evict60@{L}'):.3f}"
    assert table_row(ev, "S, evicted")[1] == f"{_layer_pairs(layers, 'niah_single_1', f'hard_top2_evict@0+{L}'):.3f}"
    assert table_row(ev, "S, evicted")[2] == "-"  # not run on the man page
    one = on_page("group-capacity-layers.md", "group-capacity-evict-layers")
    assert table_row(one, "layer 24")[-1] == f"{_layer_pairs(layers, 'niah_single_1', 'hard_top2_evict@24'):.3f}"
    assert f"hard top-2 {_layer_pairs(layers, 'niah_single_1', 'hard_top2_nocap'):.3f})" in one.splitlines()[2]


def test_group_capacity_leave_one_out_cells_by_hand():
    loo = pd.read_parquet(REPO / "figures/group-capacity/leave_one_out.parquet")
    S, SE = "hard_top2_cap@0+13+15-16+21+24-25+28-29", "hard_top2_evict@0+13+15-16+21+24-25+28-29"

    def at(pattern, variant, seed):
        r = loo[(loo.pattern == pattern) & (loo.variant == variant) & (loo.seed == seed) & (loo.length == 8192)]
        assert len(r) == 1, (pattern, variant, seed)
        return f"{r.answer_logprob.iloc[0]:.2f}"
    text = on_page("group-capacity-layers.md", "group-capacity-leave-one-out")
    head = [c.strip() for c in text.splitlines()[2].strip("|").split("|")]
    assert head[:4] == ["keys over the cap, seed", "hard top-2", "all nine", "without 0"]
    col = head.index("without 0")
    assert table_row(text, "evicted, 6")[col] == at(SE, "without 0", 6)  # E on seed 6
    assert table_row(text, "moved (S), 19")[2] == at(S, S, 19)
    assert table_row(text, "moved (S), 6")[1] == at(S, "hard_top2_nocap", 6)

"""The reference pages' generated blocks and allowed numbers (analyses/blocks/reference_pages.py).

- ``method-recipes`` (docs/method.md §3.4) and ``retrieval-cost`` (docs/retrieval.md) stand on their
  pages, and their cells agree with a computation by hand from the committed rows (perplexity =
  exp of the pooled NLL; a case's cost = its seconds over its bare forward's, median and share
  within the goal over the rows with a bare forward);
- the numbers the module allows in prose as constants are what the code and the mask's arithmetic
  give (so a changed default or a wrong share fails here), and a measurement it does not allow is
  flagged;
- every reference page's prose takes its measured numbers from blocks.
"""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest
from by_hand import blocks_on, recipe_ppl

from analyses import doc_blocks
from analyses.blocks import reference_pages as ref
from analyses.doc_blocks import REPO


def _table_rows(text: str) -> dict[str, list[str]]:
    """First cell -> the row's cells, for every table row of a block's text."""
    out = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            out[cells[0]] = cells
    return out


def test_the_blocks_stand_on_their_pages():
    assert "method-recipes" in blocks_on("docs/method.md")
    assert "retrieval-cost" in blocks_on("docs/retrieval.md")


# --------------------------------------------------------------------------------------------
# method-recipes

@pytest.fixture(scope="module")
def sweep() -> pd.DataFrame:
    return pd.read_parquet(REPO / ref.RECIPES_SWEEP)


def test_method_recipes_cells_from_the_rows(sweep):
    rows = _table_rows(doc_blocks.render("method-recipes"))
    # the controls: exp of the pooled NLL, two decimals
    assert rows["dense"][1] == f"{recipe_ppl(sweep, '30 steps', 'controls', 'dense'):.2f}"
    assert rows["sliding window (w = 128)"][1] == f"{recipe_ppl(sweep, '30 steps', 'controls', 'window'):.2f}"
    assert rows["sliding window + 4 sinks"][1] == f"{recipe_ppl(sweep, '30 steps', 'controls', 'window_sinks4'):.2f}"
    # the paper's recipe: no group bias, its hard top-2 and the largest group at top-1
    paper = rows["`paper`"]
    assert paper[1:3] == ["0", "none (b = 0)"]
    assert paper[5] == f"{recipe_ppl(sweep, '30 steps', 'paper', 'hard_top2'):.2f}"
    share = sweep[(sweep.sweep == "30 steps") & (sweep.recipe == "paper") & (sweep.label == "hard_top1")].max_group_share
    assert paper[6] == f"{float(share.iloc[0]):.2f}"
    # sinks64 at 120 steps, from its own sweep
    assert rows["`sinks64`, 120 steps"][5] == f"{recipe_ppl(sweep, 'sinks64, 120 steps', 'sinks64', 'hard_top2'):.2f}"
    # recipes in order of hard top-2, by hand
    top2 = sweep[(sweep.sweep == "30 steps") & (sweep.recipe != "controls") & (sweep.label == "hard_top2")]
    order = [f"`{r}`" for r in top2.assign(p=np.exp(top2.nll)).sort_values("p").recipe]
    shown = [k for k in rows if k.startswith("`") and k != "`sinks64`, 120 steps"]
    assert shown == order


def test_method_prose_states_the_blocks_numbers(sweep):
    # the collapse of §1.3 and the controls of §2.1, as the prose states them
    text = (REPO / "docs" / "method.md").read_text(encoding="utf-8")
    assert f"hard top-2 perplexity {recipe_ppl(sweep, '30 steps', 'paper', 'hard_top2'):.2f} against " \
           f"{recipe_ppl(sweep, '30 steps', 'paper', 'soft'):.2f} soft" in text
    assert f"the window alone {recipe_ppl(sweep, '30 steps', 'controls', 'window'):.2f} perplexity" in text


# --------------------------------------------------------------------------------------------
# retrieval-cost

def test_retrieval_cost_cells_from_the_rows():
    cases = pd.read_parquet(REPO / ref.RETRIEVAL_CASES)
    rows = [r for r in doc_blocks.render("retrieval-cost").splitlines() if r.startswith("| ") and "|---" not in r]
    cells = {(c[0], c[1]): c for c in ([x.strip() for x in r.strip().strip("|").split("|")] for r in rows[1:])}
    cpu = cases[(cases.device == "2-core AMD EPYC CPU (fp32)") & (cases.length == 4096)]
    cpu = cpu[cpu.bare_forward_seconds.notna()]
    ratio = (cpu.seconds / cpu.bare_forward_seconds).to_numpy()
    row = cells[("2-core AMD EPYC CPU (fp32)", "4096")]
    assert row[2] == str(len(ratio))
    assert row[3].startswith(f"{np.median(ratio):.2f}x [")
    assert row[4] == f"{100 * np.mean(ratio <= 1.3):.0f}%"
    dense = cpu[cpu.pattern == "dense"]
    assert row[6] == f"{np.median(dense.seconds / dense.bare_forward_seconds):.2f}x"
    # every device and length of the table has its row
    assert set(cells) == {(d, str(L)) for d, L in cases.dropna(subset=["bare_forward_seconds"])
                          .groupby(["device", "length"]).size().index}


# --------------------------------------------------------------------------------------------
# the allowed numbers

def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def test_allowed_shares_are_the_masks_arithmetic():
    # the 64 sinks' share of the distant pairs (i - j >= w = 128), counted pair by pair
    def sink_share(T: int, w: int = 128, sinks: int = 64) -> float:
        i = np.arange(T)[:, None]
        j = np.arange(T)[None, :]
        distant = (i - j) >= w
        return float((distant & (j < sinks)).sum() / distant.sum())
    assert {_pct(sink_share(512)), _pct(sink_share(1024))} == {"31%", "14%"} <= ref.ALLOWED["docs/method.md"]
    # MoBA, blocks of 128 at 4096 tokens, top-10 of a query's strictly past blocks drawn uniformly,
    # 64 sinks always kept: the expected share of the distant pairs kept, pair by pair
    T, bs, k, w, sinks = 4096, 128, 10, 128, 64
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    distant = (i - j) >= w
    past = (j // bs) < (i // bs)
    p = np.where(j < sinks, 1.0, np.where(past, np.minimum(k, i // bs) / np.maximum(i // bs, 1), 0.0))
    expected = float((p * distant).sum() / distant.sum())
    assert f"{expected:.2f}" == "0.54" and f"{k / (T // bs):.2f}" == "0.31"
    assert {"0.54", "0.31"} <= ref.ALLOWED["docs/method.md"]
    # the sizes: one (B, H, T, T) float32 pattern for SmolLM2's 9 heads, one window's float32 logits
    # over its 49152-token vocabulary, at 4096 tokens, in GB
    assert f"{9 * 4096 * 4096 * 4 / 1e9:.1f}" in ref.ALLOWED["docs/probe.md"]
    assert f"{4096 * 49152 * 4 / 1e9:.1f}" in ref.ALLOWED["docs/run_schema.md"]
    # one layer's float32 keys at 8192 tokens, SmolLM2's 3 KV heads of 64 dimensions, in MB
    assert f"{3 * 64 * 8192 * 4 / 1e6:.1f}" in ref.ALLOWED["docs/decomposition.md"]


def test_allowed_settings_are_the_codes():
    import inspect

    from focus_lab.eval.passkey import DEFAULT_DEPTHS
    from focus_lab.eval.retrieval_tables import COST_GOAL, RETRIEVAL_HEAD_THRESHOLD
    from focus_lab.method import decomposition
    from focus_lab.method.config import FocusConfig
    from focus_lab.train.recipes import RECIPES
    assert f"{FocusConfig().bias_momentum}" in ref.ALLOWED["docs/method.md"]
    assert {f"{t['tau_final']}" for _, t in RECIPES.values() if "tau_final" in t} <= ref.ALLOWED["docs/method.md"]
    assert f"{COST_GOAL}x" in ref.ALLOWED["docs/retrieval.md"]
    assert f"{RETRIEVAL_HEAD_THRESHOLD}" in ref.ALLOWED["docs/retrieval.md"]
    waste = inspect.signature(decomposition._buckets).parameters["waste"].default
    assert f"{100 * (waste - 1):.0f}%" in ref.ALLOWED["docs/decomposition.md"]
    assert f"{max(DEFAULT_DEPTHS)}%" in ref.ALLOWED["docs/passkey.md"]


# --------------------------------------------------------------------------------------------
# the check on the reference pages

def test_reference_pages_join_the_check():
    assert set(ref.PROSE_PAGES) <= set(doc_blocks.prose_pages())
    for page in ref.PROSE_PAGES:
        assert (REPO / page).is_file(), page
    problems = doc_blocks.prose_problems(pages_=ref.PROSE_PAGES)
    assert not problems, "\n".join(problems)


def test_a_changed_number_in_the_method_prose_is_flagged(tmp_path):
    # the method page alone (its own blocks, the linked pages absent): a number its block holds
    # passes, the same number changed does not
    (tmp_path / "docs").mkdir()
    shutil.copy(REPO / "docs" / "method.md", tmp_path / "docs" / "method.md")
    before = doc_blocks.prose_problems(tmp_path, ("docs/method.md",))
    page = tmp_path / "docs" / "method.md"
    text = page.read_text(encoding="utf-8")
    assert "perplexity 98.71 against" in text
    page.write_text(text.replace("perplexity 98.71 against", "perplexity 98.17 against"), encoding="utf-8")
    after = doc_blocks.prose_problems(tmp_path, ("docs/method.md",))
    new = [p for p in after if p not in before]
    assert len(new) == 1 and "number 98.17 is in no generated block" in new[0]

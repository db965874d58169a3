"""Passkey retrieval probe (focus_lab/eval/passkey.py, ``focus-lab probe passkey``) on a tiny random
Llama and a tiny BPE tokenizer: prompt construction, teacher-forced log-probs, the needle audit
against brute force, bad inputs, the tables and resumability. The real model: tests marked slow."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import tiny_llama

from focus_lab.eval import passkey as P
from focus_lab.eval import passkey_figure as F
from focus_lab.method.config import ConfigError, FocusConfig
from focus_lab.method.core import hard_assign, hard_mask
from focus_lab.data import CorpusError, Document
from focus_lab.eval.evaluate import parse_patterns
from focus_lab.hf.retrofit import attach, attention_modules, detach, routers, set_config

from run_fixtures import PASSKEY_SENTENCES as SENTENCES  # noqa: E402
from run_fixtures import PASSKEY_TEXT as TEXT, passkey_tokenizer as make_tokenizer  # noqa: E402

ALL = "dense,window,random_top2,hard_top1,hard_top2"


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture(scope="module")
def hay(tok):
    return P.load_haystack([Document("tiny", TEXT)], tok, name="tiny")


def focus_model(window=8, sinks=2, layers=2):
    return attach(tiny_llama(layers=layers), FocusConfig(window=window, sink_tokens=sinks, mode="hard",
                                                         num_groups=4))


def test_tokenizer_fits_the_tiny_model(tok):
    ids = tok(TEXT + P.NEEDLE.format(key="48213"), add_special_tokens=False).input_ids
    assert max(ids) < 97 and tok.unk_token_id not in ids
    for fmt in P.FORMATS:
        head, tail = P.prompt_parts(tok, fmt)
        assert tok.unk_token_id not in head + tail, fmt
    assert tok.decode(tok(" 48213", add_special_tokens=False).input_ids).strip() == "48213"


# ------------------------------------------------------------------------------------------
# prompts

@pytest.mark.parametrize("length", [200, 257, 400])
@pytest.mark.parametrize("fmt", ["plain", "bare", "chat"])
def test_prompt_has_exactly_the_asked_length(tok, hay, length, fmt):
    head, tail = P.prompt_parts(tok, fmt)
    case = P.make_case(hay, tok, length, 50, seed=3, fmt=fmt)
    lead, answer, _ = P.answer_split(tok, case.key)
    tail = tail + lead
    ids = case.input_ids.tolist()
    assert len(ids) == length
    assert ids[:len(head)] == head and ids[-len(tail):] == tail
    assert case.answer_ids.tolist() == answer and tok.decode(answer).strip() == case.key
    # prompt + answer is the natural tokenization of "... The pass key is <key>"
    natural = tok("The pass key is " + case.key, add_special_tokens=False).input_ids
    assert (ids + answer)[-len(natural) + 1:] == natural[1:]  # (the first word: no leading space)
    assert tok.decode(tail).strip().endswith(P.ANSWER_PREFIX)
    assert len(head) > len(P.prompt_parts(tok, "bare")[0]) or fmt == "bare"


@pytest.mark.parametrize("depth", [0, 25, 50, 75, 100])
def test_needle_lands_at_the_asked_depth(tok, hay, depth):
    length = 400
    head, tail = P.prompt_parts(tok, "chat")
    case = P.make_case(hay, tok, length, depth, seed=1)
    tail = tail + P.answer_split(tok, case.key)[0]
    needle, _ = P._digit_tokens(tok, " " + P.NEEDLE.format(key=case.key), case.key)
    C = length - len(head) - len(needle) - len(tail)
    b = case.needle_position - len(head)
    ids = case.input_ids.tolist()
    assert ids[case.needle_position:case.needle_position + len(needle)] == needle
    assert case.needle_depth == pytest.approx(b / C)
    # the needle follows the end of a sentence of the haystack (or starts / ends it)
    before = tok.decode(ids[len(head):case.needle_position])
    after = tok.decode(ids[case.needle_position + len(needle):length - len(tail)])
    assert b in (0, C) or before.rstrip().endswith((".", "!", "?", "\"")), before[-30:]
    assert b == C or after.lstrip()[:1].isupper() or after.lstrip()[:1] == '"', after[:30]
    # nearest sentence start: no boundary of the slice is closer to the target depth
    hay_ids = ids[len(head):case.needle_position] + ids[case.needle_position + len(needle):length - len(tail)]
    assert len(hay_ids) == C
    target = depth / 100 * C
    def ends_sentence(j):
        text, more = tok.decode(hay_ids[:j]), tok.decode(hay_ids[:j + 1])
        return text.endswith((".", "!", "?", '."', '?"', '!"')) and not text.endswith("Mr.") \
            and more[len(text):][:1] == " "
    sentences_in_slice = [j for j in range(1, C) if ends_sentence(j)]
    assert len(sentences_in_slice) > 10
    best = min([0, C] + sentences_in_slice, key=lambda j: abs(j - target))
    assert abs(b - target) <= abs(best - target) + 1e-9
    assert abs(case.needle_depth - depth / 100) < 0.1
    # the key's digit tokens are where the case says
    digits = tok.decode(case.input_ids[case.needle_key_positions].tolist()).replace(" ", "")
    assert digits == case.key * 2


def test_same_seed_same_key_and_haystack_every_depth(tok, hay):
    a, b = P.make_case(hay, tok, 300, 0, seed=5), P.make_case(hay, tok, 300, 100, seed=5)
    assert a.key == b.key == P.key_for_seed(5) and len(a.key) == 5
    assert P.key_for_seed(6) != P.key_for_seed(5)
    assert a.needle_position < b.needle_position
    n = len(P._digit_tokens(tok, " " + P.NEEDLE.format(key=a.key), a.key)[0])
    without = lambda c: np.delete(c.input_ids.numpy(), np.arange(c.needle_position, c.needle_position + n))
    assert without(a).tolist() == without(b).tolist()  # the same haystack, only the needle moved
    c = P.make_case(hay, tok, 300, 0, seed=6)
    m = len(P._digit_tokens(tok, " " + P.NEEDLE.format(key=c.key), c.key)[0])
    assert without(a).tolist() != np.delete(c.input_ids.numpy(),
                                            np.arange(c.needle_position, c.needle_position + m)).tolist()


def test_sentence_starts_skip_abbreviations(tok):
    text = "Mr. Elliot came. She left! Was it?  Yes."
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    starts = P.sentence_starts(text, np.asarray(enc["offset_mapping"]))
    words = [text[enc["offset_mapping"][p][0]:].strip().split()[0] for p in starts]
    assert words == ["She", "Was", "Yes."]


def test_chat_format(tok):
    head, tail = P.prompt_parts(tok, "chat")
    assert head[0] == tok.bos_token_id and tok.decode(head[1:]).strip().startswith("user")
    assert P.INTRO in tok.decode(head)
    flat = tok.decode(tail).replace(" ", "").replace("\n", "")
    assert flat == f"{P.QUESTION}</s><s>assistant{P.ANSWER_PREFIX}".replace(" ", "")
    bare = make_tokenizer()
    bare.chat_template = None
    with pytest.raises(ConfigError, match="chat template"):
        P.prompt_parts(bare, "chat")
    with pytest.raises(ConfigError, match="plain, bare, chat"):
        P.prompt_parts(tok, "markdown")


# ------------------------------------------------------------------------------------------
# teacher forcing, decoding

def brute_key_logprob(model, case):
    """Sum of log-softmax of the key's tokens over one full forward (all logits)."""
    ids = torch.cat([case.input_ids, case.answer_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids[None], use_cache=False).logits[0].float(), -1)
    L = case.length
    return sum(float(logp[L - 1 + i, case.answer_ids[i]]) for i in case.key_index)


@pytest.mark.parametrize("pattern", ["dense", "window", "hard_top1", "random_top2"])
def test_key_logprob_equals_brute_force(tok, hay, pattern):
    model = focus_model()
    case = P.make_case(hay, tok, 300, 50, seed=2)
    pats = parse_patterns(pattern, 4)
    rows, _ = P.run_case(model, tok, case, pats)
    set_config(model, **pats[0][1])
    expected = brute_key_logprob(model, case)
    assert rows[0]["key_logprob"] == pytest.approx(expected, abs=1e-4)
    assert rows[0]["key_tokens"] == 5 and rows[0]["key_logprob"] < 0
    # ... and not the log-prob of some other tokens
    other = P.make_case(hay, tok, 300, 50, seed=4)
    assert brute_key_logprob(model, other) != pytest.approx(rows[0]["key_logprob"], abs=1e-3)


def test_run_case_leaves_the_model_config_alone(tok, hay):
    """Every pattern runs in its own FocusForward: the model's default state is the same object
    after the run (no set_config inside), with the config set before."""
    from focus_lab.hf.retrofit import focus_config
    model = focus_model()
    set_config(model, mode="soft", top_k=3)
    default = model._focus_state.default
    P.run_case(model, tok, P.make_case(hay, tok, 250, 0, seed=0), parse_patterns(ALL, 4))
    assert model._focus_state.default is default
    cfg = focus_config(model)
    assert (cfg.mode, cfg.top_k, cfg.assignment) == ("soft", 3, "router")


def test_window_covering_everything_makes_every_pattern_dense(tok, hay):
    case = P.make_case(hay, tok, 300, 50, seed=0)
    model = focus_model(window=400, sinks=0)  # >= prompt + answer tokens
    rows, _ = P.run_case(model, tok, case, parse_patterns(ALL + ",soft,shuffled_top1", 4))
    dense = rows[0]
    for r in rows[1:]:
        assert r["key_logprob"] == pytest.approx(dense["key_logprob"], abs=1e-4), r["pattern"]
        assert r["continuation"] == dense["continuation"] and r["needle_edges_kept"] == 1.0
    # the check can fail: with a small window the sparse patterns differ from dense
    rows, _ = P.run_case(focus_model(window=8, sinks=2), tok, case, parse_patterns("dense,window,hard_top1", 4))
    assert abs(rows[1]["key_logprob"] - rows[0]["key_logprob"]) > 1e-3
    assert abs(rows[2]["key_logprob"] - rows[0]["key_logprob"]) > 1e-3


def brute_greedy(model, tok, prefix, steps, stop_text):
    eos = model.generation_config.eos_token_id
    ids, out = prefix.clone(), []
    for _ in range(steps):
        with torch.no_grad():
            nxt = int(model(input_ids=ids[None], use_cache=False).logits[0, -1].argmax())
        out.append(nxt)
        ids = torch.cat([ids, torch.tensor([nxt])])
        if nxt == eos or stop_text(tok.decode(out)):
            break
    return out


@pytest.mark.parametrize("pattern", ["dense", "window", "hard_top2", "random_top2"])
def test_continuation_is_greedy_decoding(tok, hay, pattern):
    model = focus_model()
    case = P.make_case(hay, tok, 260, 25, seed=7)
    pats = parse_patterns(pattern, 4)
    rows, _ = P.run_case(model, tok, case, pats, max_new_tokens=6)
    set_config(model, **pats[0][1])
    expected = brute_greedy(model, tok, case.input_ids, 6,
                            lambda t: case.key in t or P._number_ended(t))
    assert rows[0]["continuation"] == tok.decode(expected)
    assert rows[0]["exact_match"] == (case.key in tok.decode(expected))


def test_kv_cache_decoding_equals_full_forwards(tok, hay):
    model = focus_model()
    set_config(model, mode="hard", top_k=2)
    prefix = P.make_case(hay, tok, 260, 50, seed=0).input_ids
    cached = P.greedy_continuation(model, prefix, 5, use_cache=True)
    full = P.greedy_continuation(model, prefix, 5, use_cache=False)
    assert cached == full and len(full) == 5


def test_exact_match_when_greedy_reproduces_the_answer(tok, hay):
    """The teacher-forced shortcut: when the greedy choice agrees with every answer token the
    case is an exact match without further decoding."""
    model = focus_model()
    set_config(model, mode="dense")
    case = P.make_case(hay, tok, 260, 50, seed=0)
    greedy = brute_greedy(model, tok, case.input_ids, 4, lambda t: False)
    case.answer_ids = torch.tensor(greedy)
    case.key = tok.decode(greedy)
    case.key_index = list(range(len(greedy)))
    rows, _ = P.run_case(model, tok, case, parse_patterns("dense", 4), audit=False)
    assert rows[0]["exact_match"] and rows[0]["continuation"] == case.key
    assert rows[0]["first_key_token_rank"] == 0
    case.answer_ids = torch.tensor([(greedy[0] + 1) % 97] + greedy[1:])  # first token no longer greedy
    rows, _ = P.run_case(model, tok, case, parse_patterns("dense", 4), audit=False)
    assert rows[0]["first_key_token_rank"] >= 1


# ------------------------------------------------------------------------------------------
# the needle audit against brute force

def capture_inputs(model):
    seen = {}
    hooks = []
    for idx, mod in attention_modules(model):
        def hook(module, args, kwargs, idx=idx):
            seen[idx] = kwargs.get("hidden_states", args[0] if args else None)
        hooks.append(mod.register_forward_pre_hook(hook, with_kwargs=True))
    return seen, hooks


def brute_kept(model, case, mode, top_k, layer_top_k=None):
    """Per layer: fraction of (answer query, needle key) pairs kept by the full T x T hard mask
    routed from the hidden states of a forward in ``mode``; ``layer_top_k`` ({layer_idx: k})
    overrides ``top_k`` in the layers it names (k = 0: window and sinks, written out by hand)."""
    layer_top_k = layer_top_k or {}
    set_config(model, mode=mode, top_k=top_k, layer_top_k=layer_top_k)
    seen, hooks = capture_inputs(model)
    ids = torch.cat([case.input_ids, case.answer_ids])
    with torch.no_grad():
        model(input_ids=ids[None], use_cache=False)
    for h in hooks:
        h.remove()
    T = len(ids)
    pos = torch.arange(T)
    out = {}
    row, needle = case.length - 1, torch.as_tensor(case.needle_key_positions)
    for idx, r in routers(model).items():
        k = layer_top_k.get(idx, top_k)
        if k == 0:
            kept = (row - needle < r.config.window) | (needle < r.config.sink_tokens)
            out[idx] = float(kept.float().mean())
            continue
        qg, kg = hard_assign(r(seen[idx]), r.config.tau, k, r.group_bias)
        m = hard_mask(qg, kg, r.config.window, pos, pos, r.config.sink_tokens)  # (1, T, T)
        out[idx] = float(m[0, row, needle].float().mean())
    set_config(model, layer_top_k={})
    return out


def test_needle_kept_fractions_agree_with_brute_force_hard_mask(tok, hay):
    model = focus_model(window=8, sinks=2, layers=3)
    values = []
    for depth in (0, 50):
        for seed in range(3):
            case = P.make_case(hay, tok, 320, depth, seed=seed)
            rows, lrows = P.run_case(model, tok, case, parse_patterns("dense,hard_top1,hard_top2", 4))
            by_layer = {r["layer_idx"]: r for r in lrows}
            assert sorted(by_layer) == [0, 1, 2]
            for k in (1, 2):
                want = brute_kept(model, case, "dense", k)
                got = {i: by_layer[i][f"kept_top{k}"] for i in by_layer}
                assert got == pytest.approx(want, abs=1e-9)
                values += list(got.values())
                # the pattern's own forward: its mask at the answer row, mean over layers
                own = brute_kept(model, case, "hard", k)
                assert rows[k]["needle_edges_kept"] == pytest.approx(np.mean(list(own.values())), abs=1e-9)
            assert rows[0]["needle_edges_kept"] == 1.0
            for r in lrows:
                assert r["kept_top1"] <= r["kept_top2"] + 1e-12  # top-2 groups include the top-1 group
    assert 0 < np.mean(values) < 1  # neither all kept nor all dropped: the comparison can fail


def test_per_layer_top_k_reaches_the_probe_mask(tok, hay):
    """A per-layer k (FocusConfig.layer_top_k, as ``probe passkey --layer-top-k`` sets it): the
    hard pattern's needle edges at the answer row equal the brute-force mask with each layer's k."""
    model = focus_model(window=8, sinks=2, layers=3)
    spec = {0: 3, 2: 0}  # layer 1 keeps the pattern's top-1
    case = P.make_case(hay, tok, 320, 50, seed=1)
    want = brute_kept(model, case, "hard", 1, spec)
    uniform = brute_kept(model, case, "hard", 1)
    assert want != pytest.approx(uniform)  # the spec changes the mask: the check can fail
    audit = {k: brute_kept(model, case, "dense", k) for k in (1, 2)}  # uniform top-1 / top-2
    rows, lrows = P.run_case(model, tok, case, parse_patterns("hard_top1+layer_top_k(3=[0],0=[2])", 4))
    assert rows[0]["needle_edges_kept"] == pytest.approx(np.mean(list(want.values())), abs=1e-9)
    # the needle audit's kept_top1 / kept_top2 stay the uniform masks (docs/passkey.md)
    for k in (1, 2):
        assert {r["layer_idx"]: r[f"kept_top{k}"] for r in lrows} == pytest.approx(audit[k], abs=1e-9)


def test_dense_mass_to_needle_equals_eager_attention(tok, hay):
    model = focus_model(window=8, sinks=2)
    case = P.make_case(hay, tok, 300, 50, seed=1)
    _, lrows = P.run_case(model, tok, case, parse_patterns("hard_top2", 4))  # audit: an extra dense forward
    detach(model)
    model.set_attn_implementation("eager")
    ids = torch.cat([case.input_ids, case.answer_ids])
    with torch.no_grad():
        att = model(input_ids=ids[None], output_attentions=True, use_cache=False).attentions
    pos = torch.as_tensor(case.needle_key_positions)
    for r in lrows:
        a = att[r["layer_idx"]][0, :, case.length - 1]  # (H, T) the answer query's row
        assert r["dense_mass_to_needle"] == pytest.approx(float(a[:, pos].sum(-1).mean()), abs=1e-5)
        assert r["max_head_mass_to_needle"] == pytest.approx(float(a[:, pos].sum(-1).max()), abs=1e-5)
        assert 0 < r["dense_mass_to_needle"] < 1


def test_window_keeps_the_needle_only_within_reach(tok, hay):
    model = focus_model(window=8, sinks=2)
    near = P.make_case(hay, tok, 300, 100, seed=0)
    far = P.make_case(hay, tok, 300, 50, seed=0)
    r_near, _ = P.run_case(model, tok, near, parse_patterns("window", 4), audit=False)
    r_far, _ = P.run_case(model, tok, far, parse_patterns("window", 4), audit=False)
    keys_near = near.needle_key_positions
    expected = float(np.mean((near.length - 1 - keys_near) < 8))
    assert r_near[0]["needle_edges_kept"] == pytest.approx(expected)
    assert r_far[0]["needle_edges_kept"] == 0.0


# ------------------------------------------------------------------------------------------
# bad inputs

def test_length_beyond_the_model_positions_names_the_limit(tok, hay, tmp_path):
    model = focus_model()
    with pytest.raises(ConfigError, match=r"512 positions.*longest prompt is 50[0-9] tokens"):
        P.run_passkey(model, tok, hay, tmp_path, lengths=[300, 600], depths=[50], keys=1, log=lambda s: None)
    with pytest.raises(ConfigError, match="512 positions"):
        P.check_length(512, 512, budget=8)
    P.check_length(504, 512, budget=8)  # fits exactly
    assert not (tmp_path / "cells").exists()  # nothing ran


def test_haystack_too_short_says_how_long_it_is(tok, tmp_path):
    short = P.load_haystack([Document("short", " ".join(SENTENCES))], tok, name="short")
    n = len(short.ids)
    with pytest.raises(CorpusError, match=rf"holds only {n} tokens"):
        P.make_case(short, tok, 400, 50, seed=0)
    with pytest.raises(CorpusError, match=rf"holds only {n} tokens"):
        P.run_passkey(focus_model(), tok, short, tmp_path, lengths=[400], depths=[0], keys=1, log=lambda s: None)


def test_bad_depth_length_keys_and_patterns(tok, hay, tmp_path):
    with pytest.raises(ConfigError, match="0..100"):
        P.make_case(hay, tok, 300, 120, seed=0)
    with pytest.raises(ConfigError, match="no room for a haystack"):
        P.make_case(hay, tok, 20, 50, seed=0)
    with pytest.raises(ConfigError, match="at least one key"):
        P.run_passkey(focus_model(), tok, hay, tmp_path, lengths=[300], depths=[0], keys=0)
    with pytest.raises(ConfigError, match="unknown pattern 'bogus'; choose from dense, window, soft, hard_topK"):
        parse_patterns("dense,bogus", 4)


def test_cli_bad_inputs_exit_2_with_one_line():
    from typer.testing import CliRunner

    from focus_lab.cli import app
    runner = CliRunner()
    for args, msg in [(["--patterns", "dense,bogus"], "unknown pattern 'bogus'; choose from dense"),
                      (["--lengths", "1k"], "--lengths '1k': write a comma list"),
                      (["--format", "markdown"], "unknown prompt format 'markdown'"),
                      (["--keys", "0"], "at least one key"),
                      (["--layer-top-k", "1-2:x"], "--layer-top-k"),
                      (["--random-layers", "a-b"], "--random-layers")]:
        res = runner.invoke(app, ["probe", "passkey", *args])
        assert res.exit_code == 2, (args, res.output)
        assert msg in res.output, res.output


def test_cli_defaults_agree_with_the_library():
    from focus_lab import cli
    assert cli.PASSKEY_PATTERNS == P.DEFAULT_PATTERNS
    assert cli.PASSKEY_LENGTHS == ",".join(map(str, P.DEFAULT_LENGTHS))
    assert cli.PASSKEY_DEPTHS == ",".join(map(str, P.DEFAULT_DEPTHS))
    assert cli.PASSKEY_FORMAT == P.DEFAULT_FORMAT


# ------------------------------------------------------------------------------------------
# tables, resumability, figure

def test_tables_have_the_documented_columns_and_resume(tok, hay, tmp_path):
    model = focus_model(layers=2)
    logs = []
    kw = dict(lengths=[250, 300], depths=[0, 100], keys=2, patterns=parse_patterns("dense,hard_top1", 4),
              log=logs.append)
    res = P.run_passkey(model, tok, hay, tmp_path, **kw)
    assert res["computed_cells"] == 4
    cases = pd.read_parquet(tmp_path / "cases.parquet")
    layers = pd.read_parquet(tmp_path / "needle_layers.parquet")
    assert list(cases.columns) == P.CASES_COLUMNS + ["canonical_pattern"]  # no router file given: no router columns
    assert cases.set_index("pattern")["canonical_pattern"].to_dict() == {"dense": "dense", "hard_top1": "hard_top1"}
    assert list(layers.columns) == P.LAYER_COLUMNS
    for col in ["length", "depth", "pattern", "seed", "key", "exact_match", "key_logprob", "key_tokens",
                "distant_pairs_kept", "seconds"]:
        assert col in cases.columns
    for col in ["length", "depth", "seed", "layer_idx", "dense_mass_to_needle", "kept_top1", "kept_top2"]:
        assert col in layers.columns
    assert (cases["schema_version"] == P.PASSKEY_SCHEMA).all() and (layers["schema_version"] == 1).all()
    assert len(cases) == 2 * 2 * 2 * 2 and len(layers) == 2 * 2 * 2 * 2  # lengths x depths x keys x (patterns | layers)
    assert cases["exact_match"].dtype == bool and set(cases["seed"]) == {0, 1}
    assert cases["key"].str.fullmatch(r"\d{5}").all()
    assert (cases.loc[cases.pattern == "dense", "distant_pairs_kept"] == 1).all()
    hard = cases.loc[cases.pattern == "hard_top1", "distant_pairs_kept"]
    assert ((hard > 0) & (hard < 1)).all()
    assert (tmp_path / "passkey.html").is_file() and (tmp_path / "passkey.json").is_file()
    # resumable: a rerun computes nothing and gives the same tables
    again = P.run_passkey(model, tok, hay, tmp_path, **kw)
    assert again["computed_cells"] == 0
    pd.testing.assert_frame_equal(again["cases"].drop(columns="seconds"), res["cases"].drop(columns="seconds"))
    # an interrupted run: a missing cell is computed again, the others are kept
    cell = next((tmp_path / "cells").glob("*/chat_L300_d100.cases.parquet"))
    cell.unlink()
    third = P.run_passkey(model, tok, hay, tmp_path, **kw)
    assert third["computed_cells"] == 1
    pd.testing.assert_frame_equal(third["cases"].drop(columns="seconds"), res["cases"].drop(columns="seconds"))
    # other settings do not reuse the cells
    other = P.run_passkey(model, tok, hay, tmp_path, **{**kw, "keys": 1})
    assert other["computed_cells"] == 4
    # the run becomes a committed probe table (analyses/exp_passkey.py --commit); again: replaced
    import json
    from analyses.exp_passkey import commit_run
    results = tmp_path / "results"
    results.mkdir()
    assert commit_run(tmp_path, "a", results) == len(other["cases"]) == 8
    assert commit_run(tmp_path, "b", results) == 8
    assert commit_run(tmp_path, "a", results) == 8
    committed = pd.read_parquet(results / "passkey_cases.parquet")
    assert sorted(committed.table.value_counts().items()) == [("a", 8), ("b", 8)]
    pd.testing.assert_frame_equal(committed[committed.table == "a"].drop(columns="table").reset_index(drop=True),
                                  pd.read_parquet(tmp_path / "cases.parquet"))
    assert len(pd.read_parquet(results / "passkey_needle_layers.parquet")) == 2 * len(other["needle_layers"])
    meta = json.loads((results / "passkey_tables.json").read_text())
    assert sorted(meta) == ["a", "b"] and meta["a"]["settings"]["keys"] == 1 and "files" not in meta["a"]
    with pytest.raises(SystemExit, match="missing .*passkey.json"):
        commit_run(tmp_path / "cells", "c", results)


def test_heatmap_shows_exact_match_rate_and_logprob():
    cases = pd.DataFrame({"format": "plain", "length": [256, 256, 256, 512], "depth": [0.0, 0.0, 50.0, 0.0],
                          "pattern": "dense", "exact_match": [True, False, True, False],
                          "key_logprob": [-1.0, -3.0, -0.5, -7.0]})
    fig = F.heatmap_figure(cases)
    assert len(fig.data) == 1
    z = np.asarray(fig.data[0].z, dtype=float)
    assert z[0].tolist() == [0.5, 1.0] and z[1, 0] == 0.0 and np.isnan(z[1, 1])
    assert list(fig.data[0].text[0]) == ["-2.0", "-0.5"]


# ------------------------------------------------------------------------------------------
# the real model

@pytest.mark.slow
def test_real_model_dense_finds_a_key_at_1k(tmp_path):
    """SmolLM2-135M-Instruct, dense, plain format, 1024 tokens, the needle at depth 0."""
    torch.set_num_threads(1)
    from focus_lab.data import load_corpus
    from focus_lab.hf.models import load_model
    from focus_lab.hf.retrofit import load_routers
    from focus_lab.hf.shipped import shipped_router_file
    model, tok = load_model(verbose=False)
    load_routers(model, shipped_router_file())
    hay = P.load_haystack(load_corpus("austen").heldout, tok, "persuasion")
    case = P.make_case(hay, tok, 1024, 0, seed=0)
    rows, lrows = P.run_case(model, tok, case, parse_patterns("dense", 4))
    assert rows[0]["exact_match"], rows[0]["continuation"]
    assert rows[0]["key_logprob"] > -3.0 and len(lrows) == 30


def test_png_failure_is_a_note_not_an_error(tmp_path, monkeypatch):
    cases = pd.DataFrame({"format": "chat", "length": [256], "depth": [50.0], "pattern": "hard_top2",
                          "exact_match": [True], "key_logprob": [-0.5]})

    import kaleido

    def boom(*args, **kwargs):
        raise RuntimeError("no browser here\nsecond line")
    monkeypatch.setattr(kaleido, "write_fig_sync", boom)
    files, note = F.write_figure(F.heatmap_figure(cases), tmp_path / "passkey", png=True)
    assert files == ["passkey.html"] and (tmp_path / "passkey.html").is_file()
    assert "PNG not written (RuntimeError: no browser here;" in note and "second line" not in note
    assert not list(tmp_path.glob("*.png")) and not list(tmp_path.glob(".*tmp"))
    assert F.write_figure(F.heatmap_figure(cases), tmp_path / "again", png=False) == (["again.html"], None)

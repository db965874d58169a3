"""Retrieval suite (focus_lab/eval/retrieval.py, ``focus-lab probe retrieval``) on a tiny random Llama
and a tiny BPE tokenizer: RULER's tasks built as defined, the score against RULER's metric by hand,
teacher-forced log-probs and greedy answers against full forwards, the trace against eager attention
and the layer's own mask, resume and torchrun shards, bad inputs."""

from __future__ import annotations

import string

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import tiny_llama

from focus_lab.data import CorpusError, Document
from focus_lab.eval import passkey as PK
from focus_lab.eval import retrieval as R
from focus_lab.method.config import ConfigError, FocusConfig
from focus_lab.hf.retrofit import attach, detach, forward_state, set_config

from run_fixtures import PASSKEY_CHAT_TEMPLATE, PASSKEY_TEXT, VOCAB  # noqa: E402

TASKS_SMALL = ["passkey", "niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
               "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt"]


@pytest.fixture(scope="module")
def tok():
    """A 97-entry BPE tokenizer (Metaspace) trained on the haystack, RULER's templates and every
    character the tasks write (letters, digits, UUID dashes), with a small chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Metaspace()
    tk.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
                                  show_progress=False)
    tk.train_from_iterator([PASSKEY_TEXT, R.NIAH_TEMPLATE, R.VT_TEMPLATE, R.CWE_TEMPLATE, R.NOISE,
                            string.ascii_letters, string.digits + "-:,.?()'\"!;=", PK.INTRO], trainer)
    t = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", pad_token="<pad>", bos_token="<s>",
                                eos_token="</s>")
    t.chat_template = PASSKEY_CHAT_TEMPLATE
    return t


@pytest.fixture(scope="module")
def hay(tok):
    return PK.load_haystack([Document("tiny", PASSKEY_TEXT)], tok, name="tiny")


def focus_model(window=8, sinks=2, layers=2, max_positions=2048):
    from focus_lab.hf.tiny import tiny_llama as make
    return attach(make(layers=layers, max_positions=max_positions),
                  FocusConfig(window=window, sink_tokens=sinks, mode="hard", num_groups=4))


def pats(spec: str, cases: int = 1):
    return [(lab, ch) for lab, ch, _ in R.parse_retrieval_patterns(spec, 4, cases)]


# ------------------------------------------------------------------------------------------
# tasks and prompts

def test_score_is_rulers_string_match_all():
    # RULER: sum over references of [ref.lower() in pred.lower()] / len(refs)
    assert R.score("The numbers are 1234567 and 7654321.", ["1234567", "7654321"]) == (1.0, 2)
    assert R.score("The numbers are 1234567.", ["1234567", "7654321"]) == (0.5, 1)
    assert R.score("abcde FGHIJ", ["ABCDE", "fghij", "KLMNO"]) == (2 / 3, 2)
    assert R.score("", ["x"]) == (0.0, 0)


@pytest.mark.parametrize("name", TASKS_SMALL)
@pytest.mark.parametrize("fmt", ["chat", "plain"])
def test_prompt_length_needles_and_answers(tok, hay, name, fmt):
    task = R.TASKS[name]
    L = 900
    case = R.make_case(task, hay, tok, L, seed=3, fmt=fmt)
    assert len(case.input_ids) == L - task.max_new_tokens  # RULER: prompt + budget = max_seq_length
    assert tok.unk_token_id not in case.answer_ids.tolist()
    # the teacher-forced answer is the expected answers joined by ", "
    assert tok.decode(case.answer_ids).strip() == ", ".join(sorted(case.answers, key=lambda a: tok.decode(
        case.answer_ids).index(a)))
    # every expected answer is written in the haystack, on the traced positions
    needle_text = tok.decode(case.input_ids[torch.as_tensor(case.needle_positions)]).replace(" ", "")
    for a in case.answers:
        assert a.replace(" ", "") in needle_text
    assert case.needle_positions.max() < len(case.input_ids) and len(set(case.needle_positions)) == len(
        case.needle_positions)
    want_needles = {"passkey": 1, "niah_multikey_1": 4, "niah_multivalue": 4, "niah_multiquery": 4, "vt": 5}
    assert case.needles == want_needles.get(name, 1)
    # the answer tokens indexed by answer_index are exactly those that carry answer characters
    text = "".join(tok.decode([t]) for t in case.answer_ids[case.answer_index].tolist()).replace(" ", "")
    assert text == "".join(a for a in tok.decode(case.answer_ids).replace(" ", "").split(","))


def test_rulers_definitions(tok, hay):
    c = R.make_case(R.TASKS["niah_multikey_1"], hay, tok, 900, seed=1)
    prompt = tok.decode(c.input_ids)
    assert prompt.count("One of the special magic numbers for") == 4  # 3 distractor keys
    assert "What is the special magic number for" in prompt  # RULER's singular wording
    assert len(c.answers) == 1 and len(c.answers[0]) == 7 and c.answers[0].isdigit()
    mv = R.make_case(R.TASKS["niah_multivalue"], hay, tok, 900, seed=1)
    assert "What are all the special magic numbers for" in tok.decode(mv.input_ids) and len(mv.answers) == 4
    u = R.make_case(R.TASKS["niah_multikey_3"], hay, tok, 1200, seed=1)
    assert len(u.answers[0]) == 36 and u.answers[0][14] == "4"  # a version-4 UUID
    assert tok.decode(u.input_ids).count("One of the special magic uuids for") > 5  # a haystack of needles
    vt = R.make_case(R.TASKS["vt"], hay, tok, 900, seed=1)
    p = tok.decode(vt.input_ids)
    value = p.split("assigned the value ")[1].split()[0]
    assert f"VAR {vt.answers[0]} = {value}" in p
    for a, b in zip(vt.answers, vt.answers[1:]):  # the chain, in order
        assert p.index(f"VAR {b} = VAR {a}") > p.index(f"VAR {a} =")


def test_cwe_common_words_are_the_most_frequent(tok, hay):
    c = R.make_case(R.TASKS["cwe"], hay, tok, 1500, seed=2)
    text = tok.decode(c.input_ids)
    words = text.split("most often.")[1].split("Question")[0]
    counts = pd.Series([w for w in words.split() if not w.rstrip(".").isdigit()]).value_counts()
    assert len(c.answers) == 10 and set(counts.index[:10]) == set(c.answers)


def test_same_seed_same_case(tok, hay):
    a = R.make_case(R.TASKS["niah_single_2"], hay, tok, 800, seed=5)
    b = R.make_case(R.TASKS["niah_single_2"], hay, tok, 800, seed=5)
    c = R.make_case(R.TASKS["niah_single_2"], hay, tok, 800, seed=6)
    assert torch.equal(a.input_ids, b.input_ids) and a.answers == b.answers
    assert a.answers != c.answers


# ------------------------------------------------------------------------------------------
# one case through the model, against full forwards

def brute_answer_logprob(model, case, changes):
    state = forward_state(model, **changes)
    ids = torch.cat([case.input_ids, case.answer_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids[None], use_cache=False, focus=state).logits[0].float(), -1)
    P = len(case.input_ids)
    return sum(float(logp[P - 1 + i, case.answer_ids[i]]) for i in case.answer_index)


@pytest.mark.parametrize("pattern", ["window", "hard_top1", "hard_top2_match", "random_top2"])
def test_answer_logprob_equals_full_forward(tok, hay, pattern):
    model = focus_model()
    case = R.make_case(R.TASKS["niah_multivalue"], hay, tok, 900, seed=2)
    rows, _ = R.run_case(model, tok, case, pats(f"dense,{pattern}"), R.TASKS["niah_multivalue"])
    for r, (lab, ch) in zip(rows, pats(f"dense,{pattern}")):
        assert r["pattern"] == lab
        assert r["answer_logprob"] == pytest.approx(brute_answer_logprob(model, case, ch), abs=2e-4), lab
    assert rows[0]["answer_logprob"] != pytest.approx(rows[1]["answer_logprob"], abs=1e-3)  # can fail


def brute_greedy(model, tok, case, changes, steps):
    state = forward_state(model, **changes)
    ids, out = case.input_ids.clone(), []
    for _ in range(steps):
        with torch.no_grad():
            nxt = int(model(input_ids=ids[None], use_cache=False, focus=state).logits[0, -1].argmax())
        out.append(nxt)
        ids = torch.cat([ids, torch.tensor([nxt])])
        if nxt == model.generation_config.eos_token_id or R.score(tok.decode(out), case.answers)[0] == 1:
            break
    return tok.decode(out)


def step_logits(model, state, ids, P):
    """Logits (len(ids) - P + 1, V) of positions P - 2 .. len(ids) - 1: the prompt but its last
    token in one forward from position 0, then one token at a time through the KV cache."""
    with torch.no_grad():
        res = model(input_ids=ids[None, :P - 1], use_cache=True, focus=state)
        past, out = res.past_key_values, [res.logits[0, -1]]
        for t in range(P - 1, len(ids)):
            res = model(input_ids=ids[None, t:t + 1], use_cache=True, past_key_values=past, focus=state)
            past = res.past_key_values
            out.append(res.logits[0, -1])
    return torch.stack(out).float()


def test_shuffled_groups_decode_through_the_prefill_cache(tok, hay):
    """Shuffled groups permute the prefill's positions and draw the later ones' groups from it
    (``core.Router._shuffle``): the suite's answer log-prob (the answer as one chunk) and its greedy
    answer (from a copy of the prefill's cache) equal a prefill followed by one token at a time."""
    model = focus_model()
    task = R.TASKS["niah_single_2"]
    case = R.make_case(task, hay, tok, 400, seed=4)
    p = pats("dense,shuffled_top2")
    rows, _ = R.run_case(model, tok, case, p, task)
    ch = dict(p)["shuffled_top2"]
    row = rows[1]
    P = len(case.input_ids)
    ids = torch.cat([case.input_ids, case.answer_ids])
    logp = torch.log_softmax(step_logits(model, forward_state(model, cache=True, **ch), ids, P), -1)
    ref = sum(float(logp[1 + i, case.answer_ids[i]]) for i in case.answer_index)  # row 1 + i: position P - 1 + i
    assert row["answer_logprob"] == pytest.approx(ref, abs=2e-4)
    assert row["answer_logprob"] != pytest.approx(brute_answer_logprob(model, case, ch), abs=1e-3)  # not the full forward's
    out = []  # greedy: prefill, then the tokens it picks, one at a time
    for _ in range(task.max_new_tokens):
        seq = torch.cat([case.input_ids, torch.tensor(out, dtype=torch.long)])
        nxt = int(step_logits(model, forward_state(model, cache=True, **ch), seq, P)[-1].argmax())
        out.append(nxt)
        if nxt == model.generation_config.eos_token_id or R.score(tok.decode(out), case.answers)[0] == 1:
            break
    assert row["continuation"] == tok.decode(out)


@pytest.mark.parametrize("pattern", ["dense", "hard_top2", "random_top2"])
def test_continuation_is_greedy_decoding(tok, hay, pattern):
    model = focus_model()
    task = R.TASKS["niah_single_2"]
    case = R.make_case(task, hay, tok, 400, seed=4)
    p = pats(pattern)
    rows, _ = R.run_case(model, tok, case, p, task)
    row = next(r for r in rows if r["pattern"] == pattern)
    ch = dict(p)[pattern]
    assert row["continuation"] == brute_greedy(model, tok, case, ch, task.max_new_tokens)
    assert row["score"] == R.score(row["continuation"], case.answers)[0]


def test_greedy_that_reproduces_the_answer_scores_one(tok, hay, monkeypatch):
    """The teacher-forced shortcut: a model whose greedy choice is every answer token scores 1
    without decoding further."""
    model = focus_model()
    task = R.TASKS["niah_single_2"]
    case = R.make_case(task, hay, tok, 400, seed=4)
    P, n = len(case.input_ids), len(case.answer_ids)
    target = torch.cat([case.input_ids, case.answer_ids])

    orig = model.forward

    def forward(*a, **kw):
        res = orig(*a, **kw)
        ids = kw.get("input_ids")
        T = ids.shape[1]
        past = kw.get("past_key_values")
        start = past.get_seq_length() - T if past is not None and kw.get("use_cache") else 0
        logits = torch.full_like(res.logits, -10.0)
        keep = logits.shape[1]
        for i in range(keep):
            p = start + T - keep + i + 1
            if p < len(target):
                logits[0, i, target[p]] = 10.0
        res.logits = logits
        return res

    monkeypatch.setattr(model, "forward", forward)
    rows, _ = R.run_case(model, tok, case, pats("dense"), task)
    assert rows[0]["score"] == 1.0 and rows[0]["first_answer_token_rank"] == 0
    assert rows[0]["continuation"] == tok.decode(case.answer_ids)


# ------------------------------------------------------------------------------------------
# the trace

def test_trace_against_eager_attention_and_the_layers_own_mask(tok, hay):
    model = focus_model(window=8, sinks=2, layers=3)
    task = R.TASKS["niah_multiquery"]
    case = R.make_case(task, hay, tok, 900, seed=1)
    p = pats("dense,hard_top2,window")
    rows, trace = R.run_case(model, tok, case, p, task)
    tr = pd.DataFrame(trace)
    P, n = len(case.input_ids), len(case.answer_ids)
    rows_q = torch.arange(P - 1, P - 1 + n)[torch.as_tensor(case.answer_index)]
    needle = torch.as_tensor(case.needle_positions)
    ids = torch.cat([case.input_ids, case.answer_ids])
    # the layer's own mask, from a full forward's kept hook point (no KV cache)
    import focus_lab
    kept = {}
    for lab, ch in p[1:]:
        state = forward_state(model, **ch)
        with focus_lab.cache(model, ["kept"]) as c, torch.no_grad():
            model(input_ids=ids[None, :P - 1 + n], use_cache=False, focus=state)
        kept[lab] = {i: c[f"layers.{i}.kept"][0][rows_q][:, needle].float() for i in range(3)}
    # dense attention from eager attention
    detach(model)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        att = model(input_ids=ids[None], output_attentions=True, use_cache=False).attentions
    cp = R.copy_pairs(ids, rows_q, needle).float()
    for r in tr.itertuples():
        a = att[r.layer_idx][0, r.head][rows_q][:, needle]  # (r, m)
        assert r.dense_mass == pytest.approx(float(a.sum(-1).mean()), abs=1e-5)
        assert r.copy_mass == pytest.approx(float((a * cp).sum(-1).mean()), abs=1e-5)
        if r.pattern == "dense":
            assert r.pairs_kept == 1.0 and r.mass_kept == pytest.approx(r.dense_mass, abs=1e-6)
            continue
        k = kept[r.pattern][r.layer_idx]
        assert r.pairs_kept == pytest.approx(float(k.mean()), abs=1e-6)
        assert r.mass_kept == pytest.approx(float((a * k).sum(-1).mean()), abs=1e-5)
    h2 = tr[tr.pattern == "hard_top2"]
    assert 0 < h2.pairs_kept.mean() < 1  # neither all kept nor all dropped: the comparison can fail
    assert (tr[tr.pattern == "window"].pairs_kept == 0).all()  # the needle is far beyond the window
    assert rows[1]["needle_pairs_kept"] == pytest.approx(h2.groupby("layer_idx").pairs_kept.first().mean())


def test_copy_pairs_by_hand():
    ids = torch.tensor([5, 7, 9, 7, 3, 5, 7])
    # query at 6 holds 7: copies are keys j with ids[j-1] == 7 -> j = 2, 4
    got = R.copy_pairs(ids, torch.tensor([6, 5]), torch.tensor([0, 2, 4, 6]))
    assert got.tolist() == [[False, True, True, False], [False, False, False, True]]


def test_retrieval_score_by_hand():
    """Wu et al.: a head scores a hit when its strongest key is a needle token equal to the
    token being predicted."""
    ids = torch.tensor([1, 4, 6, 8, 0, 0, 4, 6])  # needle 4, 6 at 1, 2; answer 4, 6 at 6, 7
    case = R.RetrievalCase("t", 8, 0, ids[:6], ids[6:], [0, 1], ["46"], np.array([1, 2]), 1)
    rows = torch.tensor([5, 6])  # they predict 4 (pos 6) and 6 (pos 7)
    probs = {0: torch.zeros(2, 2, 2)}
    argmax = {0: torch.tensor([[1, 2], [1, 3]])}  # head 0: both right; head 1: 1 right, 1 off the needle
    out = R._trace_rows(case, ids, rows, torch.tensor([1, 2]), torch.tensor([0, 1]), probs, argmax,
                        {"dense": {0: torch.ones(2, 2)}})
    assert [r["retrieval_score"] for r in out] == [1.0, 0.5]


# ------------------------------------------------------------------------------------------
# the suite: resume, shards, tables

def test_suite_resumes_case_by_case_and_shards(tok, hay, tmp_path, monkeypatch):
    model = focus_model()
    tasks = R.parse_tasks("niah_single_2,vt")
    p = R.parse_retrieval_patterns("dense,hard_top2:1,random_top2", 4, 2)
    res = R.run_retrieval(model, tok, hay, tmp_path, tasks, [700], 2, p, log=lambda s: None)
    df = res["cases"]
    assert res["computed"] == 4 and set(df.columns) == set(R.CASES_COLUMNS) | {"canonical_pattern"}
    assert df.groupby("pattern").size().to_dict() == {"dense": 4, "hard_top2": 2, "random_top2": 4}
    assert (df.bare_forward_seconds > 0).all()
    assert set(pd.read_parquet(tmp_path / "trace.parquet").columns) == set(R.TRACE_COLUMNS)
    # a killed run: one case file missing -> only that case is computed again, same numbers
    files = sorted((tmp_path / "cases").rglob("vt_L700_s1.cases.parquet"))
    files[0].unlink()
    again = R.run_retrieval(model, tok, hay, tmp_path, tasks, [700], 2, p, log=lambda s: None)
    assert again["computed"] == 1
    cols = ["task", "seed", "pattern", "score", "answer_logprob"]
    pd.testing.assert_frame_equal(again["cases"][cols].sort_values(cols[:3]).reset_index(drop=True),
                                  df[cols].sort_values(cols[:3]).reset_index(drop=True))
    # torchrun: process 1 of 2 takes every other case; process 0 merges all
    out = tmp_path / "shards"
    monkeypatch.setattr(R, "barrier", lambda: None)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    r1 = R.run_retrieval(model, tok, hay, out, tasks, [700], 2, p, log=lambda s: None)
    assert r1["cases"] is None and r1["computed"] == 2
    monkeypatch.setenv("RANK", "0")
    r0 = R.run_retrieval(model, tok, hay, out, tasks, [700], 2, p, log=lambda s: None)
    assert r0["computed"] == 2 and len(r0["cases"]) == len(df)
    pd.testing.assert_frame_equal(r0["cases"][cols].sort_values(cols[:3]).reset_index(drop=True),
                                  df[cols].sort_values(cols[:3]).reset_index(drop=True))


def test_reuse_takes_the_dense_forward_and_the_rest_equals_a_fresh_run(tok, hay, tmp_path, monkeypatch):
    """``reuse``: each case's dense row and trace rows come from the earlier run (no dense forward
    runs: a dense NeedleTrace fails the test), the other patterns' rows and traces equal a fresh
    run's that computed dense itself; a reused row names the run that computed it, also when
    reused again; another model's or another length's cases are not taken."""
    from focus_lab.hf.retrofit import model_identity
    model = focus_model()
    tasks = R.parse_tasks("niah_single_2")
    settings = {"model": model_identity(model)}
    quiet = dict(settings=settings, log=lambda s: None)
    first = R.run_retrieval(model, tok, hay, tmp_path / "a", tasks, [700], 2,
                            R.parse_retrieval_patterns("dense,hard_top2", 4, 2), **quiet)
    assert first["reused_dense"] == 0 and (first["cases"].reused_from == "").all()
    assert len(list((tmp_path / "a" / "cases").rglob(f"*{R.DENSE_SUFFIX}"))) == 2
    p = R.parse_retrieval_patterns("dense,hard_top1", 4, 2)
    fresh = R.run_retrieval(model, tok, hay, tmp_path / "fresh", tasks, [700], 2, p, **quiet)
    real = R.NeedleTrace

    def no_dense(*a, dense, **k):
        assert not dense, "the dense forward ran although --reuse had it"
        return real(*a, dense=dense, **k)
    monkeypatch.setattr(R, "NeedleTrace", no_dense)
    got = R.run_retrieval(model, tok, hay, tmp_path / "b", tasks, [700], 2, p, reuse=[tmp_path / "a"], **quiet)
    again = R.run_retrieval(model, tok, hay, tmp_path / "c", tasks, [700], 2, p, reuse=[tmp_path / "b"], **quiet)
    monkeypatch.setattr(R, "NeedleTrace", real)
    assert got["reused_dense"] == 2 and again["reused_dense"] == 2
    key = ["seed", "pattern"]
    cols = ["score", "answer_logprob", "first_answer_token_rank", "needle_pairs_kept", "needle_mass_kept",
            "distant_pairs_kept", "continuation"]

    def by(df):
        return df.sort_values(key).reset_index(drop=True)
    for run in (got, again):
        c = by(run["cases"])
        assert (c[c.pattern == "dense"].reused_from == str(tmp_path / "a")).all()
        assert (c[c.pattern != "dense"].reused_from == "").all()
        pd.testing.assert_frame_equal(c[key + cols], by(fresh["cases"])[key + cols])
        tkey = ["seed", "pattern", "layer_idx", "head"]
        t = run["trace"].sort_values(tkey).reset_index(drop=True)
        pd.testing.assert_frame_equal(t, fresh["trace"].sort_values(tkey).reset_index(drop=True))
    dense_first = by(first["cases"])
    dense_first = dense_first[dense_first.pattern == "dense"].reset_index(drop=True)
    dense_got = by(got["cases"])
    dense_got = dense_got[dense_got.pattern == "dense"].reset_index(drop=True)
    assert dense_got.seconds.tolist() == dense_first.seconds.tolist()  # the measuring run's timing, kept
    # another model (three layers), or another length: nothing to take, dense runs
    other = focus_model(layers=3)
    r = R.run_retrieval(other, tok, hay, tmp_path / "d", tasks, [700], 1, p, settings={"model": model_identity(other)},
                        log=lambda s: None, reuse=[tmp_path / "a"])
    assert r["reused_dense"] == 0 and (r["cases"].reused_from == "").all()
    r = R.run_retrieval(model, tok, hay, tmp_path / "e", tasks, [760], 1, p, reuse=[tmp_path / "a"], **quiet)
    assert r["reused_dense"] == 0


def test_summary_intervals_and_router_against_random_by_hand():
    rows = []
    for seed in range(4):
        rows += [{"task": "t", "length": 100, "seed": seed, "pattern": "dense", "score": 1.0, "answer_logprob": -1.0},
                 {"task": "t", "length": 100, "seed": seed, "pattern": "hard_top2", "score": [1, 1, 0, 1][seed],
                  "answer_logprob": -2.0},
                 {"task": "t", "length": 100, "seed": seed, "pattern": "random_top2", "score": 0.0,
                  "answer_logprob": -3.0}]
    df = pd.DataFrame(rows).assign(distant_pairs_kept=0.5, needle_pairs_kept=0.5, needle_mass_kept=0.5, seconds=1.0,
                                   bare_forward_seconds=1.0)
    s = R.summary(df).set_index("pattern")
    assert s.loc["hard_top2", "relative"] == 0.75 and s.loc["hard_top2", "logprob_change"] == -1.0
    assert s.loc["hard_top2", "relative_lo"] <= 0.75 <= s.loc["hard_top2", "relative_hi"]
    assert not s.loc["dense", "dense_below_half"]
    d = R.paired_difference(df, "hard_top2", "random_top2").iloc[0]
    assert d.difference == 0.75 and d.verdict == "hard_top2 better"
    d = R.paired_difference(df, "hard_top2", "random_top2", "answer_logprob").iloc[0]
    assert d.difference == 1.0 and d.lo == d.hi == 1.0


@pytest.mark.parametrize("every,timings", [(1, 6), (8, 2)])
def test_bare_forward_is_timed_again_every_few_cases(tok, hay, tmp_path, monkeypatch, every, timings):
    """The cost unit follows the machine's load: 3 cases x 2 patterns, timed once per pattern on the
    first case, then again once BARE_EVERY cases have passed (hand count)."""
    calls = []
    real = R.bare_forward_seconds
    monkeypatch.setattr(R, "bare_forward_seconds", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(R, "BARE_EVERY", every)
    p = R.parse_retrieval_patterns("dense,random_top2", 4, 3)
    res = R.run_retrieval(focus_model(), tok, hay, tmp_path, R.parse_tasks("niah_single_2"), [600], 3, p,
                          log=lambda s: None)
    assert len(calls) == timings and (res["cases"].bare_forward_seconds > 0).all()


def test_moba_pattern_runs_and_restores_the_routers(tok, hay):
    from focus_lab.hf.retrofit import focus_config, routers
    model = focus_model(window=8, sinks=2)
    before = {i: r.proj.detach().clone() for i, r in routers(model).items()}
    cfg = focus_config(model)

    def restore():
        attach(model, cfg)
        for i, r in routers(model).items():
            r.proj.data.copy_(before[i])

    task = R.TASKS["niah_single_2"]
    case = R.make_case(task, hay, tok, 400, seed=0)
    rows, _ = R.run_case(model, tok, case, pats("dense,hard_top2,moba_matched"), task, R.moba_patcher(model, restore),
                         time_bare=[R.MOBA])
    moba = rows[2]
    assert moba["pattern"] == R.MOBA and moba["mode"] == "hard" and 0 < moba["distant_pairs_kept"] < 1
    assert moba["bare_forward_seconds"] > 0 and "bare_forward_seconds" not in rows[0]  # timed under the gate
    assert focus_config(model).num_groups == 4
    assert all(torch.equal(r.proj, before[i]) for i, r in routers(model).items())
    # the teacher-forced shortcut holds for the gate (cache_pattern): at every answer position the
    # forward of prompt + answer gives the logits of the forward cut after that position
    with R.moba_patcher(model, restore)(case, rows[:2]) as ch:
        assert moba["continuation"] == brute_greedy(model, tok, case, ch, task.max_new_tokens)
        assert prefix_logit_gap(model, case, ch) < 1e-4
    shuffled = dict(pats("shuffled_top2"))["shuffled_top2"]
    assert prefix_logit_gap(model, case, shuffled) > 1e-3  # not prefix-stable: the check can fail


def prefix_logit_gap(model, case, changes) -> float:
    """Largest |logit difference| between the full teacher-forced forward at each answer position
    and the forward of the sequence cut right after that position."""
    ids = torch.cat([case.input_ids, case.answer_ids])
    P, n = len(case.input_ids), len(case.answer_ids)
    with torch.no_grad():
        full = model(input_ids=ids[None], use_cache=False, focus=forward_state(model, **changes)).logits[0]
        gaps = [float((model(input_ids=ids[None, :P + t], use_cache=False, focus=forward_state(model, **changes))
                       .logits[0, -1] - full[P - 1 + t]).abs().max()) for t in range(n)]
    return max(gaps)


def test_prefix_stable_patterns():
    from focus_lab.hf.retrofit import focus_config
    cfg = focus_config(focus_model())
    for lab, ch in pats("dense,window,hard_top2,random_top2,hard_top2_match"):
        assert R.cache_pattern(cfg.replace(**ch)), lab
    assert R.cache_pattern(cfg.replace(mode="hard"))  # the MoBA gate's pattern
    assert R.cache_pattern(cfg.replace(**dict(pats("shuffled_top2"))["shuffled_top2"]))  # from the prefill's groups
    assert not R.cache_pattern(cfg.replace(mode="soft"))


# ------------------------------------------------------------------------------------------
# bad inputs

def test_bad_inputs_one_line(tok, hay, tmp_path):
    with pytest.raises(ConfigError, match="unknown retrieval task 'nope'; choose from passkey, niah_single_1"):
        R.parse_tasks("niah_single_2,nope")
    model = focus_model(max_positions=512)
    with pytest.raises(ConfigError, match="exceeds the model's 512 positions"):
        R.run_retrieval(model, tok, hay, tmp_path, R.parse_tasks("vt"), [600], 1, log=lambda s: None)
    short = PK.load_haystack([Document("short", "Anne walked to the house on the hill. " * 5)], tok, "short")
    with pytest.raises(CorpusError, match="holds only .* tokens"):
        R.make_case(R.TASKS["niah_single_2"], short, tok, 500, seed=0)
    with pytest.raises(ConfigError, match="name:N"):
        R.parse_retrieval_patterns("dense,hard_top2:x", 4, 2)


def test_answer_the_tokenizer_cannot_write_names_task_and_tokenizer():
    from focus_lab.hf.tiny import bpe_tokenizer
    letters = bpe_tokenizer(["the special magic number is here", string.ascii_letters])  # no digits
    with pytest.raises(ConfigError, match="task niah_single_2: tokenizer .* cannot write its answer"):
        R.answer_split(letters, ["1234567"], "niah_single_2")
    R.answer_split(letters, ["abc"], "vt")  # letters it can write


def test_cli_bad_inputs_exit_2_with_one_line():
    from typer.testing import CliRunner
    from focus_lab.cli import app
    r = CliRunner().invoke(app, ["probe", "retrieval", "--tasks", "bogus"])
    assert r.exit_code == 2 and "unknown retrieval task 'bogus'; choose from passkey" in r.output
    assert len(r.output.strip().splitlines()) == 1
    r = CliRunner().invoke(app, ["probe", "retrieval", "--cases", "0"])
    assert r.exit_code == 2 and "--cases 0" in r.output
    r = CliRunner().invoke(app, ["probe", "retrieval", "--reuse", "/nonexistent/run"])
    assert r.exit_code == 2 and "--reuse /nonexistent/run: not a folder this probe wrote" in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_cli_defaults_agree_with_the_library():
    from focus_lab import cli
    assert cli.RETRIEVAL_PATTERNS == R.DEFAULT_PATTERNS
    assert cli.RETRIEVAL_TASKS == ",".join(R.TASKS)


def test_restored_rows_every_pair_back_is_dense(tok, hay):
    """analyses/studies/restored_rows: with every row's pairs put back in every layer the hard
    pattern's answer log-prob is dense's (an independent full forward), with none put back it is
    the hard pattern's own; the row sets are where the module docstring puts them."""
    from analyses.studies import restored_rows as RR
    model = focus_model()
    case = R.make_case(R.TASKS["niah_single_2"], hay, tok, 900, seed=1)
    (_, dense_changes), (_, hard) = pats("dense,hard_top1")  # dense always comes first
    dense = brute_answer_logprob(model, case, dense_changes)
    plain = brute_answer_logprob(model, case, hard)
    assert dense != pytest.approx(plain, abs=1e-3)  # the mask changes this case's answer
    every = torch.arange(len(case.input_ids) + len(case.answer_ids))
    assert RR.answer_logprob(model, case, hard, RR.restore_patch(every, range(2))) == pytest.approx(dense, abs=2e-4)
    assert RR.answer_logprob(model, case, hard) == pytest.approx(plain, abs=2e-4)
    sets = RR.row_sets(case, question_tokens=16, radius=4)
    assert sets["question"][-1] == len(case.input_ids) + len(case.answer_ids) - 2
    assert set(sets["needle"].tolist()) <= set(sets["sentence"].tolist())
    # only the needle sentence's keys for the question rows: a subset of the pairs every row adds
    some = RR.restore_patch(sets["question"], range(2), sets["sentence"])
    assert len(some) == 2
    # the pairs, against a loop over the rows written from the definition
    for rows, keys in ((torch.tensor([3, 5]), None), (sets["question"], sets["sentence"])):
        want = {(0, i, j) for i in rows.tolist() for j in range(i + 1) if keys is None or j in keys.tolist()}
        add = RR.restore_patch(rows, [0], keys)["layers.0.kept"](None, None).add
        assert len(add) == len(want) and set(map(tuple, add.tolist())) == want
    with pytest.raises(ValueError, match="fewer than question_tokens"):
        RR.row_sets(case, question_tokens=10 ** 6)
    # the table: a row set named a+b restores both sets' rows; recovered = share of the loss back
    t = RR.restored_rows_table(model, case, "hard_top1", specs=(("both", "question+sentence", "all", None),))
    full = RR.row_sets(case)
    both = torch.tensor(sorted(set(full["question"].tolist()) | set(full["sentence"].tolist())))
    want = RR.answer_logprob(model, case, hard, RR.restore_patch(both, range(model.config.num_hidden_layers)))
    assert list(t.restored) == ["dense", "hard_top1", "hard_top1 + both"]
    assert t.answer_logprob[2] == pytest.approx(want, abs=1e-5)
    assert t.recovered[2] == pytest.approx((want - plain) / (dense - plain), abs=1e-3)

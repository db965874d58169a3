"""Retrieval suite: RULER's synthetic retrieval families, each failure traced to the mask.

Tasks are written from RULER's published definitions (Hsieh et al., "RULER: What's the Real
Context Size of Your Long-Context Language Models?", arXiv 2404.06654; repository NVIDIA/RULER,
task configs ``scripts/synthetic.yaml``, generators ``scripts/data/synthetic/niah.py``,
``variable_tracking.py``, ``common_words_extraction.py``, templates
``scripts/data/synthetic/constants.py``, metric ``string_match_all`` in
``scripts/eval/synthetic/constants.py``), plus the workbench's passkey probe
(``eval.passkey``) as one task of the suite:

=================  =========================================================================
task               definition (RULER config name; haystack; key -> value)
=================  =========================================================================
passkey            ``eval.passkey``: a 5-digit key stated twice, corpus haystack
niah_single_1      one needle; repeated noise sentences; word -> 7-digit number
niah_single_2      one needle; corpus haystack; word -> 7-digit number
niah_single_3      one needle; corpus haystack; word -> UUID
niah_multikey_1    4 needles (3 distractor keys); corpus haystack; word -> number
niah_multikey_2    haystack made of needles (other keys); word -> number
niah_multikey_3    haystack made of needles; UUID -> UUID (key-value retrieval over UUID pairs)
niah_multivalue    one key with 4 values (4 needles); corpus haystack; all 4 asked
niah_multiquery    4 keys, all 4 asked; corpus haystack
vt                 variable tracking: 1 chain of 4 hops in noise; all 5 names asked
cwe                common-words extraction: 10 words x 30 among others x 3; top 10 asked
=================  =========================================================================

A needle is RULER's ``"One of the special magic {numbers} for {key} is: {value}."``; the
question is RULER's template with its answer prefix, asked as the user turn of the tokenizer's
chat template with the assistant turn primed with the answer prefix (the passkey probe's
``chat`` format, the most confident one measured; docs/passkey_reference.md). Keys are RULER's
adjective-noun words (wonderwords' lists), numbers have 7 digits, UUIDs are version-4.
Differences from RULER, all in the task's favour or neutral: the corpus's held-out text replaces
Paul Graham's essays (default *Persuasion*); CWE has no few-shot example; the greedy budget per
task (``Task.max_new_tokens``) is smaller than RULER's (which only ever lowers a score).

A length L is RULER's ``max_seq_length``: prompt plus generated tokens, so the prompt holds
exactly ``L - max_new_tokens`` tokens and L may be the model's positions (8192 for SmolLM2).

Per (case, pattern): RULER's score (the share of the expected answers found, case-insensitive,
in the greedy output) and the teacher-forced log-probability of the answers (nats, summed over
the answers' tokens), which still ranks patterns where a 135M model's greedy answer fails. One
prefill serves both: the prompt but its last token goes through the KV cache once; the answers
are teacher-forced as one chunk after it, and the greedy answer decodes from a copy of the
prefill's cache (soft mode, which has no cache, uses full forwards: ``cache_pattern``; shuffled
groups permute the prefill's positions and give each later position a seeded random prefill
position's groups, ``core.Router._shuffle``). Where greedy's choice is every answer token
(the teacher-forced argmax), the answer is not decoded again (``cache_pattern``).

The trace (``TRACE_COLUMNS``): for every layer and head, the dense attention of the answer's
positions (the queries that predict an answer token) to the haystack tokens that carry an
answer (the needle's value tokens), the share each pattern's mask keeps of those pairs and of
that attention mass, which of them are copies (the key follows an earlier occurrence of the
query's token: ``ids[j - 1] == ids[i]``, the pair an induction head reads), and each head's
retrieval score (Wu et al., arXiv 2404.15574: the share of answer tokens whose strongest dense
attention, in that head, lands on a needle token equal to the token being predicted).
``failures`` names, for a case dense solves and a pattern fails, the layers and heads whose
needle attention that pattern dropped.

Source: docs/method.md §2 (patterns), §7 (controls at equal sparsity); docs/retrieval.md.
"""

from __future__ import annotations

import functools
import os
import re
import string
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from focus_lab.eval.needle_trace import NeedleTrace
from focus_lab.eval.probe import (  # noqa: F401  (the probe core)
    barrier, cache_ok, encode, eos_ids, fingerprint, forward, greedy, pairs_kept, run_units, shard, teacher_forced,
    tidy_frame)
from focus_lab.method.config import ConfigError

RETRIEVAL_SCHEMA = 2  # 2: reused_from (``--reuse``)
DEFAULT_PATTERNS = ("dense,window,default_top1,default,default+match,random_default,random_default+match,"
                    "shuffled_default,moba_matched")
BARE_EVERY = 8  # cases of one process between two timings of the bare forward (retrieval cost)
MOBA = "moba_matched"  # the MoBA block gate, its block top-k matched to the file's hard top-2's distant pairs kept
MOBA_MATCHED_TO = ("default", "hard_top2")  # the row MoBA's sparsity is matched to: the first of these run
DEFAULT_LENGTHS = (4096,)
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {type_v} for {key} is: {value}."
NIAH_TEMPLATE = ("Some special magic {type_v} are hidden within the following text. Make sure to memorize it. "
                 "I will quiz you about the {type_v} afterwards.\n{context}\nWhat are all the special magic "
                 "{type_v} for {query} mentioned in the provided text?")
NIAH_PREFIX = "The special magic {type_v} for {query} mentioned in the provided text are"
VT_TEMPLATE = ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
               "Question: Find all variables that are assigned the value {query} in the text above.")
VT_PREFIX = ("Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
             "assigned the value {query}, they are:")
CWE_TEMPLATE = ("Below is a numbered list of words. In these words, some appear more often than others. Memorize "
                "the ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the "
                "above list?")
CWE_PREFIX = "Answer: The top 10 words that appear most often in the list are:"
_MARK = "\u2063CONTEXT\u2063"

CASES_COLUMNS = ["schema_version", "task", "length", "seed", "pattern", "score", "answers_found", "answers",
                 "answer_logprob", "answer_tokens", "first_answer_token_rank", "distant_pairs_kept",
                 "needle_pairs_kept", "needle_mass_kept", "prompt_tokens", "needles", "needle_context", "continuation",
                 "expected", "mode", "top_k", "seconds", "prefill_seconds", "bare_forward_seconds", "reused_from"]
TRACE_COLUMNS = ["schema_version", "task", "length", "seed", "pattern", "layer_idx", "head", "dense_mass",
                 "mass_kept", "copy_mass", "copy_mass_kept", "pairs_kept", "copy_pairs", "copy_pairs_kept",
                 "retrieval_score"]


# ------------------------------------------------------------------------------------------
# tasks

@dataclass(frozen=True)
class Task:
    """One task of the suite (module docstring; RULER ``scripts/synthetic.yaml``).

    Attributes:
        name: the suite's name (RULER's config name, or ``passkey``); family: niah, variable
            tracking, common words, passkey; haystack: ``corpus`` (held-out text), ``noise``
            (RULER's repeated sentences), ``needles`` (needles with other keys), ``words`` (CWE's list).
        key_type, value_type: ``words``, ``numbers`` or ``uuids``; num_keys: needles' keys
            (``num_needle_k``: distractors when above ``num_queries``); num_values: values per key;
            num_queries: keys asked; max_new_tokens: the greedy budget (tokens).
    """

    name: str
    family: str
    haystack: str = "corpus"
    key_type: str = "words"
    value_type: str = "numbers"
    num_keys: int = 1
    num_values: int = 1
    num_queries: int = 1
    max_new_tokens: int = 16


TASKS: dict[str, Task] = {t.name: t for t in (
    Task("passkey", "passkey", max_new_tokens=8),
    Task("niah_single_1", "niah_single", haystack="noise"),
    Task("niah_single_2", "niah_single"),
    Task("niah_single_3", "niah_single", value_type="uuids", max_new_tokens=48),
    Task("niah_multikey_1", "niah_multikey", num_keys=4),
    Task("niah_multikey_2", "niah_multikey", haystack="needles"),
    Task("niah_multikey_3", "niah_multikey", haystack="needles", key_type="uuids", value_type="uuids",
         max_new_tokens=48),
    Task("niah_multivalue", "niah_multivalue", num_values=4, max_new_tokens=48),
    Task("niah_multiquery", "niah_multiquery", num_keys=4, num_queries=4, max_new_tokens=48),
    Task("vt", "variable_tracking", haystack="noise", max_new_tokens=32),
    Task("cwe", "common_words", haystack="words", max_new_tokens=64),
)}
DEPTHS = np.round(np.linspace(0, 100, num=40, endpoint=True)).astype(int)  # RULER's depth grid


def parse_tasks(spec: str) -> list[Task]:
    """Tasks from a comma list (``all``: every task). Raises ConfigError (one line listing the
    tasks) on an unknown or empty name."""
    names = list(TASKS) if spec.strip() == "all" else [x.strip() for x in spec.split(",") if x.strip()]
    bad = [n for n in names if n not in TASKS] or ([] if names else [spec])
    if bad:
        raise ConfigError(f"unknown retrieval task {bad[0]!r}; choose from {', '.join(TASKS)} (or 'all')")
    return [TASKS[n] for n in names]


@functools.lru_cache(maxsize=1)
def word_lists() -> tuple[list[str], list[str], list[str]]:
    """(CWE words: nouns, adjectives and verbs; nouns; adjectives) from wonderwords' lists, as
    RULER's generators read them (keys are ``adjective-noun``)."""
    from importlib.resources import files
    assets = files("wonderwords.assets")
    read = lambda f: [w.strip() for w in assets.joinpath(f).read_text().splitlines() if w.strip()]  # noqa: E731
    nouns, adjs, verbs = read("nounlist.txt"), read("adjectivelist.txt"), read("verblist.txt")
    return sorted(set(nouns + adjs + verbs)), nouns, adjs


class _Draw:
    """Random keys, values and words for one case (RULER's generators, seeded by the case)."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.cwe_words, self.nouns, self.adjs = word_lists()

    def value(self, kind: str) -> str:
        if kind == "numbers":
            return str(int(self.rng.integers(10 ** 6, 10 ** 7)))
        if kind == "uuids":
            return str(uuid.UUID(int=int.from_bytes(self.rng.bytes(16), "big"), version=4))
        return f"{self.adjs[self.rng.integers(len(self.adjs))]}-{self.nouns[self.rng.integers(len(self.nouns))]}"

    def distinct(self, kind: str, n: int) -> list[str]:
        out: list[str] = []
        while len(out) < n:
            v = self.value(kind)
            if v not in out:
                out.append(v)
        return out


# ------------------------------------------------------------------------------------------
# cases

@dataclass
class Unit:
    """A piece of the haystack: its text (or ready token ids) and the character spans of the
    answers it carries (a needle's value, a chain's names, a common word)."""

    text: str = ""
    ids: list[int] | None = None
    spans: list[tuple[int, int]] = field(default_factory=list)
    needle: bool = False
    idx: list[int] | None = None  # with ``ids``: the indices of its tokens that carry an answer


@dataclass
class RetrievalCase:
    """One prompt of the suite.

    Attributes:
        task, length (RULER's max_seq_length: prompt + budget, tokens), seed.
        input_ids: (P,) int64 prompt tokens, P = length - task.max_new_tokens, ending with the
            answer prefix (and the tokens before the first answer's first token: ``answer_split``).
        answer_ids: (n,) int64 the expected answers' tokens as teacher-forced (joined by ", ").
        answer_index: indices into ``answer_ids`` of the tokens that carry an answer (the
            teacher-forced log-probability sums over them; separators are forced, not scored).
        answers: the expected answer strings (RULER's outputs).
        needle_positions: (m,) int64 prompt positions of the tokens that carry an answer in
            the haystack (the keys of the traced pairs).
        needles: how many needles (answer-bearing units) the haystack holds.
    """

    task: str
    length: int
    seed: int
    input_ids: torch.Tensor
    answer_ids: torch.Tensor
    answer_index: list[int]
    answers: list[str]
    needle_positions: np.ndarray
    needles: int


def _span_tokens(tokenizer, text: str, spans: Sequence[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """(ids of ``text``, indices of its tokens overlapping any of ``spans``)."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    idx = [i for i, (s, e) in enumerate(enc["offset_mapping"]) if any(s < b and e > a for a, b in spans)]
    return list(enc["input_ids"]), idx


def answer_split(tokenizer, answers: Sequence[str], task: str = "") -> tuple[list[int], list[int], list[int]]:
    """(lead, answer_ids, answer_index) of ``" " + ", ".join(answers)``: split before the first
    answer's first token, so the prompt ends with ``lead`` (SmolLM2: the lone space token, as the
    passkey probe's ``answer_split``) and the answers are teacher-forced; ``answer_index``: the
    tokens (relative to the split) that overlap an answer.

    Raises ConfigError, naming the task and the tokenizer, when the answer's tokens do not decode
    back to the answers (characters the tokenizer cannot write, e.g. mapped to an unknown token)."""
    text, spans, pos = " ", [], 1
    for i, a in enumerate(answers):
        if i:
            text += ", "
            pos += 2
        spans.append((pos, pos + len(a)))
        text += a
        pos += len(a)
    ids, idx = _span_tokens(tokenizer, text, spans)
    first = idx[0] if idx else None
    decoded = tokenizer.decode(ids[first:]).replace(" ", "") if first is not None else ""
    if first is None or any(str(a).replace(" ", "") not in decoded for a in answers):
        raise ConfigError(f"task {task or '?'}: tokenizer {getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__} "
                          f"cannot write its answer ({answers[0]!r} comes back as {decoded[:40]!r}): the answer "
                          "cannot be teacher-forced or scored with it")
    return ids[:first], ids[first:], [i - first for i in idx]


def prompt_parts(tokenizer, template: str, prefix: str, fmt: str = "chat") -> tuple[list[int], list[int]]:
    """(head_ids, tail_ids) around the haystack for a RULER template (``{context}`` in it): the
    template as the user turn of the chat template, the assistant turn primed with ``prefix``
    (``chat``), or the template followed by a space and ``prefix`` (``plain``, with a BOS token
    when the tokenizer adds one). Raises ConfigError for ``chat`` without a chat template."""
    from focus_lab.data import bos_token_to_prepend
    before, _, after = template.partition("{context}")
    if fmt == "chat":
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError("the retrieval suite's chat format needs a tokenizer with a chat template; this one "
                              "has none: use --format plain")
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": _MARK}], tokenize=False,
                                                 add_generation_prompt=True)
        pre, _, post = rendered.partition(_MARK)
        return encode(tokenizer, pre + before), encode(tokenizer, after + post + prefix)
    bos = bos_token_to_prepend(tokenizer)
    return ([bos] if bos is not None else []) + encode(tokenizer, before), encode(tokenizer, after + " " + prefix)


def _needle_unit(text: str, answers: Sequence[str], lead: str) -> Unit:
    """A unit ``lead + text`` whose spans are every occurrence of the ``answers`` in it."""
    full = lead + text
    spans = [(m.start(), m.end()) for a in answers for m in re.finditer(re.escape(a), full)]
    return Unit(full, spans=spans, needle=True)


def _fill_units(tokenizer, units: list[Unit], make: Callable[[int], Unit], C: int) -> list[Unit]:
    """Units ``make(i)`` for i = 0, 1, ... until, with ``units`` (the needles), they hold at
    least ``C`` tokens; the needles are inserted later."""
    have = sum(len(encode(tokenizer, u.text)) for u in units)
    out: list[Unit] = []
    i = 0
    while have < C:
        u = make(i)
        u.ids = encode(tokenizer, u.text)
        have += len(u.ids)
        out.append(u)
        i += 1
    return out


def _insert(filler: list[Unit], needles: list[Unit], rng: np.random.Generator) -> list[Unit]:
    """Needles at random unit boundaries (RULER: ``random.sample`` of insertion indexes), in order."""
    idx = sorted(rng.choice(len(filler) + 1, size=len(needles), replace=True).tolist())
    out, k = [], 0
    for i in range(len(filler) + 1):
        while k < len(needles) and idx[k] == i:
            out.append(needles[k])
            k += 1
        if i < len(filler):
            out.append(filler[i])
    return out


def _tokens(tokenizer, units: list[Unit], C: int, strict: bool = True) -> tuple[list[int], list[int], int]:
    """(ids, answer positions, needles) of the units' tokens, exactly ``C`` of them: with
    ``strict`` the excess is cut from the last filler units (a needle is never cut), else from
    the end (CWE's list: the needles beyond ``C`` are dropped). Raises ConfigError when the units
    hold fewer than ``C`` tokens, or when the needles alone exceed ``C``."""
    parts: list[tuple[list[int], list[int], bool]] = []
    for u in units:
        if u.needle and u.idx is not None:
            uid, idx = u.ids, u.idx
        elif u.needle:
            uid, idx = _span_tokens(tokenizer, u.text, u.spans)
        else:
            uid, idx = (u.ids if u.ids is not None else encode(tokenizer, u.text)), []
        parts.append((list(uid), idx, u.needle))
    total = sum(len(p[0]) for p in parts)
    if total < C:
        raise ConfigError(f"the haystack's units hold {total} tokens, fewer than the {C} the prompt needs")
    excess = total - C
    if strict:
        for p in reversed(parts):  # trim filler units from the end
            if excess and not p[2]:
                cut = min(excess, len(p[0]))
                del p[0][len(p[0]) - cut:]
                excess -= cut
        if excess:
            raise ConfigError(f"the haystack of {C} tokens cannot hold its needles: choose a longer length")
    ids: list[int] = []
    pos: list[int] = []
    starts: list[int] = []
    for uid, idx, is_needle in parts:
        if is_needle:
            pos += [len(ids) + i for i in idx]
            starts.append(len(ids))
        ids += uid
    if len(ids) > C:  # not strict: cut the end
        ids = ids[:C]
        pos = [q for q in pos if q < C]
        starts = [q for q in starts if q < C]
    return ids, pos, len(starts)


def _corpus_units(haystack, C: int, needles: list[Unit], rng: np.random.Generator) -> list[Unit]:
    """Held-out text: ``C`` tokens from a sentence start drawn by the case; the needles go in at
    the sentence starts nearest to depths drawn from RULER's 40-level grid."""
    from focus_lab.data import CorpusError
    n = len(haystack.ids)
    need = C  # the needles' tokens are counted again when cut; draw enough text
    if n < need:
        raise CorpusError(f"the haystack text {haystack.name or ''} holds only {n} tokens; this prompt needs "
                          f"{need} haystack tokens: choose a shorter length or a longer corpus")
    starts = haystack.sentence_starts[haystack.sentence_starts <= n - need]
    s0 = int(starts[rng.integers(len(starts))]) if len(starts) else 0
    local = haystack.sentence_starts[(haystack.sentence_starts > s0) & (haystack.sentence_starts < s0 + need)] - s0
    cand = np.concatenate([[0], local, [need]])
    depths = sorted(rng.choice(DEPTHS, size=len(needles), replace=False).tolist())
    cuts = [int(cand[np.argmin(np.abs(cand - d / 100 * need))]) for d in depths]
    hay = haystack.ids[s0:s0 + need].tolist()
    out, last = [], 0
    for cut, nd in zip(cuts, needles):
        out.append(Unit(ids=hay[last:cut]))
        out.append(nd)
        last = cut
    out.append(Unit(ids=hay[last:]))
    return out


def make_case(task: Task, haystack, tokenizer, length: int, seed: int, fmt: str = "chat") -> RetrievalCase:
    """Build one prompt of ``length - task.max_new_tokens`` tokens (module docstring).

    Args:
        haystack: ``passkey.Haystack`` of the corpus's held-out text (used by corpus tasks).
        length: RULER's max_seq_length (prompt + budget), tokens; seed: the case seed (keys,
            values, needle depths and the haystack's start are functions of it and the task).
    Raises:
        ConfigError: a length that leaves no room for the haystack; a tokenizer that cannot
            split the answer (``answer_split``). CorpusError: a haystack too short (its tokens).
    """
    P = length - task.max_new_tokens
    if task.name == "passkey":
        from focus_lab.eval import passkey
        depth = float(DEPTHS[np.random.default_rng([seed, 3]).integers(len(DEPTHS))])
        pc = passkey.make_case(haystack, tokenizer, P, depth, seed, fmt)
        return RetrievalCase(task.name, length, seed, pc.input_ids, pc.answer_ids, list(pc.key_index), [pc.key],
                             pc.needle_key_positions, 1)
    rng = np.random.default_rng([seed, sum(map(ord, task.name))])
    draw = _Draw(rng)
    lead = " " if task.haystack == "corpus" else ""
    sep = "\n" if task.haystack in ("noise", "needles") else ""
    if task.family == "variable_tracking":
        names: list[str] = []
        while len(names) < 5:  # RULER: 5 upper-case letters per variable, all distinct
            name = "".join(rng.choice(list(string.ascii_uppercase), size=5))
            if name not in names:
                names.append(name)
        value = str(int(rng.integers(10000, 99999)))
        chain = [f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]}" for j in range(4)]
        answers = names
        needles = [_needle_unit(c + sep, answers, lead) for c in chain]
        template, prefix = VT_TEMPLATE.replace("{query}", value), VT_PREFIX.format(num_v=5, query=value)
    elif task.family == "common_words":
        words = list(rng.choice(draw.cwe_words, size=len(draw.cwe_words), replace=False))
        common = [str(w) for w in words[:10]]
        answers = common
        needles = []
        template, prefix = CWE_TEMPLATE, CWE_PREFIX
    else:
        type_v = task.value_type
        keys = draw.distinct(task.key_type, task.num_keys)
        values = [[draw.value(task.value_type) for _ in range(task.num_values)] for _ in keys]
        asked = sorted(rng.choice(task.num_keys, size=task.num_queries, replace=False).tolist())
        answers = [v for i in asked for v in values[i]]
        order = [(k, v) for k, vs in zip(keys, values) for v in vs]
        order = [order[i] for i in rng.permutation(len(order))]
        needles = [_needle_unit(NEEDLE.format(type_v=type_v, key=k, value=v) + sep,
                                answers if k in [keys[i] for i in asked] else [], lead) for k, v in order]
        queries = [keys[i] for i in asked]
        query = queries[0] if len(queries) == 1 else ", ".join(queries[:-1]) + ", and " + queries[-1]
        single = task.num_queries * task.num_values == 1
        tmpl = NIAH_TEMPLATE
        pre = NIAH_PREFIX
        if single:  # RULER's singular wording for one answer
            tmpl = tmpl.replace("Some", "A").replace("are all", "is").replace("are", "is")
            pre = pre.replace("are", "is")
            type_v = type_v[:-1]
        template = tmpl.replace("{type_v}", type_v).replace("{query}", query)
        prefix = pre.format(type_v=type_v, query=query)
    head, tail = prompt_parts(tokenizer, template, prefix, fmt)
    lead_ids, answer_ids, answer_index = answer_split(tokenizer, _answer_order(answers, needles), task.name)
    tail = tail + lead_ids
    C = P - len(head) - len(tail)
    if C < 1 + sum(len(encode(tokenizer, u.text)) for u in needles):
        raise ConfigError(f"retrieval length {length} leaves no room for the {task.name} haystack: the prompt's "
                          f"fixed parts take {P - C} tokens and the needles "
                          f"{sum(len(encode(tokenizer, u.text)) for u in needles)}")
    if task.haystack == "corpus":
        units = _corpus_units(haystack, C - sum(len(encode(tokenizer, u.text)) for u in needles), needles, rng)
    elif task.haystack == "noise":
        filler = _fill_units(tokenizer, needles, lambda i: Unit(NOISE + "\n"), C)
        units = _insert(filler, needles, rng) if task.family != "variable_tracking" else _insert_in_order(filler, needles, rng)
    elif task.haystack == "needles":
        def distractor(i: int) -> Unit:
            return Unit(NEEDLE.format(type_v=task.value_type, key=draw.value(task.key_type),
                                      value=draw.value(task.value_type)) + "\n")
        filler = _fill_units(tokenizer, needles, distractor, C)
        units = _insert(filler, needles, rng)
    else:  # words: RULER's numbered list, the common words 30 times, the others 3 times
        units = _cwe_units(tokenizer, common, words[10:], C, length)
    ids, pos, n_needles = _tokens(tokenizer, units, C, strict=task.haystack != "words")
    ids = head + ids + tail
    assert len(ids) == P, (len(ids), P)
    pos = np.asarray([len(head) + p for p in pos], dtype=np.int64)
    return RetrievalCase(task.name, length, seed, torch.tensor(ids, dtype=torch.long),
                         torch.tensor(answer_ids, dtype=torch.long), answer_index, list(answers), pos, n_needles)


def _answer_order(answers: list[str], needles: list[Unit]) -> list[str]:
    """The answers in the order their first needle appears (multi-value: the needles' order),
    the order they are teacher-forced in; answers in no needle (CWE) keep their order."""
    first = {}
    for i, u in enumerate(needles):
        for a in answers:
            if a in u.text and a not in first:
                first[a] = i
    return sorted(answers, key=lambda a: (first.get(a, len(needles)), answers.index(a)))


def _insert_in_order(filler: list[Unit], chain: list[Unit], rng: np.random.Generator) -> list[Unit]:
    """A variable chain's statements at random boundaries, in chain order (RULER's ``vt``)."""
    return _insert(filler, chain, rng)


def _cwe_units(tokenizer, common: list[str], others: list[str], C: int, length: int) -> list[Unit]:
    """RULER's CWE list ``1. w 2. w ...``: the ``common`` words 30 times each and other words 3
    times each (6 and 1 below 4096 tokens, as RULER), shuffled, as many other words as make the
    list reach ``C`` tokens (the end is cut to ``C``); an item carrying a common word is a needle.
    An item's tokens are those of its number (``" 12."``) then of its word (``" w"``), each
    tokenized once."""
    reps = (30, 3) if length >= 4096 else (6, 1)
    others = others[:C // (2 * reps[1]) + 1]  # an item is at least 2 tokens: more never fit
    most = len(common) * reps[0] + len(others) * reps[1]
    texts = [" " + w for w in common + others] + [("" if i == 0 else " ") + f"{i + 1}." for i in range(most)]
    enc = dict(zip(texts, tokenizer(texts, add_special_tokens=False)["input_ids"]))  # one batch call

    def ids(text: str) -> list[int]:
        return list(enc[text])

    def units(n_other: int) -> list[Unit]:
        words = common * reps[0] + others[:n_other] * reps[1]
        order = np.random.default_rng([len(words), 5]).permutation(len(words))
        out = []
        for i, w in enumerate(words[j] for j in order):
            num = ("" if i == 0 else " ") + f"{i + 1}."
            a, b = ids(num), ids(" " + w)
            out.append(Unit(f"{num} {w}", ids=a + b, needle=w in common,
                            idx=list(range(len(a), len(a) + len(b))) if w in common else None))
        return out

    def size(us: list[Unit]) -> int:
        return sum(len(u.ids) for u in us)

    lo, hi = 0, len(others)
    if size(units(hi)) < C:
        raise ConfigError(f"cwe: {len(others)} words cannot fill {C} tokens")
    while lo < hi:  # the fewest other words whose list reaches C tokens
        mid = (lo + hi) // 2
        if size(units(mid)) >= C:
            hi = mid
        else:
            lo = mid + 1
    return units(lo)


# ------------------------------------------------------------------------------------------
# patterns

def parse_retrieval_patterns(spec: str, routers, cases: int, num_layers: int | None = None
                             ) -> list[tuple[str, dict, int]]:
    """[(label, FocusConfig changes, cases)] from a comma list of ``evaluate.parse_patterns``
    names, plus ``moba_matched`` (the MoBA block gate, its block top-k matched to ``hard_top2``'s
    distant pairs kept; ``baselines.MoBARouter``); ``name:N`` runs that pattern on the first N
    cases only (default ``cases``). ``dense`` is always run (the trace's reference), first.
    Raises ConfigError on an unknown name or a bad count."""
    from focus_lab.eval.evaluate import pattern_changes
    from focus_lab.patterns.pattern import split_top_level
    out: list[tuple[str, dict, int]] = []
    for item in [x.strip() for x in split_top_level(spec, ",") if x.strip()]:
        name, _, n = item.partition(":")
        if n and (not n.isdigit() or int(n) < 1):
            raise ConfigError(f"pattern {item!r}: write name:N with N >= 1 cases")
        k = min(int(n), cases) if n else cases
        out.append((name, {"mode": "hard"} if name == MOBA else pattern_changes(name, routers, num_layers), k))
    if not out:
        raise ConfigError("--patterns is empty")
    if not any(lab == "dense" for lab, _, _ in out):
        out.insert(0, ("dense", {"mode": "dense", "assignment": "router"}, cases))
    dense = [p for p in out if p[0] == "dense"]
    return [(dense[0][0], dense[0][1], cases)] + [p for p in out if p[0] != "dense"]


def cache_pattern(config) -> bool:
    """Whether a pattern decodes through the KV cache (``probe.cache_ok``) and is prefix-stable:
    its mask for query i depends only on tokens ``<= i`` (and the case's length), so the
    teacher-forced forward's argmax at an answer position is what greedy decoding picks there
    while greedy follows the answer. Every pattern but soft mode: shuffled groups qualify (the
    prefill's positions are permuted, each later position draws a prefill position by its own
    index, ``core.Router._shuffle``); the MoBA gate qualifies (its blocks are fixed by the case's
    length, a query scores strictly past, complete blocks, and its router keeps the gate's keys of
    the positions it has seen: ``baselines.MoBARouter``)."""
    return cache_ok(config)


def moba_patcher(model, restore: Callable[[], object], default_kept: float = 0.53) -> Callable:
    """The ``moba`` argument of ``run_case``: a context manager that attaches MoBA block-gate
    routers in every layer (``baselines.use_moba``: blocks of ``min(window, ceil(L / K))``
    tokens over the case's ``length`` L, no random layers, k in every layer), yields the hard
    pattern whose block top-k keeps the distant pairs nearest to the case's ``hard_top2`` row
    (``baselines.moba_matched_top_k``; ``default_kept`` without one), and calls ``restore()``
    (e.g. ``load_routers`` of the file in use) on exit, after detaching the MoBA routers, also
    after an error."""
    from contextlib import contextmanager

    @contextmanager
    def patch(case: RetrievalCase, rows: list[dict]):
        from focus_lab.eval.baselines import moba_matched_top_k, use_moba
        from focus_lab.hf.retrofit import forward_state, routers
        base = forward_state(model).config.replace(random_layers=None, layer_top_k=None, top_k_budgets=None,
                                                   key_shift=0, match_shifts=None, key_router=False)
        kept = [r["distant_pairs_kept"] for lab in MOBA_MATCHED_TO for r in rows if r["pattern"] == lab]
        try:
            cfg = use_moba(model, base, case.length)
            bs = next(iter(routers(model).values())).block_size
            k = moba_matched_top_k(kept[0] if kept else default_kept, case.length, bs, cfg.window, cfg.sink_tokens)
            yield {"mode": "hard", "top_k": min(k, cfg.num_groups), "assignment": "router"}
        finally:
            from focus_lab.hf.retrofit import detach, is_attached
            if is_attached(model):
                detach(model)
            restore()
    return patch


# ------------------------------------------------------------------------------------------
# one case through the model

def copy_pairs(ids: torch.Tensor, rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """(r, m) bool: pair (i, j) is a copy when key j follows an earlier occurrence of query i's
    token, ``ids[j - 1] == ids[i]`` (the induction pair; ``rules.match.match_pairs`` shift 1).
    ids: (T,) the sequence; rows: (r,) query positions; keys: (m,) key positions >= 0."""
    prev = torch.where(keys > 0, ids[(keys - 1).clamp(min=0)], torch.full_like(keys, -1))  # (m,)
    return ids[rows][:, None] == prev[None, :]


def answer_logprob(logits: torch.Tensor, case: RetrievalCase) -> float:
    """The teacher-forced log-prob of ``case``'s answer values (nats): ``logits`` (n, V) are the
    predictions of its n answer tokens; summed over the value tokens (``case.answer_index``)."""
    logp = torch.log_softmax(logits.float(), -1)  # (n, V)
    tok_lp = logp.gather(1, case.answer_ids.to(logp.device)[:, None])[:, 0]  # (n,)
    return float(tok_lp[torch.as_tensor(case.answer_index, device=logp.device)].sum())


def needle_context(tokenizer, case: RetrievalCase, radius: int = 40) -> str:
    """The text around the case's first needle, its answer tokens between ``[[`` and ``]]``
    (``radius`` tokens either side): what the Retrieval page shows of a haystack."""
    pos = np.asarray(case.needle_positions)
    if not len(pos):
        return ""
    a = int(pos[0])
    b = int(pos[(pos <= a + radius)].max())
    ids = case.input_ids.tolist()
    return (tokenizer.decode(ids[max(0, a - radius):a]) + "[[" + tokenizer.decode(ids[a:b + 1]) + "]]"
            + tokenizer.decode(ids[b + 1:b + 1 + radius]))


def score(text: str, answers: Sequence[str]) -> tuple[float, int]:
    """RULER's ``string_match_all`` for one output: (share of ``answers`` found in ``text``,
    case-insensitive; how many)."""
    low = text.lower()
    found = sum(1 for a in answers if str(a).lower() in low)
    return found / len(answers), found


@dataclass
class DenseCase:
    """What a case's dense forward gives the case's other patterns, kept so that another run of
    the same case may skip it (``--reuse``; ``save_dense``, ``find_dense``).

    Attributes:
        row: the dense row (``CASES_COLUMNS``); trace: its trace rows (``TRACE_COLUMNS``);
        probs: {layer_idx: (H, r, m)} dense attention of the queries that predict an answer token
            (r) to the needle's answer tokens (m), and argmax: {layer_idx: (H, r)} each head's
            strongest key (``NeedleTrace``): the reference every pattern's trace is measured on;
        source: the run folder that computed it ('' for this run).
    """
    row: dict
    trace: list[dict]
    probs: dict[int, torch.Tensor]
    argmax: dict[int, torch.Tensor]
    source: str = ""


def run_case(model, tokenizer, case: RetrievalCase, patterns: list[tuple[str, dict]], task: Task,
             moba: Callable | None = None, time_bare: Sequence[str] = (),
             dense: DenseCase | None = None) -> tuple[list[dict], list[dict]]:
    """``run_case_dense`` without the dense forward's ``DenseCase``."""
    rows, trace, _ = run_case_dense(model, tokenizer, case, patterns, task, moba, time_bare, dense)
    return rows, trace


@torch.no_grad()
def run_case_dense(model, tokenizer, case: RetrievalCase, patterns: list[tuple[str, dict]], task: Task,
                   moba: Callable | None = None, time_bare: Sequence[str] = (),
                   dense: DenseCase | None = None) -> tuple[list[dict], list[dict], DenseCase | None]:
    """Run one prompt under each pattern (``[(label, FocusConfig changes)]``, dense first; each
    with its own FocusForward, the model's config unchanged): one prefill, the answers
    teacher-forced, the greedy answer (module docstring); then the trace (``TRACE_COLUMNS``).

    ``dense``: the case's dense forward from another run (``find_dense``): the ``dense`` pattern
    is not run; its row (``reused_from``: the run that computed it) and trace rows are taken, and
    its attention to the needle is the other patterns' trace reference.

    ``moba``: a context-manager factory ``moba(case, rows so far)`` yielding FocusConfig changes,
    that puts the MoBA routers in place for the ``moba_matched`` pattern and restores the model's
    routers on exit (``moba_patcher``).
    ``time_bare``: the labels whose row gets ``bare_forward_seconds``, one bare forward of the
    prompt under that pattern (``bare_forward_seconds``), timed inside the pattern's context
    (so the MoBA gate's too); the other rows get none.
    Returns (case rows, trace rows) without ``schema_version``, and the ``DenseCase`` of this
    case (None when no dense pattern ran or was given).
    """
    import contextlib
    from focus_lab.hf.retrofit import FocusCache, FocusForward, forward_state
    from focus_lab.hf.state import rewind_point
    dev = next(model.parameters()).device
    P, n = len(case.input_ids), len(case.answer_ids)
    ids = torch.cat([case.input_ids, case.answer_ids]).to(dev)  # (P + n,)
    rows = torch.arange(P - 1, P - 1 + n)  # the queries that predict the answer's tokens
    needle = torch.as_tensor(case.needle_positions, dtype=torch.long)
    value_rows = torch.as_tensor(case.answer_index, dtype=torch.long)
    eos = eos_ids(model)
    answers = case.answers
    context = needle_context(tokenizer, case)
    rows_out, traces = [], {}
    dense_probs = dense_argmax = None
    for label, changes in patterns:
        if label == "dense" and dense is not None:  # taken from the run that computed it
            rows_out.append({**dense.row, "reused_from": dense.source})
            dense_probs, dense_argmax = dense.probs, dense.argmax
            continue
        ctx = moba(case, rows_out) if label == MOBA else contextlib.nullcontext(changes)
        with ctx as ch:
            state = forward_state(model, cache=True, **ch)
            cfg = state.config
            use_cache = cache_pattern(cfg)
            trace = NeedleTrace(model, rows, needle, cfg, dense=cfg.mode == "dense")
            t0 = time.perf_counter()
            with trace:
                if use_cache:
                    res = forward(model, ids[:P - 1], keep=1, use_cache=True, focus=state)
                    t_pre = time.perf_counter() - t0
                    past = res.past_key_values
                    rewind = rewind_point(past, state.cache)  # the greedy answer decodes from here
                    logits = forward(model, ids[P - 1:P - 1 + n], keep=n, use_cache=True, past_key_values=past,
                                      focus=state).logits[0, -n:].float()  # (n, V)
                else:
                    rewind = None
                    # soft mode (no cache): the whole prompt + answer in one forward
                    logits = forward(model, ids, keep=n + 1, use_cache=False,
                                      focus=state).logits[0, -(n + 1):-1].float()  # (n, V)
                    t_pre = time.perf_counter() - t0
            _, rank, m = teacher_forced(logits, case.answer_ids, case.answer_index[0])
            if not use_cache:  # soft mode: Sinkhorn sees the whole sequence, so greedy from the prompt
                m = 0
            forced = case.answer_ids[:m].tolist()

            def done(toks: list[int]) -> bool:
                return score(tokenizer.decode(toks), answers)[1] == len(answers)

            if use_cache:
                past0, fcache = rewind() if m < n else (None, None)
                gstate = FocusForward(cfg, fcache if fcache is not None else FocusCache())
            else:
                past0, gstate = None, FocusForward(cfg)
            # greedy after the prompt and the agreed answer tokens; the cache holds ids[:P - 1]
            seq = torch.cat([ids[:P], torch.tensor(forced, dtype=ids.dtype, device=ids.device)])
            cont = greedy(model, seq, task.max_new_tokens, done, eos, use_cache, gstate, past0, P - 1, forced)
            dt = time.perf_counter() - t0
            bare = bare_forward_seconds(model, case.input_ids.to(dev), ch) if label in time_bare else None
        text = tokenizer.decode(cont)
        sc, found = score(text, answers)
        frac = pairs_kept(cfg, trace.pairs_kept, P)
        if cfg.mode == "dense":
            dense_probs, dense_argmax = trace.probs, trace.argmax
        traces[label] = trace.kept
        rows_out.append({"task": case.task, "length": case.length, "seed": case.seed, "pattern": label,
                         "score": sc, "answers_found": found, "answers": len(answers),
                         "answer_logprob": answer_logprob(logits, case),
                         "answer_tokens": len(case.answer_index), "first_answer_token_rank": rank,
                         "distant_pairs_kept": frac, "prompt_tokens": P, "needles": case.needles,
                         "needle_context": context,
                         "continuation": text, "expected": " | ".join(map(str, answers)), "mode": cfg.mode,
                         "top_k": cfg.top_k if cfg.mode == "hard" else None, "seconds": dt,
                         "prefill_seconds": t_pre, "reused_from": "",
                         **({} if bare is None else {"bare_forward_seconds": bare})})
    trace_rows = _trace_rows(case, ids.cpu(), rows, needle, value_rows, dense_probs, dense_argmax, traces)
    if dense is not None and any(lab == "dense" for lab, _ in patterns):
        trace_rows = list(dense.trace) + trace_rows
    by = {}
    for r in trace_rows:
        d = by.setdefault(r["pattern"], [0.0, 0.0, []])
        d[0] += r["dense_mass"]
        d[1] += r["mass_kept"]
        d[2].append(r["pairs_kept"])
    for r in rows_out:
        d = by.get(r["pattern"])
        r["needle_pairs_kept"] = float(np.mean(d[2])) if d else float("nan")
        r["needle_mass_kept"] = d[1] / d[0] if d and d[0] > 0 else float("nan")
    made = None
    if dense_probs is not None:
        made = dense if dense is not None else DenseCase(
            row=(row := next(r for r in rows_out if r["mode"] == "dense")),
            trace=[r for r in trace_rows if r["pattern"] == row["pattern"]], probs=dense_probs, argmax=dense_argmax)
    return rows_out, trace_rows, made


def _trace_rows(case: RetrievalCase, ids: torch.Tensor, rows: torch.Tensor, needle: torch.Tensor,
                value_rows: torch.Tensor, probs: dict, argmax: dict, kept: dict) -> list[dict]:
    """Per (pattern, layer, head): the trace's columns (``TRACE_COLUMNS``), over the queries that
    predict an answer's token (``value_rows``) and the needle's answer tokens as keys."""
    if not probs:
        return []
    vr = value_rows
    q = rows[vr]  # (r,) absolute positions of the value-predicting queries
    cp = copy_pairs(ids, q, needle).float()  # (r, m)
    target = ids[q + 1]  # (r,) the token each of them predicts
    out = []
    for layer in sorted(probs):
        p = probs[layer][:, vr]  # (H, r, m)
        am = argmax[layer][:, vr]  # (H, r)
        # Wu et al.: the head's strongest key is a needle token equal to the predicted token
        on_needle = (am[..., None] == needle[None, None, :]).any(-1)  # (H, r)
        hit = on_needle & (ids[am] == target[None, :])
        rscore = hit.float().mean(-1)  # (H,)
        dense_mass = p.sum(-1).mean(-1)  # (H,)
        copy_mass = (p * cp).sum(-1).mean(-1)
        for label, k in kept.items():
            if layer not in k:
                continue
            kk = k[layer][vr]  # (r, m)
            mass_kept = (p * kk).sum(-1).mean(-1)  # (H,)
            copy_kept = (p * kk * cp).sum(-1).mean(-1)
            n_copy = float(cp.sum())
            for h in range(p.shape[0]):
                out.append({"task": case.task, "length": case.length, "seed": case.seed, "pattern": label,
                            "layer_idx": int(layer), "head": h, "dense_mass": float(dense_mass[h]),
                            "mass_kept": float(mass_kept[h]), "copy_mass": float(copy_mass[h]),
                            "copy_mass_kept": float(copy_kept[h]), "pairs_kept": float(kk.mean()),
                            "copy_pairs": int(n_copy),
                            "copy_pairs_kept": float((kk * cp).sum() / n_copy) if n_copy else float("nan"),
                            "retrieval_score": float(rscore[h])})
    return out


# ------------------------------------------------------------------------------------------
# the suite: cases, resume, shards, tables

def cases_frame(rows: list[dict]) -> pd.DataFrame:
    """The tidy ``cases`` table (``CASES_COLUMNS``) from ``run_case`` rows."""
    return tidy_frame(rows, CASES_COLUMNS, RETRIEVAL_SCHEMA)


def trace_frame(rows: list[dict]) -> pd.DataFrame:
    """The tidy ``trace`` table (``TRACE_COLUMNS``) from ``run_case`` trace rows (float32 masses)."""
    df = tidy_frame(rows, TRACE_COLUMNS, RETRIEVAL_SCHEMA, ints=())
    for c in ("dense_mass", "mass_kept", "copy_mass", "copy_mass_kept", "pairs_kept", "copy_pairs_kept",
              "retrieval_score"):
        df[c] = df[c].astype("float32")
    return df


def bare_forward_seconds(model, ids: torch.Tensor, changes: dict, reps: int = 1) -> float:
    """Seconds of one forward of ``ids`` (T,) under a pattern, no hooks, no cache, no answer:
    the unit a case's cost is measured in (best of ``reps``)."""
    from focus_lab.hf.retrofit import forward_state
    best = float("inf")
    for _ in range(reps):
        state = forward_state(model, **changes)
        t0 = time.perf_counter()
        with torch.no_grad():
            forward(model, ids, keep=1, use_cache=False, focus=state)
        if ids.is_cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


DENSE_SUFFIX = ".dense.safetensors"  # a case's DenseCase tensors, beside its cases and trace files
SETTINGS_FILE = "settings.json"  # a case folder's settings (``run_retrieval``), read by ``find_dense``


def case_sha256(case: RetrievalCase) -> str:
    """sha256 of a case's token ids, prompt then answers (int64): two runs hold the same case
    exactly when these agree."""
    import hashlib
    ids = torch.cat([case.input_ids.long().cpu(), case.answer_ids.long().cpu()])  # (P + n,)
    return hashlib.sha256(ids.numpy().tobytes()).hexdigest()


def save_dense(path: str | os.PathLike, dense: DenseCase, case: RetrievalCase) -> None:
    """Write a case's dense attention to the needle (``DenseCase.probs``, ``.argmax``) as
    safetensors, atomically, with the case's ``case_sha256`` in the metadata. The dense row and
    trace rows stay in the case's parquet files."""
    from safetensors.torch import save_file
    from focus_lab.io import atomic_path
    tensors = {f"probs.{layer}": p.contiguous().cpu() for layer, p in dense.probs.items()}
    tensors.update({f"argmax.{layer}": a.contiguous().cpu() for layer, a in dense.argmax.items()})
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={"case_sha256": case_sha256(case)})


def dense_dirs(folders: Sequence[str | os.PathLike], settings: dict, task: Task) -> list[tuple[Path, Path]]:
    """The case folders of ``folders`` (earlier ``--out`` folders, in order) that ``find_dense``
    may take ``task``'s dense forwards from: made with the same model (``settings["model"]``,
    ``model_identity``) and task definition (the same ``fingerprint``), as (run folder, case
    folder). Empty without the model's identity (nothing could be matched)."""
    import json

    def key(s: dict) -> str:
        return fingerprint({"model": s.get("model"), "task": (s.get("tasks") or {}).get(task.name)})
    if settings.get("model") is None:
        return []
    want = key(settings)
    return [(Path(folder), f.parent) for folder in folders
            for f in sorted(Path(folder).glob(f"cases/*/{SETTINGS_FILE}")) if key(json.loads(f.read_text())) == want]


def find_dense(dirs: Sequence[tuple[Path, Path]], task: Task, case: RetrievalCase) -> DenseCase | None:
    """The case's dense forward from an earlier run of this suite (``--reuse``): the first of
    ``dirs`` (``dense_dirs``: same model and task) holding this case's files with the same token
    ids (``case_sha256``) and its dense tensors (``save_dense``; runs made before they were kept
    have none). Its row's ``reused_from`` names the run that computed it, however often reused.
    None when no folder has it."""
    from safetensors import safe_open
    stem = f"{task.name}_L{case.length}_s{case.seed}"
    sha = None
    for folder, d in dirs:
        tensors, cases_p, trace_p = (d / f"{stem}{DENSE_SUFFIX}", d / f"{stem}.cases.parquet",
                                     d / f"{stem}.trace.parquet")
        if not (tensors.is_file() and cases_p.is_file() and trace_p.is_file()):
            continue
        sha = sha or case_sha256(case)
        with safe_open(str(tensors), framework="pt") as f:
            if (f.metadata() or {}).get("case_sha256") != sha:
                continue
            probs = {int(k.split(".")[1]): f.get_tensor(k) for k in f.keys() if k.startswith("probs.")}
            argmax = {int(k.split(".")[1]): f.get_tensor(k) for k in f.keys() if k.startswith("argmax.")}
        rows = pd.read_parquet(cases_p)
        rows = rows[rows["mode"] == "dense"]
        if rows.empty:
            continue
        row = {k: v for k, v in rows.iloc[0].to_dict().items() if k != "schema_version"}
        trace = pd.read_parquet(trace_p)
        trace = [{k: v for k, v in r.items() if k != "schema_version"}
                 for r in trace[trace["pattern"] == row["pattern"]].to_dict("records")]
        origin = str(row.get("reused_from") or "")
        row = {**row, "pattern": "dense"}
        for r in trace:
            r["pattern"] = "dense"
        return DenseCase(row=row, trace=trace, probs=probs, argmax=argmax, source=origin or str(folder))
    return None


def run_retrieval(model, tokenizer, haystack, out_dir: str | os.PathLike, tasks: Sequence[Task],
                  lengths: Sequence[int] = DEFAULT_LENGTHS, cases: int = 4,
                  patterns: list[tuple[str, dict, int]] | None = None, seed: int = 0, fmt: str = "chat",
                  settings: dict | None = None, moba: Callable | None = None,
                  log: Callable[[str], None] = print, reuse: Sequence[str | os.PathLike] = ()) -> dict:
    """The suite over tasks x lengths x cases (seeds ``seed .. seed + cases - 1``) x patterns,
    resumable case by case and sharded across ``torchrun`` processes.

    Every case (all its patterns) is written when done, atomically, as
    ``out_dir/cases/<fingerprint>/<task>_L<length>_s<seed>.{cases,trace}.parquet`` (the
    fingerprint covers ``settings``, the patterns, the format and the task definitions), so a
    killed run loses at most the case in flight. Under ``torchrun`` process r of w takes every
    w-th case; all wait, then process 0 writes ``out_dir/cases.parquet``, ``trace.parquet`` and
    ``retrieval.json`` (settings, seconds, the bare forward per length and pattern).

    Each case folder also holds its ``settings.json`` and, per case, the dense forward's
    attention to the needle (``save_dense``), so that a later run may skip the dense forward:
    ``reuse``, earlier ``--out`` folders, gives each case the dense forward of the first that ran
    it with the same model, task and token ids (``dense_dirs``, ``find_dense``); its row's ``reused_from`` names
    that run. The other patterns always run.

    Args:
        patterns: ``parse_retrieval_patterns`` output (default ``DEFAULT_PATTERNS``);
            lengths: RULER's max_seq_length (prompt + budget), tokens; moba: see ``run_case``.
    Returns:
        {"cases": DataFrame, "trace": DataFrame, "seconds": float, "computed": int, "reused_dense": int
        (cases whose dense forward ``reuse`` gave),
        "bare_forward_seconds": {(length, pattern): latest seconds}} (on process 0; the others
        return their own part).
    Raises:
        ConfigError: a length beyond the model's positions (one line naming the limit), a task
            whose answer the tokenizer cannot split; CorpusError: a haystack too short
            (how many tokens it holds); all before any forward pass.
    """
    from focus_lab.hf.retrofit import forward_state
    from focus_lab.io import write_json, write_parquet
    out_dir = Path(out_dir)
    if patterns is None:
        patterns = parse_retrieval_patterns(DEFAULT_PATTERNS, forward_state(model).config, cases)
    n_pos = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
    for L in lengths:
        if n_pos and L > n_pos:
            raise ConfigError(f"retrieval length {L} exceeds the model's {n_pos} positions "
                              f"(max_position_embeddings): the longest is {n_pos}")
    # every prompt first: a short haystack or an unsplittable answer fails before any forward pass
    # case-major order: a run stopped early (or a shard) still covers every task
    todo = [(t, int(L), seed + i) for L in lengths for i in range(cases) for t in tasks]
    for t in tasks:  # one prompt per task and length first: bad inputs fail before any forward pass
        for L in lengths:
            make_case(t, haystack, tokenizer, int(L), seed, fmt)
    fp_settings = {**(settings or {}), "patterns": [(lab, ch) for lab, ch, _ in patterns], "format": fmt,
                   "tasks": {t.name: t.__dict__ for t in tasks}, "needle": NEEDLE, "noise": NOISE,
                   "schema": RETRIEVAL_SCHEMA, "haystack": getattr(haystack, "name", "")}
    fp = fingerprint(fp_settings)
    case_dir = out_dir / "cases" / fp
    rank, world = shard()
    if not (case_dir / SETTINGS_FILE).is_file():
        write_json(case_dir / SETTINGS_FILE, fp_settings)
    reused = [0]  # cases whose dense forward came from ``reuse``
    # the case folders each task may take dense forwards from, read once (``dense_dirs``)
    reuse_dirs = {t.name: dense_dirs(reuse, fp_settings, t) for t in tasks} if reuse else {}
    bare: dict[tuple[int, str], tuple[float, int]] = {}  # (length, label) -> (seconds, case count then)
    t_all = time.perf_counter()
    done = [0]  # cases computed by this process so far

    def paths(u):
        stem = f"{u[0].name}_L{u[1]}_s{u[2]}"
        return case_dir / f"{stem}.trace.parquet", case_dir / f"{stem}.cases.parquet"

    def compute(u):
        t, L, s = u
        case = make_case(t, haystack, tokenizer, L, s, fmt)
        pats = [(lab, ch) for lab, ch, k in patterns if s - seed < k]
        dense = find_dense(reuse_dirs[t.name], t, case) if reuse else None  # None: dense runs here
        reused[0] += dense is not None
        # the unit of cost, one bare forward of the prompt per pattern, re-timed every BARE_EVERY
        # cases of this process (and on a length's first), so it follows the machine's load
        stale = [lab for lab, _ in pats if (L, lab) not in bare or done[0] - bare[(L, lab)][1] >= BARE_EVERY]
        rows, trows, made = run_case_dense(model, tokenizer, case, pats, t, moba, time_bare=stale, dense=dense)
        if made is not None:  # also a reused one: a later run may take it from this folder
            save_dense(paths(u)[0].with_name(paths(u)[0].name.replace(".trace.parquet", DENSE_SUFFIX)), made, case)
        for r in rows:  # a stale label's row carries its new timing, every other row takes the last one
            if r.get("reused_from"):  # a reused row keeps its own run's timing
                continue
            if "bare_forward_seconds" in r:
                bare[(L, r["pattern"])] = (r["bare_forward_seconds"], done[0])
            r["bare_forward_seconds"] = bare[(L, r["pattern"])][0]
        done[0] += 1
        return trace_frame(trows), cases_frame(rows)

    def logged(u, frames, seconds, earlier):
        if not earlier:
            log(f"[retrieval] {u[0].name}_L{u[1]}_s{u[2]} ({seconds:.0f} s): "
                + ", ".join(f"{r.pattern} {r.score:.2f} {r.answer_logprob:.1f}" for r in frames[1].itertuples()))

    computed, _ = run_units(todo, paths, compute, write_parquet, logged, sharded=True, read_done=False)
    bare_last = {k: v for k, (v, _) in bare.items()}
    if world > 1:
        barrier()
        if rank != 0:
            return {"cases": None, "trace": None, "seconds": time.perf_counter() - t_all, "computed": computed,
                    "reused_dense": reused[0],
                    "bare_forward_seconds": bare_last}
    parts = [paths(u)[::-1] for u in todo]  # (cases, trace) of every case
    from focus_lab.eval.provenance import with_provenance
    cases_df = with_provenance(pd.concat([pd.read_parquet(c) for c, _ in parts if c.is_file()], ignore_index=True),
                               "pattern", forward_state(model).config, patterns,
                               ((settings or {}).get("routers") or {}).get("path"), as_is=(MOBA,))
    trace_df = pd.concat([pd.read_parquet(p) for _, p in parts if p.is_file()], ignore_index=True)
    write_parquet(out_dir / "cases.parquet", cases_df)
    write_parquet(out_dir / "trace.parquet", trace_df)
    seconds = time.perf_counter() - t_all
    write_json(out_dir / "retrieval.json", {"settings": fp_settings, "fingerprint": fp,
                                             "lengths": [int(x) for x in lengths], "cases": cases, "seed": seed,
                                             "computed_cases": computed, "reused_dense": reused[0],
                                             "reuse": [str(f) for f in reuse], "seconds": round(seconds, 1),
                                             "world_size": world,
                                             "files": ["cases.parquet", "trace.parquet"]})
    return {"cases": cases_df, "trace": trace_df, "seconds": seconds, "computed": computed, "reused_dense": reused[0],
            "bare_forward_seconds": bare_last}


# ------------------------------------------------------------------------------------------
# reading the tables: focus_lab.eval.retrieval_tables (no torch, for the dashboard)

from focus_lab.eval.retrieval_tables import (  # noqa: E402,F401
    COST_GOAL, RETRIEVAL_HEAD_THRESHOLD, cost_summary, failures, paired_difference, retrieval_heads, summary)

"""Passkey retrieval probe: can a pattern still find a 5-digit key hidden in a long text?

A haystack is cut from the held-out text of a corpus (Austen: *Persuasion*), a needle sentence
carrying a random 5-digit key is inserted at a sentence boundary near a depth of 0%..100% of the
haystack, and a question closes the prompt; every prompt has exactly ``length`` tokens. Per
(length, depth, case seed) and per attention pattern (dense, window + sinks, random groups, Focus
hard top-k, any name ``evaluate.parse_patterns`` accepts; docs/method.md §2.4, §7), the probe
records

* the greedy answer and whether it contains the key (exact match),
* the key's log-probability under teacher forcing (nats, summed over the key's tokens),
* per layer, the dense attention mass from the answer position to the needle's key tokens and
  whether the Focus hard mask (top-1, top-2) keeps those edges (docs/method.md §2.2, §6): where
  a miss comes from.

Prompt format, measured (dense, SmolLM2-135M-Instruct, shipped routers attached, Persuasion,
3 keys x depths 0/50/100 per length, 1 thread; ``focus-lab probe passkey --formats
plain,bare,chat --patterns dense --lengths 1024,2048 --depths 0,50,100``):

    format  (plain: instruction + text + question, continued; bare: no instruction;
             chat: the same as the user turn of the chat template, the assistant turn primed
             with "The pass key is")
            exact match 1K / 2K    mean key log-prob 1K / 2K (nats, 5 digit tokens)
    plain   9/9 / 9/9              -0.36 / -0.38
    bare    9/9 / 9/9              -0.68 / -0.74
    chat    9/9 / 9/9              -0.12 / -0.31   <- the default (most confident)

With the prompt ending at "is" (the space before the digits left to the model), dense exact
match was only plain 7/9 / 4/9, bare 3/9 / 4/9, chat 7/9 / 5/9: every miss was the space token
(the model went on with " the pass key ...") while the first digit after the space always
ranked first. Hence ``answer_split``: the prompt ends with the tokens before the key's first
token. Depth 0 puts the key's first mention inside the 64 sink tokens (docs/method.md §2.1) in
every format (chat: positions 58-62), so every pattern's answer query can attend to it there (at
4K tokens that was not enough for window and hard patterns). Details and the measured table of
every pattern: docs/passkey.md.

Greedy decoding is read off the teacher-forced forward while the model's greedy choice agrees
with the answer's tokens (then the continuation is the key: an exact match); from the first
disagreement it continues for real, through the KV cache for dense, window and every hard
pattern (random groups are a function of the position; shuffled groups permute the prefill's
positions, and each later position takes a seeded random prefill position's groups), by full
forwards in soft mode (no cache). Decoding stops at EOS, after ``max_new_tokens`` tokens,
once the key has appeared, or once the first number of the continuation has ended (a later
number would be a second guess).

Source: docs/method.md §2 (patterns), §6 (the open question: retrieval at 4K-8K), §7 (controls
at equal sparsity), §8 (conventions: nats, held-out text only).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from focus_lab.eval.needle_trace import NeedleTrace
from focus_lab.eval.probe import (  # noqa: F401  (the probe core)
    cache_ok, encode, eos_ids, fingerprint, forward, greedy, pairs_kept, run_units, teacher_forced, tidy_frame)
from focus_lab.method.config import ConfigError

PASSKEY_SCHEMA = 1
# 2: the prompt ends with the tokens before the key's first token (``answer_split``); 1 ended at
# "The pass key is" (a cell's fingerprint includes it, so cells of another version are not reused)
PROMPT_VERSION = 2
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
INTRO = ("There is an important piece of information hidden inside a lot of irrelevant text. "
         "Find it and memorize it. I will quiz you about it.")
QUESTION = "What is the pass key?"
ANSWER_PREFIX = "The pass key is"
FORMATS = ("plain", "bare", "chat")
DEFAULT_FORMAT = "chat"
DEFAULT_LENGTHS = (1024, 2048, 4096)
DEFAULT_DEPTHS = (0, 25, 50, 75, 100)
DEFAULT_PATTERNS = "dense,window,random_default,default_top1,default"
DEFAULT_MAX_NEW_TOKENS = 8
KEY_DIGITS = 5

CASES_COLUMNS = ["schema_version", "format", "length", "depth", "pattern", "seed", "key", "exact_match",
                 "key_logprob", "key_tokens", "first_key_token_rank", "distant_pairs_kept",
                 "needle_edges_kept", "needle_depth", "needle_position", "continuation", "mode",
                 "top_k", "seconds"]
LAYER_COLUMNS = ["schema_version", "format", "length", "depth", "seed", "key", "layer_idx",
                 "dense_mass_to_needle", "max_head_mass_to_needle", "kept_top1", "kept_top2"]

_SENTENCE_END = re.compile(r"[.!?][\"'\u201d\u2019)\]]*$")
_ABBREVIATION = re.compile(r"\b(Mr|Mrs|Ms|Dr|St|Capt|Col|Adm|Lt|Messrs)\.$")


# ------------------------------------------------------------------------------------------
# haystack and prompt

@dataclass
class Haystack:
    """The held-out text as one token sequence, with its sentence starts.

    Attributes:
        text: the documents joined by a blank line.
        ids: (n,) int64 token ids (no special tokens); offsets: (n, 2) int64 ``[start, end)``
            character offsets of each token into ``text``.
        sentence_starts: sorted int64 token indices ``p`` where a sentence starts (token ``p - 1``
            ends a sentence, i.e. ``. ! ?`` possibly followed by closing quotes, not an
            abbreviation such as "Mr.", and whitespace follows it).
        name: where the text comes from (corpus and document names).
    """

    text: str
    ids: np.ndarray
    offsets: np.ndarray
    sentence_starts: np.ndarray
    name: str = ""


def sentence_starts(text: str, offsets: np.ndarray) -> np.ndarray:
    """Token indices ``p >= 1`` that start a sentence (see ``Haystack``). offsets: (n, 2)."""
    out = []
    n = len(text)
    for p in range(1, len(offsets)):
        e = int(offsets[p - 1, 1])
        if e <= 0 or e >= n or not text[e].isspace():
            continue
        tail = text[max(0, e - 12):e]
        if _SENTENCE_END.search(tail) and not _ABBREVIATION.search(tail):
            out.append(p)
    return np.asarray(out, dtype=np.int64)


def load_haystack(docs: Sequence, tokenizer, name: str = "") -> Haystack:
    """Tokenize documents (objects with ``.text``, e.g. ``load_corpus(name).heldout``) into one
    ``Haystack``: texts joined by a blank line, tokenized without special tokens
    (``data.tokenize_document``). Raises CorpusError when there is no text."""
    from focus_lab.data import CorpusError, tokenize_document
    text = "\n\n".join(d.text.strip("\n") for d in docs)
    if not text.strip():
        raise CorpusError(f"the haystack text {name!r} is empty")
    ids, offsets = tokenize_document(text, tokenizer)
    return Haystack(text, ids, offsets, sentence_starts(text, offsets), name)


def prompt_parts(tokenizer, fmt: str = DEFAULT_FORMAT) -> tuple[list[int], list[int]]:
    """(head_ids, tail_ids): the tokens before the haystack and after it (the question and the
    answer prefix, ending with "The pass key is"), for one prompt format:

    * ``plain``: ``INTRO`` + blank line + haystack + blank line + question + answer prefix
      (a continuation prompt);
    * ``bare``: the same without ``INTRO``;
    * ``chat``: ``INTRO``, haystack and question as the user turn of the tokenizer's chat template,
      the assistant turn primed with the answer prefix.

    A BOS token is prepended when the tokenizer adds one by default (``data.bos_token_to_prepend``)
    and the format has no template. Raises ConfigError for an unknown format or ``chat`` with a
    tokenizer that has no chat template.
    """
    from focus_lab.data import bos_token_to_prepend
    if fmt not in FORMATS:
        raise ConfigError(f"unknown prompt format {fmt!r}; choose from {', '.join(FORMATS)}")
    tail_text = f"\n\n{QUESTION} {ANSWER_PREFIX}"
    if fmt == "chat":
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError("prompt format 'chat' needs a tokenizer with a chat template; this one "
                              f"has none: use one of {', '.join(f for f in FORMATS if f != 'chat')}")
        marker = "\u2063PASSKEY\u2063"
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False,
                                                 add_generation_prompt=True)
        pre, _, post = rendered.partition(marker)
        return encode(tokenizer, pre + INTRO + "\n\n"), encode(tokenizer, f"\n\n{QUESTION}" + post + ANSWER_PREFIX)
    bos = bos_token_to_prepend(tokenizer)
    head = ([bos] if bos is not None else []) + (encode(tokenizer, INTRO + "\n\n") if fmt == "plain" else [])
    return head, encode(tokenizer, tail_text)


def key_for_seed(seed: int) -> str:
    """The case's 5-digit key, a function of the case seed only (10000..99999)."""
    return str(int(np.random.default_rng([seed, 7]).integers(10 ** (KEY_DIGITS - 1), 10 ** KEY_DIGITS)))


def _digit_tokens(tokenizer, text: str, key: str) -> tuple[list[int], list[int]]:
    """(ids of ``text``, indices of the tokens that overlap an occurrence of ``key``)."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    spans = [(m.start(), m.end()) for m in re.finditer(re.escape(key), text)]
    idx = [i for i, (s, e) in enumerate(enc["offset_mapping"])
           if any(s < b and e > a for a, b in spans)]
    return list(enc["input_ids"]), idx


@dataclass
class PasskeyCase:
    """One prompt of the probe.

    Attributes:
        format, length (prompt tokens), depth (asked, percent of the haystack), seed (case seed:
        fixes the key and the haystack's start), key (5 digits as a string).
        input_ids: (length,) int64 prompt tokens, ending with the answer prefix.
        answer_ids: (n,) int64 the key's tokens (teacher-forced after the prompt; see
            ``answer_split``).
        key_index: indices into ``answer_ids`` of the tokens that carry the key's digits (all of
            them, unless a tokenizer puts non-digit characters after the key).
        needle_position: token index of the needle's first token in the prompt.
        needle_key_positions: (m,) int64 prompt positions of the needle's tokens that carry the
            key's digits (both mentions).
        needle_depth: the needle's actual depth, its token offset in the haystack / haystack
            tokens (0..1).
    """

    format: str
    length: int
    depth: float
    seed: int
    key: str
    input_ids: torch.Tensor
    answer_ids: torch.Tensor
    key_index: list[int]
    needle_position: int
    needle_key_positions: np.ndarray
    needle_depth: float


def answer_split(tokenizer, key: str) -> tuple[list[int], list[int], list[int]]:
    """(lead, answer_ids, key_index): the tokens of ``" " + key`` split before the key's first
    token. ``lead`` ends the prompt (SmolLM2 splits digits, so " 48213" is a lone space token and
    five digits: the prompt ends "The pass key is" + " ", a prefix of the natural token sequence
    of "The pass key is 48213"); the answer is the key's tokens. Measured: with the prompt ending
    at "is", dense misses came from the space token (the model continued with a word such as
    " the pass key"), while the first digit after the space ranked first (docs/passkey.md)."""
    ids, idx = _digit_tokens(tokenizer, " " + key, key)
    first = idx[0]
    return ids[:first], ids[first:], [i - first for i in idx]


def answer_budget(tokenizer, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS) -> int:
    """Tokens the probe may add after a prompt: ``max(max_new_tokens, tokens of " 99999")``."""
    return max(int(max_new_tokens), len(encode(tokenizer, " " + "9" * KEY_DIGITS)))


def check_length(length: int, n_positions: int | None, budget: int = 0) -> None:
    """Raise ConfigError when a prompt of ``length`` tokens plus ``budget`` answer tokens does not
    fit the model's ``n_positions`` (``config.max_position_embeddings``; None: no limit), or
    when ``length`` is not positive."""
    if length < 1:
        raise ConfigError(f"passkey length {length} must be a positive number of tokens")
    if n_positions and length + budget > n_positions:
        raise ConfigError(
            f"passkey length {length} + {budget} answer tokens exceeds the model's {n_positions} positions "
            f"(max_position_embeddings); the longest prompt is {n_positions - budget} tokens")


def make_case(haystack: Haystack, tokenizer, length: int, depth: float, seed: int,
              fmt: str = DEFAULT_FORMAT, parts: tuple[list[int], list[int]] | None = None) -> PasskeyCase:
    """Build one prompt of exactly ``length`` tokens.

    The haystack is ``C = length - len(head) - len(needle) - len(tail)`` consecutive tokens of
    ``haystack`` starting at a sentence start drawn from the case seed (the same start for every
    depth of a seed); the needle's tokens go in at the sentence start of that slice nearest to
    ``depth / 100 * C`` (its two ends count as sentence starts). Token sequences are concatenated
    as ids, so the needle's tokens are the same at every depth.

    Args:
        length: prompt tokens; depth: percent of the haystack, 0..100; seed: case seed.
        parts: ``prompt_parts(tokenizer, fmt)`` if already computed.
    Raises:
        ConfigError: depth outside 0..100, or a length that leaves no haystack token.
        CorpusError: the haystack text is shorter than ``C`` tokens (the message gives its length).
    """
    from focus_lab.data import CorpusError
    if not 0 <= depth <= 100:
        raise ConfigError(f"passkey depth {depth} must be a percentage in 0..100")
    head, tail = parts if parts is not None else prompt_parts(tokenizer, fmt)
    key = key_for_seed(seed)
    needle_ids, needle_key = _digit_tokens(tokenizer, " " + NEEDLE.format(key=key), key)
    lead, answer_ids, key_index = answer_split(tokenizer, key)
    tail = tail + lead
    fixed = len(head) + len(needle_ids) + len(tail)
    C = length - fixed
    if C < 1:
        raise ConfigError(f"passkey length {length} leaves no room for a haystack: the prompt's fixed "
                          f"parts take {fixed} tokens")
    n = len(haystack.ids)
    if n < C:
        raise CorpusError(f"the haystack text {haystack.name or ''} holds only {n} tokens; a {length}-token "
                          f"prompt needs {C} haystack tokens: choose a shorter length or a longer corpus")
    starts = haystack.sentence_starts[haystack.sentence_starts <= n - C]
    rng = np.random.default_rng([seed, 11])
    s0 = int(starts[rng.integers(len(starts))]) if len(starts) else 0
    local = haystack.sentence_starts[(haystack.sentence_starts > s0) & (haystack.sentence_starts < s0 + C)] - s0
    cand = np.concatenate([[0], local, [C]])
    target = depth / 100.0 * C
    b = int(cand[np.argmin(np.abs(cand - target))])
    hay = haystack.ids[s0:s0 + C].tolist()
    ids = head + hay[:b] + needle_ids + hay[b:] + tail
    assert len(ids) == length
    pos = len(head) + b
    return PasskeyCase(fmt, length, depth, seed, key, torch.tensor(ids, dtype=torch.long),
                       torch.tensor(answer_ids, dtype=torch.long), key_index, pos,
                       np.asarray([pos + i for i in needle_key], dtype=np.int64), b / C)


# ------------------------------------------------------------------------------------------
# one case through the model

def needle_edges_kept(query_groups: torch.Tensor, key_group: torch.Tensor, window: int, sinks: int,
                      row: int, positions: np.ndarray) -> float:
    """Fraction of the (answer query, needle key) edges the hard mask keeps, by ``core.hard_mask``.

    query_groups: (B, T, k) (pass ``[..., :k]`` for top-k); key_group: (B, T); row: the query's
    position; positions: the needle's key-token positions (all ``<= row``). The mask is shared by
    the heads of a layer (one router per layer, docs/method.md §1.1), so this is also the mean
    over heads. Returns a fraction in [0, 1], averaged over the batch.
    """
    from focus_lab.method.core import hard_mask
    T = key_group.shape[1]
    dev = key_group.device
    m = hard_mask(query_groups[:, row:row + 1], key_group, window,
                  torch.tensor([row], device=dev), torch.arange(T, device=dev), sinks)  # (B, 1, T)
    return float(m[:, 0, torch.as_tensor(positions, device=dev)].float().mean())


class _Audit(NeedleTrace):
    """The needle trace (``needle_trace.NeedleTrace``) of one teacher-forced forward at the answer
    row (``length - 1``) and the needle's key tokens; with ``audit`` (a dense forward) it also
    records, per routed layer, the dense attention mass to the needle and the share of the needle's
    edges the uniform hard top-1 / top-2 masks keep, their groups routed from the same forward."""

    def __init__(self, model, case: PasskeyCase, audit: bool, config):
        super().__init__(model, torch.tensor([case.length - 1]),
                         torch.as_tensor(case.needle_key_positions, dtype=torch.long), config, dense=audit)
        self.row = case.length - 1
        self.layers: dict[int, dict] = {}

    @property
    def needle_kept(self) -> float:
        """The pattern's mask on the needle's edges at the answer row, mean over layers (nan: none)."""
        return float(np.mean([float(k.mean()) for k in self.kept.values()])) if self.kept else float("nan")

    def recorded(self, call, layer: int) -> None:
        if not self.dense:
            return
        from focus_lab.method.core import route
        cfg = self.config
        pos = self.needle.numpy()
        mass = self.probs[layer][:, 0].sum(-1)  # (H,) dense attention to the needle, answer row
        # the uniform top-1 / top-2 masks, whatever per-layer k the run sets (layer_top_k cleared)
        rt = route(call.module.focus_router, call.router_in,
                   config=cfg.replace(mode="hard", top_k=min(2, cfg.num_groups), layer_top_k={}))
        qg, kg = rt.query_groups, rt.key_group
        self.layers[layer] = {
            "layer_idx": layer, "dense_mass_to_needle": float(mass.mean()),
            "max_head_mass_to_needle": float(mass.max()),
            "kept_top1": needle_edges_kept(qg[..., :1], kg, cfg.window, cfg.sink_tokens, self.row, pos),
            "kept_top2": needle_edges_kept(qg[..., :2], kg, cfg.window, cfg.sink_tokens, self.row, pos)
            if cfg.num_groups >= 2 else float("nan")}


def _number_ended(text: str) -> bool:
    return re.search(r"\d\D", text) is not None


def greedy_continuation(model, prefix: torch.Tensor, steps: int, use_cache: bool,
                        stop: Callable[[list[int]], bool] | None = None, focus=None) -> list[int]:
    """Greedy decoding of up to ``steps`` tokens after ``prefix`` ((T,) int64 token ids): the probe
    core's ``probe.greedy`` from an empty cache (a prefill, then one token a step, when
    ``use_cache``; else one full forward per token). ``stop(tokens so far)`` ends decoding early;
    ``focus``: the ``FocusForward`` of every forward (None: the model's default). Returns the new
    token ids."""
    return greedy(model, prefix, steps, stop or (lambda toks: False), eos_ids(model), use_cache, focus)


@torch.no_grad()
def run_case(model, tokenizer, case: PasskeyCase, patterns: list[tuple[str, dict]],
             max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, audit: bool = True
             ) -> tuple[list[dict], list[dict]]:
    """Run one prompt under each pattern (``[(label, FocusConfig changes)]``,
    ``evaluate.parse_patterns``), each with its own FocusForward; the model's config is not changed.

    Per pattern: one teacher-forced forward over prompt + answer (``length + n`` tokens) gives the
    key's log-probability (nats, the sum over the key's tokens of ``log softmax`` at the position
    before each), the rank of the first key token, the pattern's sparsity and the mask's edges
    to the needle; greedy decoding follows (module docstring).
    With ``audit``, the dense forward (an extra one when ``dense`` is not among the patterns)
    also measures, per routed layer, the dense attention mass from the answer query (position
    ``length - 1``) to the needle's key tokens (sum over those keys, mean and max over heads) and
    the fraction of those edges the hard top-1 / top-2 masks keep, with groups routed from the
    same dense forward (as ``focus-lab record --mode dense`` audits; docs/method.md §6).

    Returns (case rows, layer rows): dicts with the columns of ``CASES_COLUMNS`` /
    ``LAYER_COLUMNS`` except ``schema_version``; layer rows are empty without ``audit``.
    """
    from focus_lab.hf.retrofit import forward_state
    labels = [lab for lab, _ in patterns]
    runs = list(patterns)
    if audit and not any(c.get("mode") == "dense" for _, c in runs):
        runs = [("__audit__", {"mode": "dense", "assignment": "router"})] + runs
    ids = torch.cat([case.input_ids, case.answer_ids])
    n = len(case.answer_ids)
    L = case.length
    rows, layer_rows = [], []
    audited = False
    # each pattern runs with its own FocusForward: the model's config is not changed
    for label, changes in runs:
        state = forward_state(model, cache=True, **changes)
        cfg = state.config
        do_audit = audit and not audited and cfg.mode == "dense"
        t0 = time.perf_counter()
        with _Audit(model, case, do_audit, cfg) as probe:
            logits = forward(model, ids, keep=n + 1, use_cache=False,
                              focus=state).logits[0, -(n + 1):-1].float()  # (n, V)
        if do_audit:
            audited = True
            layer_rows = [{"format": case.format, "length": L, "depth": case.depth, "seed": case.seed,
                           "key": case.key, **probe.layers[i]} for i in sorted(probe.layers)]
        if label == "__audit__":
            continue
        logp, rank, m = teacher_forced(logits, case.answer_ids, case.key_index[0])  # rank 0: greedy picks it
        tok_lp = logp.gather(1, case.answer_ids[:, None])[:, 0]  # (n,)
        key_lp = float(tok_lp[case.key_index].sum())
        cont = case.answer_ids[:m].tolist()
        if m < n:
            def stop(new, base=list(cont)):
                text = tokenizer.decode(base + new)
                return case.key in text or _number_ended(text)
            cont += greedy_continuation(model, torch.cat([case.input_ids, case.answer_ids[:m]]),
                                        max(1, max_new_tokens - m), cache_ok(cfg), stop, state)
        text = tokenizer.decode(cont)
        dt = time.perf_counter() - t0
        frac = pairs_kept(cfg, probe.pairs_kept, L + n)
        rows.append({"format": case.format, "length": L, "depth": case.depth, "pattern": label,
                     "seed": case.seed, "key": case.key, "exact_match": case.key in text,
                     "key_logprob": key_lp, "key_tokens": len(case.key_index),
                     "first_key_token_rank": rank, "distant_pairs_kept": frac,
                     "needle_edges_kept": probe.needle_kept,
                     "needle_depth": case.needle_depth, "needle_position": case.needle_position,
                     "continuation": text, "mode": cfg.mode,
                     "top_k": cfg.top_k if cfg.mode == "hard" else None, "seconds": dt})
    assert [r["pattern"] for r in rows] == labels
    return rows, layer_rows


# ------------------------------------------------------------------------------------------
# the whole probe: cells, tables, figure

def cases_frame(rows: list[dict]) -> pd.DataFrame:
    """The tidy ``cases`` table (``CASES_COLUMNS``) from ``run_case`` rows."""
    return tidy_frame(rows, CASES_COLUMNS, PASSKEY_SCHEMA, bools=("exact_match",))


def layers_frame(rows: list[dict]) -> pd.DataFrame:
    """The tidy ``needle_layers`` table (``LAYER_COLUMNS``) from ``run_case`` layer rows."""
    return tidy_frame(rows, LAYER_COLUMNS, PASSKEY_SCHEMA, ints=())


def run_passkey(model, tokenizer, haystack: Haystack, out_dir: str | os.PathLike,
                lengths: Sequence[int] = DEFAULT_LENGTHS, depths: Sequence[float] = DEFAULT_DEPTHS,
                patterns: list[tuple[str, dict]] | None = None, keys: int = 3, seed: int = 0,
                formats: Sequence[str] = (DEFAULT_FORMAT,), max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                settings: dict | None = None, png: bool = False,
                log: Callable[[str], None] = print) -> dict:
    """The passkey probe over lengths x depths x ``keys`` case seeds (``seed .. seed + keys - 1``)
    x patterns x formats, resumable.

    Every (format, length, depth) cell is written when done, atomically, under
    ``out_dir/cells/<fingerprint>/`` (the fingerprint covers ``settings``, the patterns, keys,
    seed, max_new_tokens and the needle and question texts), so a rerun skips finished cells.
    Then ``out_dir/cases.parquet``, ``out_dir/needle_layers.parquet`` (the requested cells only),
    ``out_dir/passkey.html`` (+ ``.png`` with ``png``) and ``out_dir/passkey.json`` (settings,
    files, seconds) are written.

    Args:
        lengths: prompt tokens; depths: percent 0..100; patterns: ``evaluate.parse_patterns``
            output (default ``DEFAULT_PATTERNS``); settings: model, routers, corpus identity.
    Returns:
        {"cases": DataFrame, "needle_layers": DataFrame, "files": [...], "png_note": str | None,
        "seconds": float, "computed_cells": int}.
    Raises:
        ConfigError: an unknown format, a length beyond the model's positions
            (``check_length``), no keys, a depth outside 0..100; CorpusError: a haystack too
            short for a length (before any forward pass).
    """
    from focus_lab.eval.evaluate import parse_patterns
    from focus_lab.io import write_json, write_parquet
    from focus_lab.hf.retrofit import forward_state
    out_dir = Path(out_dir)
    if patterns is None:
        patterns = parse_patterns(DEFAULT_PATTERNS, forward_state(model).config)
    if keys < 1:
        raise ConfigError(f"--keys {keys}: at least one key per cell")
    budget = answer_budget(tokenizer, max_new_tokens)
    n_pos = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
    parts = {f: prompt_parts(tokenizer, f) for f in formats}
    for L in lengths:
        check_length(int(L), n_pos, budget)
    # build every prompt first: a bad depth or a short corpus fails before any forward pass
    cells = {}
    for f in formats:
        for L in lengths:
            for d in depths:
                cells[(f, int(L), d)] = [make_case(haystack, tokenizer, int(L), d, seed + r, f, parts[f])
                                         for r in range(keys)]
    fp_settings = {**(settings or {}), "patterns": patterns, "keys": keys, "seed": seed,
                   "max_new_tokens": max_new_tokens, "needle": NEEDLE, "intro": INTRO, "question": QUESTION,
                   "answer_prefix": ANSWER_PREFIX, "prompt_version": PROMPT_VERSION, "haystack": haystack.name,
                   "schema": PASSKEY_SCHEMA}
    fp = fingerprint(fp_settings)
    cell_dir = out_dir / "cells" / fp
    t_all = time.perf_counter()
    units = [(i, f, L, d, cases) for i, ((f, L, d), cases) in enumerate(cells.items(), 1)]

    def stem(u) -> str:
        return f"{u[1]}_L{u[2]}_d{u[3]:g}"

    def compute(u):  # one cell: its cases under every pattern
        rows, lrows = [], []
        for case in u[4]:
            t1 = time.perf_counter()
            r, lr = run_case(model, tokenizer, case, patterns, max_new_tokens)
            rows += r
            lrows += lr
            log(f"[passkey]   {stem(u)} seed {case.seed} key {case.key} ({time.perf_counter() - t1:.0f} s): "
                + ", ".join(f"{x['pattern']} {'hit' if x['exact_match'] else 'miss'} {x['key_logprob']:.1f}"
                            for x in r))
        return layers_frame(lrows), cases_frame(rows)

    def logged(u, frames, seconds, earlier):
        if earlier:
            log(f"[passkey] cell {u[0]}/{len(cells)} {stem(u)}: done earlier ({cell_dir / stem(u)}.cases.parquet)")
            return
        hits = frames[1].groupby("pattern", sort=False)["exact_match"].mean()
        log(f"[passkey] cell {u[0]}/{len(cells)} {stem(u)}: {seconds:.0f} s; exact match "
            + ", ".join(f"{p} {v:.2f}" for p, v in hits.items()))

    computed, frames = run_units(units, lambda u: (cell_dir / f"{stem(u)}.layers.parquet",
                                                   cell_dir / f"{stem(u)}.cases.parquet"),
                                 compute, write_parquet, logged)
    layer_parts, case_parts = [f[0] for f in frames], [f[1] for f in frames]
    from focus_lab.eval.provenance import with_provenance
    cases_df = with_provenance(pd.concat(case_parts, ignore_index=True), "pattern", forward_state(model).config,
                               patterns, ((settings or {}).get("routers") or {}).get("path"))
    layers_df = pd.concat(layer_parts, ignore_index=True)
    write_parquet(out_dir / "cases.parquet", cases_df)
    write_parquet(out_dir / "needle_layers.parquet", layers_df)
    files = ["cases.parquet", "needle_layers.parquet"]
    from focus_lab.eval.passkey_figure import heatmap_figure, write_figure
    written, note = write_figure(heatmap_figure(cases_df), out_dir / "passkey", png=png)
    files += written
    if note:
        log(f"[passkey] {note}")
    seconds = time.perf_counter() - t_all
    write_json(out_dir / "passkey.json", {"settings": fp_settings, "fingerprint": fp,
                                           "lengths": [int(x) for x in lengths], "depths": list(depths),
                                           "formats": list(formats), "files": files,
                                           "computed_cells": computed, "seconds": round(seconds, 1)})
    return {"cases": cases_df, "needle_layers": layers_df, "files": files, "png_note": note,
            "seconds": seconds, "computed_cells": computed}


def summary(cases: pd.DataFrame) -> pd.DataFrame:
    """Per (format, pattern, length): cases, exact-match rate, mean key log-prob (nats), mean
    distant pairs kept, mean needle edges kept, mean seconds per case."""
    g = cases.groupby(["format", "pattern", "length"], sort=False)
    return g.agg(cases=("exact_match", "size"), exact_match=("exact_match", "mean"),
                 key_logprob=("key_logprob", "mean"), distant_pairs_kept=("distant_pairs_kept", "mean"),
                 needle_edges_kept=("needle_edges_kept", "mean"), seconds=("seconds", "mean")).reset_index()

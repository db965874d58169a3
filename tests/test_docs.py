"""The documentation stays a product. Checks, each reporting one ``file:line: rule broken: detail``
line per problem, all problems at once:

- no file cites the method notes that used to live outside the repository;
- every relative link and ``#anchor`` of README.md, docs/**, figures/README.md and data/README.md
  resolves: the file is in the repository and the anchor is a heading of it (GitHub's slugs);
- README.md has at most 150 lines;
- no tracked markdown page carries history words (``HISTORY``: how the project was built, or
  how a page was corrected and which runs were added, not what it does and what was measured);
- every study page (docs/studies/*.md but its README) has the sections Question, Setup, Result,
  Verdict, Reproduce in that order;
- every number in the README's tables is in the committed data the README links.

"Of the repository" means tracked by git, or new and not git-ignored (so a page written but not
yet committed counts, a generated, git-ignored file does not). The figures' PNGs are committed
so a link to a figure that is not is a failure like any other; the generated
HTML files are named, not linked."""

from __future__ import annotations

import re
import subprocess
import urllib.parse
from pathlib import Path, PurePosixPath

import pytest

REPO = Path(__file__).resolve().parents[1]
# written in two parts so that this file does not itself mention what it looks for
OLD_NOTES = "PAPER" + ".md"
OUTSIDE = "../" + "shared"
METHOD = "docs/method.md"
PROVENANCE = "Provenance:"  # the one line of docs/method.md allowed to name the old notes
LINKED_PAGES = ("README.md", "figures/README.md", "data/README.md")  # plus docs/**/*.md


def _git(*args: str) -> list[str] | None:
    """NUL-separated output of ``git -C REPO args``, or None outside a git checkout."""
    try:
        out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return [p for p in out.decode().split("\0") if p]


def repository_files() -> set[str] | None:
    """Paths (relative, POSIX) that a fresh clone would have, plus new files git does not ignore."""
    tracked = _git("ls-files", "-z")
    new = _git("ls-files", "-z", "--others", "--exclude-standard")
    if tracked is None or new is None:
        return None
    return {p for p in tracked + new if (REPO / p).is_file()}


def is_ignored(rel: str) -> bool:
    return subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", "--no-index", rel]).returncode == 0


# ------------------------------------------------------------------------------------------
# no citation of a file outside the repository

def offending_lines(rel: str, text: str) -> list[str]:
    """``path:line: text`` of each line of ``text`` (the file ``rel``) that cites the old,
    outside notes; only docs/method.md's provenance line may name them (and never by path)."""
    bad = []
    for n, line in enumerate(text.splitlines(), 1):
        if OLD_NOTES not in line and OUTSIDE not in line:
            continue
        if rel == METHOD and line.startswith(PROVENANCE) and OUTSIDE not in line:
            continue
        bad.append(f"{rel}:{n}: {line.strip()[:120]}")
    return bad


def test_offending_lines_finds_citations():
    assert offending_lines("focus_lab/x.py", f'"""Source: {OLD_NOTES} §1."""') == \
        [f'focus_lab/x.py:1: """Source: {OLD_NOTES} §1."""']
    assert offending_lines("README.md", f"see `{OUTSIDE}/notes`\nok") == [f"README.md:1: see `{OUTSIDE}/notes`"]
    assert offending_lines(METHOD, f"{PROVENANCE} replaces `{OLD_NOTES}`.") == []
    assert offending_lines(METHOD, f"cited as {OLD_NOTES} §2") != []  # not the provenance line
    assert offending_lines(METHOD, f"{PROVENANCE} `{OUTSIDE}/{OLD_NOTES}`") != []
    assert offending_lines("docs/x.md", "docs/method.md §2") == []


def test_no_file_cites_notes_outside_the_repository():
    files = repository_files()
    if files is None:
        pytest.skip("not a git checkout")
    bad = []
    for rel in sorted(files):
        data = (REPO / rel).read_bytes()
        if b"\0" in data[:8192]:  # binary
            continue
        bad += offending_lines(rel, data.decode("utf-8", errors="replace"))
    assert not bad, (f"{len(bad)} lines cite notes outside the repository; cite `docs/method.md §N` "
                     "(same section numbers) instead:\n" + "\n".join(bad))


# ------------------------------------------------------------------------------------------
# relative links and anchors
#
# Every check below returns ``file:line: rule broken: detail`` lines, one per problem, and each
# test on the repository collects all of them before it fails.

_FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1", re.S | re.M)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
_HTML_ANCHOR = re.compile(r"<a\s[^>]*?\b(?:id|name)\s*=\s*[\"']?([^\"'\s>]+)", re.I)


def _blank(pattern: re.Pattern, text: str) -> str:
    """``text`` with each match of ``pattern`` replaced by spaces, newlines kept (so that
    offsets and line numbers stay those of the original)."""
    return pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def markdown_links_with_lines(text: str) -> list[tuple[int, str]]:
    """(line, target) of each link and image of a markdown text, outside code blocks and code
    spans, in the order they appear."""
    text = _blank(_CODE_SPAN, _blank(_FENCE, text))
    found = [(m.start(), m.group(1)) for m in _INLINE.finditer(text)]
    found += [(m.start(1), m.group(1)) for m in _REFERENCE.finditer(text)]
    return [(_line_of(text, at), target) for at, target in sorted(found)]


def markdown_links(text: str) -> list[str]:
    """Link and image targets of a markdown text, outside code blocks and code spans."""
    text = _CODE_SPAN.sub("", _FENCE.sub("", text))
    return _INLINE.findall(text) + _REFERENCE.findall(text)


def github_slug(title: str) -> str:
    """GitHub's anchor of a heading's text: its rendered text (links and images by their text,
    code spans without backticks, HTML tags dropped), lowercased, punctuation other than '-' and
    '_' removed, each space a '-'."""
    title = re.sub(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", title)
    title = re.sub(r"<[^>]+>", "", title).replace("`", "")
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def headings(text: str) -> list[tuple[int, str]]:
    """(line, text) of each ATX heading of a markdown text, outside fenced code blocks."""
    out = []
    for n, line in enumerate(_blank(_FENCE, text).splitlines(), 1):
        m = _HEADING.match(line)
        if m and m.group(1).strip():
            out.append((n, m.group(1).strip()))
    return out


def heading_slugs(text: str) -> set[str]:
    """Every anchor a markdown page has on GitHub: its headings' slugs (a repeated slug gets
    -1, -2, ...) and the explicit ``<a id=...>`` / ``<a name=...>`` outside code."""
    slugs: set[str] = set()
    for _, title in headings(text):
        base = slug = github_slug(title)
        n = 0
        while slug in slugs:
            n += 1
            slug = f"{base}-{n}"
        slugs.add(slug)
    slugs.update(_HTML_ANCHOR.findall(_blank(_CODE_SPAN, _blank(_FENCE, text))))
    return slugs


def _resolve(page: str, path: str) -> str | None:
    """Repository-relative POSIX path of ``path`` linked from ``page``; None if it leaves the repo."""
    parts: list[str] = []
    for part in (PurePosixPath(page).parent / path).parts:
        if part == "..":
            if not parts:
                return None
            parts.pop()
        elif part not in (".", ""):
            parts.append(part)
    return "/".join(parts)


def link_problems(page: str, text: str, files: set[str], read, ignored=lambda rel: False) -> list[str]:
    """``page:line: broken link: ...`` / ``page:line: broken anchor: ...`` for each relative link
    of ``text`` (the page ``page``) whose file is not in ``files`` or whose ``#anchor`` is no
    heading of the markdown file it points to. ``read(rel)`` gives a file's text."""
    problems = []
    for line, target in markdown_links_with_lines(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("//"):  # http:, mailto:
            continue
        raw_path, _, anchor = target.partition("#")
        path = urllib.parse.unquote(raw_path.split("?", 1)[0])
        rel = _resolve(page, path) if path else page
        if rel is None:
            problems.append(f"{page}:{line}: broken link: {target!r} leaves the repository")
            continue
        if rel not in files and not any(f.startswith(rel + "/") for f in files):
            why = "git-ignored: commit it or link something else" if ignored(rel) else "no such file"
            problems.append(f"{page}:{line}: broken link: {target!r} points to {rel} ({why})")
            continue
        if anchor and rel.endswith(".md") and rel in files:
            anchor = urllib.parse.unquote(anchor)
            if anchor not in heading_slugs(text if rel == page else read(rel)):
                problems.append(f"{page}:{line}: broken anchor: {target!r}: {rel} has no heading #{anchor}")
    return problems


def test_markdown_helpers():
    text = ("# A title: `x`\n\n[a](b.md) ![i](img/p.png \"t\") [c](#a-title-x) `[no](code.md)`\n"
            "```\n[no](fenced.md)\n# not a heading\n```\n[ref]: docs/r.md\n[web](https://example.org)\n")
    assert markdown_links(text) == ["b.md", "img/p.png", "#a-title-x", "https://example.org", "docs/r.md"]
    assert markdown_links_with_lines(text) == [(3, "b.md"), (3, "img/p.png"), (3, "#a-title-x"),
                                               (8, "docs/r.md"), (9, "https://example.org")]
    assert heading_slugs(text) == {"a-title-x"}
    assert "5-results-to-compare-against" in heading_slugs("## 5. Results to compare against\n")
    assert github_slug("1.7 Keys in their predecessor's group [ours]") == "17-keys-in-their-predecessors-group-ours"
    assert github_slug("See [the API](api.md#x) and `focus_lab.attach`") == "see-the-api-and-focus_labattach"
    assert github_slug("Speed: 2x -- A/B") == "speed-2x----ab"
    assert heading_slugs("## Setup\ntext\n## Setup\n### Setup ##\n<a id=\"here\"></a>\n<a name='there'>") == \
        {"setup", "setup-1", "setup-2", "here", "there"}


def test_link_check_finds_broken_links_and_anchors():
    files = {"README.md", "docs/a.md", "docs/b.md", "figures/x.png"}
    pages = {"docs/b.md": "# B\n## Two words, here\n```\n## Fenced\n```\n## Dup\n## Dup\n"}
    text = ("[ok](docs/b.md#two-words-here) [ok](docs/b.md#dup-1) [ok](figures/x.png) [ok](docs)\n"
            "[web](https://x.org/y.md#z) [self](#top)\n"
            "[gone](docs/c.md)\n"
            "[anchor](docs/b.md#fenced) [anchor](docs/b.md#dup-2)\n"
            "[out](../outside.md)\n"
            "`[code](nothing.md)`\n"
            "# Top\n")
    problems = link_problems("README.md", text, files, pages.__getitem__)
    assert problems == [
        "README.md:3: broken link: 'docs/c.md' points to docs/c.md (no such file)",
        "README.md:4: broken anchor: 'docs/b.md#fenced': docs/b.md has no heading #fenced",
        "README.md:4: broken anchor: 'docs/b.md#dup-2': docs/b.md has no heading #dup-2",
        "README.md:5: broken link: '../outside.md' leaves the repository",
    ]
    # relative to the page's folder; an anchor of the page itself
    assert link_problems("docs/a.md", "[b](b.md#b) [r](../README.md) [s](#nope)\n# A\n", files,
                         pages.__getitem__) == ["docs/a.md:1: broken anchor: '#nope': docs/a.md has no heading #nope"]


def _linked_pages(files: set[str]) -> list[str]:
    pages = [p for p in LINKED_PAGES if p in files]
    return pages + sorted(p for p in files if p.startswith("docs/") and p.endswith(".md"))


def test_every_relative_link_and_anchor_resolves():
    files = repository_files()
    if files is None:
        pytest.skip("not a git checkout")
    read = lambda rel: (REPO / rel).read_text(encoding="utf-8")
    problems = []
    for page in _linked_pages(files):
        problems += link_problems(page, read(page), files, read, is_ignored)
    assert not problems, f"{len(problems)} broken links or anchors:\n" + "\n".join(problems)


# ------------------------------------------------------------------------------------------
# the README stays short

README_MAX_LINES = 150


def readme_length_problems(text: str, rel: str = "README.md") -> list[str]:
    n = len(text.splitlines())
    if n <= README_MAX_LINES:
        return []
    return [f"{rel}:{README_MAX_LINES + 1}: README too long: {n} lines, at most {README_MAX_LINES} "
            "(move detail into docs/ and link it)"]


def test_readme_length_check():
    assert readme_length_problems("line\n" * README_MAX_LINES) == []
    assert readme_length_problems("line\n" * (README_MAX_LINES + 1)) == [
        f"README.md:151: README too long: 151 lines, at most {README_MAX_LINES} (move detail into docs/ and link it)"]


def test_readme_is_at_most_150_lines():
    problems = readme_length_problems((REPO / "README.md").read_text(encoding="utf-8"))
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------------
# no history in the product: the docs say what the product does and what was measured

# the words are written in parts so that this file does not itself carry what it looks for
_SES, _RUN, _GOALS, _EARLIER, _PREV = "ses" + "sion", "ru" + "n", "goals we " + "set", "earli" + "er", "previ" + "ous"
_CORR, _VERSION, _NOW, _YET, _ADDED = "correc" + "tion", "vers" + "ion", "n" + "ow", "y" + "et", "add" + "ed"
_GOALS_RE = _GOALS.replace(" ", r"\s+")
HISTORY = re.compile(
    rf"(?i:{_GOALS_RE}|this\s+{_SES}|{_SES}\s+script|lent\s+machine|{_EARLIER}\s+{_RUN}s?\b"
    rf"|\bst" r"op\s+\d+|\bfor\s+n" r"ow\b|\b" rf"{_SES}\b)"
    rf"|(?i:\b{_RUN}s?)\s+[A-H]\b"           # named by a capital letter; with "a command" after it, English
    rf"|`{_PREV}[\w*-]*`"              # tables named by when they were made, not what they hold
    # a page that narrates its own edits: a dated correction, the version before, the file shipped
    # before, what a table has now, what is still to come, runs named by a letter and a number,
    # the seeds a run added
    rf"|(?i:\b{_CORR}\s*\(|\ban\s+{_EARLIER}\s+{_VERSION}s?\b|\b{_PREV}\s+shipped\b|\b{_NOW}\s+has\b"
    rf"|\bnot\s+{_YET}\b|\b{_RUN}s?\s+s\d|\bseeds?\s+\d+(?:\s*[-–]\s*\d+)?\s+{_ADDED}\b)")
# the one meaning of the word that is no history: Streamlit's per-browser-tab state
HISTORY_ALLOWED = re.compile(rf"(?i)\b{_SES}[\s_]state\b")


def history_problems(rel: str, text: str) -> list[str]:
    """``rel:line: history word: ...`` for each history word or phrase of a markdown text."""
    problems = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in HISTORY.finditer(HISTORY_ALLOWED.sub(lambda a: "#" * len(a.group(0)), line)):
            problems.append(f"{rel}:{n}: history word: {m.group(0)!r} in {line.strip()[:100]!r}")
    return problems


def test_history_check_finds_history_words():
    S, R, E, P = _SES, _RUN, _EARLIER, _PREV
    bad = (f"It misses the {_GOALS}.\nIn this {S}, via the {S} script\n"
           f"on the lent machine; {R.title()} A and {R} H, {R}s A and B\nas an {E} {R} showed "
           f"({E.title()} {R}s: st" f"op 12)\n"
           "an option for n" "ow\n" f"table `{P}_8k_budget_top2`\na {S}\n")
    found = history_problems("docs/x.md", bad)
    assert [p.split(": ")[0] for p in found] == ["docs/x.md:1"] + ["docs/x.md:2"] * 2 + ["docs/x.md:3"] * 4 + \
        ["docs/x.md:4"] * 3 + ["docs/x.md:5", "docs/x.md:6", "docs/x.md:7"]
    assert found[0] == f"docs/x.md:1: history word: '{_GOALS}' in 'It misses the {_GOALS}.'"
    good = (f"{R.title()} a command; the router {R}s each layer. Streamlit's {S} state (`st.{S}_state`)\n"
            f"keeps the page; the {P} token; st" "ops at 4096; a RUNTIME of 3 s\n")
    assert history_problems("docs/x.md", good) == []
    # a page narrating its own edits: one phrase a line, each caught once
    edits = (f"{_CORR.title()} (2026-11-28): the table\n{_CORR} (of the gains)\nas an {E} {_VERSION} said\n"
             f"An {E} {_VERSION}s of the page\nthe {P} shipped file\nthe table {_NOW} has 20 cases\n"
             f"Not {_YET} timed\nnot  {_YET} measured\nthe 30 cases of {R} s8\n{R}s s2 and s8\n"
             f"(seeds 10-19 {_ADDED})\nseed 5 {_ADDED}\nseeds 10 – 19 {_ADDED}\n")
    found = history_problems("docs/x.md", edits)
    assert [p.split(": ")[0] for p in found] == [f"docs/x.md:{n}" for n in range(1, 14)], found
    assert found[0] == (f"docs/x.md:1: history word: '{_CORR.title()} (' in "
                        f"'{_CORR.title()} (2026-11-28): the table'")
    plain = (f"the bias {_CORR} of the router; the {_VERSION} of torch; the {P} token\n"
             f"the shipped file has 20 cases; {_NOW} a query sees its window; {_YET} another key\n"
             f"not measured; unmeasured; {R} seeds 10-19; {R}s s and its seeds; the seeds {_ADDED} noise\n")
    assert history_problems("docs/x.md", plain) == []


def test_no_history_words_in_markdown():
    files = repository_files()
    if files is None:
        pytest.skip("not a git checkout")
    problems = []
    for rel in sorted(f for f in files if f.endswith(".md")):
        problems += history_problems(rel, (REPO / rel).read_text(encoding="utf-8"))
    assert not problems, (f"{len(problems)} history words in the docs (write what the product does and "
                          "what was measured, in the present tense):\n" + "\n".join(problems))


# a placeholder left in prose (a capitalised name to fill in later, or a to-do marker): a page
# says what was measured, not what is still to be typed in; code spans, fenced code and HTML
# comments are names of code, so they are left out (the line numbers stay those of the page)
PLACEHOLDER = re.compile(r"\b(?:[A-Z]{2,}(?:_[A-Z]{2,})+|TO" r"DO|TB" r"D|FIX" r"ME|XX" r"X)\b")


def placeholder_problems(rel: str, text: str) -> list[str]:
    """``rel:line: placeholder NAME`` for each placeholder in the prose of a markdown text."""
    blank = lambda m: "\n" * m.group(0).count("\n")  # noqa: E731
    text = re.sub(r"```.*?```", blank, text, flags=re.S)
    text = re.sub(r"<!--.*?-->", blank, text, flags=re.S)
    text = re.sub(r"`(?:[^`\n]|\n(?![ \t]*\n))*`", blank, text)  # a code span may wrap, not past a blank line
    return [f"{rel}:{n}: placeholder {m.group(0)}" for n, line in enumerate(text.splitlines(), 1)
            for m in PLACEHOLDER.finditer(line)]


def test_placeholder_check_finds_placeholders_in_prose_only():
    text = ("the probe took COST" "_RET.\n```bash\nOMP_NUM_THREADS=1 run\n```\n"
            "`MALLOC_MMAP_THRESHOLD_` and Q4_K_M\n<!-- BEGIN generated:x | A_B -->\nsee TO" "DO here\n"
            "then `OMP_NUM_THREADS=1 focus-lab\nrecord` ran; a lone ` and\n\nNEW_NAME` after a blank line\n")
    assert placeholder_problems("docs/x.md", text) == ["docs/x.md:1: placeholder COST" "_RET",
                                                       "docs/x.md:7: placeholder TO" "DO",
                                                       "docs/x.md:11: placeholder NEW" "_NAME"]


def test_no_placeholders_in_markdown():
    files = repository_files()
    if files is None:
        pytest.skip("not a git checkout")
    problems = []
    for rel in sorted(f for f in files if f.endswith(".md")):
        problems += placeholder_problems(rel, (REPO / rel).read_text(encoding="utf-8"))
    assert not problems, "placeholders left in the docs (write the measured value):\n" + "\n".join(problems)


# ------------------------------------------------------------------------------------------
# one page per study, each with the same five sections

STUDY_HEADINGS = ("Question", "Setup", "Result", "Verdict", "Reproduce")
STUDIES = "docs/studies"


def study_problems(rel: str, text: str) -> list[str]:
    """``rel:line: study headings: ...`` unless the page has the level-2 headings
    ``## Question``, ``## Setup``, ``## Result``, ``## Verdict``, ``## Reproduce`` in that order."""
    at: dict[str, int] = {}
    for n, line in enumerate(_blank(_FENCE, text).splitlines(), 1):
        m = re.match(r"^## +(.+?)\s*$", line)
        if m and m.group(1) in STUDY_HEADINGS:
            at.setdefault(m.group(1), n)
    order = ", ".join(f"## {h}" for h in STUDY_HEADINGS)
    problems = [f"{rel}:1: study headings: no '## {h}' (a study page has {order}, in that order)"
                for h in STUDY_HEADINGS if h not in at]
    last = None
    for h in STUDY_HEADINGS:
        if h not in at:
            continue
        if last is not None and at[h] < at[last]:
            problems.append(f"{rel}:{at[h]}: study headings: '## {h}' comes before '## {last}' "
                            f"(the order is {order})")
        else:
            last = h
    return problems


def test_study_heading_check():
    good = "# A study\n\n## Question\nq\n## Setup\n### detail\n## Result\n| a |\n## Verdict\nv\n## Reproduce\n"
    assert study_problems("docs/studies/s.md", good) == []
    missing = good.replace("## Verdict", "## Conclusion")
    assert study_problems("docs/studies/s.md", missing) == [
        "docs/studies/s.md:1: study headings: no '## Verdict' (a study page has ## Question, ## Setup, "
        "## Result, ## Verdict, ## Reproduce, in that order)"]
    swapped = "## Question\n## Result\n## Setup\n## Verdict\n```\n## Reproduce\n```\n"
    problems = study_problems("docs/studies/s.md", swapped)
    assert [p.split(": study")[0] for p in problems] == ["docs/studies/s.md:1", "docs/studies/s.md:2"]
    assert "no '## Reproduce'" in problems[0] and "'## Result' comes before '## Setup'" in problems[1]
    assert study_problems("docs/studies/s.md", "### Question\n## Setup\n")[0].startswith(
        "docs/studies/s.md:1: study headings: no '## Question'")


def test_every_study_page_has_its_five_sections():
    files = repository_files()
    if files is None:
        pytest.skip("not a git checkout")
    pages = sorted(f for f in files if PurePosixPath(f).parent == PurePosixPath(STUDIES)
                   and f.endswith(".md") and PurePosixPath(f).name != "README.md")
    problems = []
    for rel in pages:  # none yet is no failure
        problems += study_problems(rel, (REPO / rel).read_text(encoding="utf-8"))
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------------
# nothing lost: every number in the README's tables is in the committed data the README links

_TABLE_ROW = re.compile(r"^\|.*\|\s*$")


def markdown_tables(text: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """(the paragraph before it, header cells, body rows) of each markdown table outside code."""
    lines, out, i = _FENCE.sub("", text).splitlines(), [], 0
    while i < len(lines):
        if _TABLE_ROW.match(lines[i]) and i + 1 < len(lines) and re.match(r"^\|[\s:|-]+\|\s*$", lines[i + 1]):
            j = i - 1
            while j >= 0 and not lines[j].strip():
                j -= 1
            k = j
            while k >= 0 and lines[k].strip():
                k -= 1
            cells = lambda line: [c.strip() for c in line.strip().strip("|").split("|")]
            body, n = [], i + 2
            while n < len(lines) and _TABLE_ROW.match(lines[n]):
                body.append(cells(lines[n]))
                n += 1
            out.append(("\n".join(lines[k + 1:j + 1]), cells(lines[i]), body))
            i = n
        else:
            i += 1
    return out


def _length_table_problems(intro: str, header: list[str], body: list[list[str]]) -> list[str]:
    """The README's length table against the committed cells it links: each corpus's columns
    (``*<held-out text>* dense``, ``hard top-K``, ..., ``vs random top-1 / top-2``) recomputed
    from the per-window rows (``analyses.length_table.summarize``) and formatted as shown."""
    import pandas as pd
    from analyses.length_table import summarize
    # the paragraph before, or the begin marker of the generated block (analyses/doc_blocks.py)
    data = [t for t in markdown_links(intro) if t.endswith(".parquet")] or re.findall(r"(figures/[\w/.-]+\.parquet)", intro)
    table = re.search(r"table `([\w-]+)`", intro) or re.search(r"\(table ([\w-]+)\)", intro)
    if not data or not table:
        return [f"length table: the paragraph before it links no .parquet file and names no table `...`: {intro[-200:]!r}"]
    cells = pd.read_parquet(REPO / data[0])
    cells = cells[cells["table"] == table.group(1)].drop(columns="table")
    if not len(cells):
        return [f"length table: {data[0]} has no table {table.group(1)!r}"]
    summary = summarize(cells).set_index(["corpus", "seq_len", "label"])
    corpus_of = {h.lower(): c for c, h in cells.groupby("corpus")["heldout"].first().items()}
    problems, corpus = [], None
    for col, head in enumerate(header[1:], start=1):
        m = re.match(r"\*(\w+)\* dense$", head)
        if m:
            corpus = corpus_of.get(m.group(1).lower())
            if corpus is None:
                problems.append(f"column {head!r}: no held-out text {m.group(1)!r} in {data[0]}")
                continue
        for row in body:
            tokens, shown = int(row[0]), row[col]

            def value(label, column, fmt):
                key = (corpus, tokens, label)
                return format(summary.loc[key, column], fmt) if key in summary.index else "missing"
            if m:
                want = value("dense", "perplexity", ".2f")
            elif (k := re.match(r"hard top-(\d)$", head)):
                lab = f"hard_top{k.group(1)}"
                want = f"{value(lab, 'delta_vs_dense_pct', '+.1f')}% [{value(lab, 'distant_pairs_kept', '.2f')}]"
            elif head == "vs random top-1 / top-2":
                want = " / ".join(f"{value(f'random_top{k}', 'control_vs_router_pct', '+.1f')}%" for k in (1, 2))
            else:
                problems.append(f"column {head!r}: no rule to find it in the data")
                break
            if shown != want:
                problems.append(f"{corpus} {tokens} tokens, {head!r}: README {shown!r}, data {want!r}")
    return problems


def readme_table_problems(text: str) -> list[str]:
    """Every number of every table of the README, checked against the committed data file the
    paragraph before the table links; a table of no known kind is a problem too."""
    problems = []
    for intro, header, body in markdown_tables(text):
        if header[0] == "tokens" and any(h.endswith("dense") for h in header):
            problems += _length_table_problems(intro, header, body)
        elif not any(re.search(r"\d", c) for row in body for c in row):
            continue  # a table without numbers (e.g. the documentation index)
        else:
            problems.append(f"a table with numbers and no rule to check them: {header}")
    return problems


def test_every_number_in_the_readme_tables_is_in_the_data_it_links():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert markdown_tables(text), "README.md has no table"
    problems = readme_table_problems(text)
    assert not problems, "README.md's tables disagree with the committed data:\n" + "\n".join(problems)


def test_readme_number_check_fails_on_a_changed_number():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| 4096 |"))
    cells = row.split("|")
    cells[3] = cells[3].replace("%", "1%", 1)  # hard top-2 at 4096: +0.9% -> +0.91%
    bad = text.replace(row, "|".join(cells))
    assert bad != text and readme_table_problems(bad)
    assert readme_table_problems(text.replace("| 27.60 |", "| 27.61 |"))
    linked = re.search(r"\(table ([a-z0-9_]+)\)", text).group(0)  # the committed table the block's marker cites
    assert readme_table_problems(text.replace(linked, "(table nothing)"))

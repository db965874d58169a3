"""The documentation is self-contained: no file cites the method notes
that used to live outside the repository, and every relative link of README.md, docs/ and
figures/README.md points to a file of the repository, i.e. one a fresh clone has.

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
# relative links

_FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1", re.S | re.M)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)


def markdown_links(text: str) -> list[str]:
    """Link and image targets of a markdown text, outside code blocks and code spans."""
    text = _CODE_SPAN.sub("", _FENCE.sub("", text))
    return _INLINE.findall(text) + _REFERENCE.findall(text)


def heading_slugs(text: str) -> set[str]:
    """GitHub's anchors of the headings of a markdown text."""
    slugs = set()
    for line in _FENCE.sub("", text).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            title = re.sub(r"[^\w\- ]", "", m.group(1).replace("`", "").lower())
            slugs.add(title.replace(" ", "-"))
    return slugs


def test_markdown_helpers():
    text = ("# A title: `x`\n\n[a](b.md) ![i](img/p.png \"t\") [c](#a-title-x) `[no](code.md)`\n"
            "```\n[no](fenced.md)\n```\n[ref]: docs/r.md\n[web](https://example.org)\n")
    assert markdown_links(text) == ["b.md", "img/p.png", "#a-title-x", "https://example.org", "docs/r.md"]
    assert heading_slugs(text) == {"a-title-x"}
    assert "5-results-to-compare-against" in heading_slugs("## 5. Results to compare against\n")


def _link_cases() -> list:
    files = repository_files()
    if files is None:
        return [pytest.param(None, None, marks=pytest.mark.skip(reason="not a git checkout"))]
    pages = [p for p in LINKED_PAGES if p in files]
    pages += sorted(p for p in files if p.startswith("docs/") and p.endswith(".md"))
    cases = []
    for page in pages:
        for target in dict.fromkeys(markdown_links((REPO / page).read_text(encoding="utf-8"))):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
                continue
            cases.append(pytest.param(page, target, id=f"{page}->{target}"))
    return cases


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


@pytest.mark.parametrize("page,target", _link_cases())
def test_relative_link_points_into_the_repository(page, target):
    files = repository_files()
    path, _, anchor = target.partition("#")
    path = urllib.parse.unquote(path.split("?", 1)[0])
    rel = _resolve(page, path) if path else page
    assert rel is not None, f"{page}: link {target!r} leaves the repository"
    is_dir = any(f.startswith(rel + "/") for f in files)
    assert rel in files or is_dir, (
        f"{page}: link {target!r} points to {rel}, which is not in the repository "
        f"({'git-ignored: commit it or link something else' if is_ignored(rel) else 'no such file'})")
    if anchor and rel.endswith(".md") and rel in files:
        slugs = heading_slugs((REPO / rel).read_text(encoding="utf-8"))
        assert anchor in slugs, f"{page}: link {target!r}: {rel} has no heading #{anchor} (it has {sorted(slugs)})"


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
    data = [t for t in markdown_links(intro) if t.endswith(".parquet")]
    table = re.search(r"table `([\w-]+)`", intro)
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
    assert readme_table_problems(text.replace("table `shipped`", "table `nothing`"))

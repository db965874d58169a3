"""The documentation is self-contained (issue 16 items 1 and 3): no file cites the method notes
that used to live outside the repository, and every relative link of README.md, docs/ and
figures/README.md points to a file of the repository, i.e. one a fresh clone has.

"Of the repository" means tracked by git, or new and not git-ignored (so a page written but not
yet committed counts, a generated, git-ignored file does not). The figures' PNGs are committed
(issue 16 item 1), so a link to a figure that is not is a failure like any other; the generated
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

"""Generated result blocks: every results table of README.md and docs/ is written by one command
(``focus-lab-figures --docs``) from the committed tables, between two markers that name the block,
the command and its inputs::

    <!-- BEGIN generated:length-table | focus-lab-figures --docs | inputs: ... -->

    | tokens | ... |

    <!-- END generated:length-table -->

``BLOCKS`` maps a block's name to its maker (``Block``): a function of nothing that reads the
committed tables and returns ``Generated(inputs, body)``: the inputs line of the begin marker
(table files, router file name and sha256, windows, patterns) and the markdown between the markers.
A page may hold any block, and the same block may stand on several pages (the same text on each).

* ``render(name)``: the block's whole text, markers included;
* ``check()``: one line per block whose committed text differs from ``render`` (naming the file
  and the block) or whose maker fails (naming the missing input); tests/test_doc_blocks.py fails
  on any;
* ``write()``: rewrites every block in place (each page atomically); a block whose maker fails is
  left as it was and reported.

Sources: the issue "Every number in the docs comes from the data"; the tables' own scripts
(``analyses.length_table``, ``analyses.studies.domain_table``, ``analyses.studies.retrieval_table``,
``analyses.output_error_table``, ``analyses.studies.copy_loss``) make the numbers, this module only
lays them out.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from focus_lab.train.chain import KEY_SHIFT

REPO = Path(__file__).resolve().parent.parent
COMMAND = "focus-lab-figures --docs"
BEGIN = re.compile(r"^<!-- BEGIN generated:(?P<name>[a-z0-9-]+) \| (?P<rest>.*) -->$")
END = "<!-- END generated:{name} -->"


class MissingInput(Exception):
    """A block's input (a committed table, a column, a table name inside it) is absent: ``path`` is
    what is missing, relative to the repository."""

    def __init__(self, path: str):
        super().__init__(path)
        self.path = path


@dataclass(frozen=True)
class Generated:
    """What a block's maker returns: ``inputs``, the begin marker's description of what made the
    numbers (files, router file name and sha256, windows, patterns; one line), and ``body``, the
    markdown between the markers (no leading or trailing blank line)."""

    inputs: str
    body: str


@dataclass(frozen=True)
class Block:
    """A named block and its maker; ``inputs`` are the repository paths the maker reads (checked
    before it runs, so a missing file is named, not a traceback)."""

    name: str
    make: Callable[[], Generated]
    inputs: tuple[str, ...]


BLOCKS: dict[str, Block] = {}


def block(name: str, *inputs: str):
    """Register the decorated function as the maker of block ``name`` reading ``inputs``."""
    def register(fn: Callable[[], Generated]) -> Callable[[], Generated]:
        if name in BLOCKS:
            raise ValueError(f"block {name!r} is registered twice")
        BLOCKS[name] = Block(name, fn, inputs)
        return fn
    return register


def table_row(text: str, *first: str) -> list[str]:
    """The cells (stripped) of the first markdown table row of ``text`` whose leading cells are
    ``first``, e.g. ``table_row(render("gemma-token-blocks"), "*Hamlet*", "16384")``. Raises
    KeyError naming ``first`` when no row starts so (what a test of a block reads its numbers with)."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[:len(first)] == list(first):
            return cells
    raise KeyError(f"no table row starts with {first!r}")


def render(name: str) -> str:
    """The whole text of block ``name``: begin marker, blank line, body, blank line, end marker.

    Raises:
        KeyError: no block of that name (the message lists the names).
        MissingInput: an input file (or a table inside one) is absent.
    """
    if name not in BLOCKS:
        raise KeyError(f"no generated block {name!r}; known: {', '.join(sorted(BLOCKS))}")
    b = BLOCKS[name]
    for rel in b.inputs:
        if not (REPO / rel).exists():
            raise MissingInput(rel)
    g = b.make()
    return (f"<!-- BEGIN generated:{name} | {COMMAND} | inputs: {g.inputs} -->\n\n{g.body.strip()}\n\n"
            + END.format(name=name))


def pages(root: Path = REPO) -> list[Path]:
    """The markdown pages that may hold blocks: README.md, docs/**.md and figures/**.md of the
    repository (tracked, or new and not ignored; every such file when git is absent)."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "--", "*.md"], cwd=root,
                             capture_output=True, text=True, check=True).stdout.split()
        files = [root / f for f in out]
    except (OSError, subprocess.CalledProcessError):
        files = list(root.rglob("*.md"))
    keep = [f for f in files if f.is_file() and (f.relative_to(root).parts[0] in ("docs", "figures")
                                                 or f.relative_to(root).as_posix() == "README.md")]
    return sorted(keep)


@dataclass
class Found:
    """One block found on a page: its name, the slice of the page's lines it spans (markers
    included) and its text."""

    name: str
    start: int
    stop: int
    text: str


def find_blocks(text: str, rel: str = "page") -> list[Found]:
    """Every block of a page's ``text``. Raises ValueError naming the page and line of a begin
    marker without its end marker."""
    lines = text.split("\n")
    found, i = [], 0
    while i < len(lines):
        m = BEGIN.match(lines[i])
        if m:
            end = END.format(name=m["name"])
            try:
                j = lines.index(end, i + 1)
            except ValueError:
                raise ValueError(f"{rel}:{i + 1}: block {m['name']!r} has no end marker {end!r}") from None
            found.append(Found(m["name"], i, j + 1, "\n".join(lines[i:j + 1])))
            i = j + 1
        else:
            i += 1
    return found


def _rendered(cache: dict, name: str) -> str | Exception:
    if name not in cache:
        try:
            cache[name] = render(name)
        except (MissingInput, KeyError) as e:
            cache[name] = e
    return cache[name]


def _problem(rel: str, name: str, e: Exception) -> str:
    if isinstance(e, MissingInput):
        return f"{rel}: block {name}: missing input {e.path}"
    return f"{rel}: block {name}: {e.args[0] if e.args else e}"


def check(root: Path = REPO) -> list[str]:
    """One line per problem: a block whose committed text is not what ``render`` writes, a block
    whose input is missing or whose name is unknown, a begin marker without its end."""
    problems, cache = [], {}
    for page in pages(root):
        rel = page.relative_to(root).as_posix()
        try:
            found = find_blocks(page.read_text(encoding="utf-8"), rel)
        except ValueError as e:
            problems.append(str(e))
            continue
        for f in found:
            new = _rendered(cache, f.name)
            if isinstance(new, Exception):
                problems.append(_problem(rel, f.name, new))
            elif new != f.text:
                problems.append(f"{rel}: block {f.name} differs from what `{COMMAND}` writes: run it")
    return problems


def write(root: Path = REPO) -> tuple[list[str], list[str]]:
    """Rewrite every block of every page; returns (pages changed, problems). A block whose maker
    fails stays as it was; each page is written atomically, and only when it changed."""
    from focus_lab.io import write_text
    changed, problems, cache = [], [], {}
    for page in pages(root):
        rel = page.relative_to(root).as_posix()
        text = page.read_text(encoding="utf-8")
        try:
            found = find_blocks(text, rel)
        except ValueError as e:
            problems.append(str(e))
            continue
        if not found:
            continue
        lines = text.split("\n")
        for f in reversed(found):
            new = _rendered(cache, f.name)
            if isinstance(new, Exception):
                problems.append(_problem(rel, f.name, new))
                continue
            lines[f.start:f.stop] = new.split("\n")
        new_text = "\n".join(lines)
        if new_text != text:
            write_text(page, new_text)
            changed.append(rel)
    return changed, problems



# ============================================================================================
# numbers in prose

#: the pages whose prose must take its measured numbers from generated blocks (their own, or those
#: of a page they link)
PROSE_PAGES = ("README.md", "docs/results.md", "docs/reproduction.md", "docs/levers.md", "docs/recipes.md",
               "docs/studies/README.md")
#: a measured number: a decimal (27.60, 0.112), a percentage (+0.6%, 51%) or a ratio (1.19x)
MEASURED = re.compile(r"(?<![\w.\-/#`\u00a7])[+\-\u2212]?\d+(?:\.\d+)?(?:%|x\b)|(?<![\w.\-/#`\u00a7])[+\-]?\d+\.\d+(?![\w.])")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_MD_LINK = re.compile(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)")
#: numbers that are not measurements: settings, criteria, the paper's own numbers, identifiers
#: (page -> the number strings allowed in its prose, as written)
ALLOWED = {
    "*": {"2604.03260"},
    "README.md": {"2x", "1%", "2%", "3.11"},
    "docs/results.md": {"50%"},
    "docs/recipes.md": {"1.5%", "55%", "+4%", "2%", "90%", "+1.0%", "3%"},
    "docs/levers.md": {"1.6", "1.7", "2.6", "2.7", "2.8", "2.9", "0.5"},
}


def _number(s: str) -> str:
    """A number as compared: its sign, digits and unit as written, but a leading "+" (a change stated
    without its sign in prose is the same number)."""
    return s.replace("\u2212", "-").lstrip("+")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text) of a page's prose: not in a code fence, a generated block or a table;
    inline code and link targets blanked."""
    fenced = set()
    for m in _FENCE.finditer(text):
        a = text.count("\n", 0, m.start())
        fenced.update(range(a, a + m.group(0).count("\n") + 1))
    out, inside = [], False
    for n, line in enumerate(text.split("\n")):
        if BEGIN.match(line):
            inside = True
        elif inside:
            inside = not line.startswith("<!-- END generated:")
        elif n not in fenced and not line.lstrip().startswith("|"):
            out.append((n + 1, re.sub(r"\]\([^)]*\)", "]", re.sub(r"`[^`]*`", "", line))))
    return out


def _block_modules() -> list:
    """The modules of analyses/blocks/ (each may declare ``PROSE_PAGES`` and ``ALLOWED`` of its own)."""
    import sys
    return [m for name, m in sorted(sys.modules.items()) if name.startswith("analyses.blocks.") and m is not None]


def prose_pages() -> tuple[str, ...]:
    """The pages whose prose the check reads: ``PROSE_PAGES`` and each analyses/blocks/ module's
    ``PROSE_PAGES`` (the pages whose tables that module generates)."""
    extra = [p for m in _block_modules() for p in getattr(m, "PROSE_PAGES", ())]
    return tuple(dict.fromkeys([*PROSE_PAGES, *extra]))


def allowed_numbers(rel: str) -> set[str]:
    """The number strings allowed in ``rel``'s prose (settings, criteria, identifiers): ``ALLOWED``
    here and in each analyses/blocks/ module."""
    out = set(ALLOWED["*"]) | ALLOWED.get(rel, set())
    for m in _block_modules():
        out |= getattr(m, "ALLOWED", {}).get(rel, set())
    return out


def prose_problems(root: Path = REPO, pages_: tuple[str, ...] | None = None) -> list[str]:
    """One line per measured number in the prose of ``pages_`` that no generated block holds, on
    its page or on a page it links (compared without sign, % or x), and that ``ALLOWED`` does not
    list: ``page:line: number N is in no generated block here or on a linked page``."""
    problems, blocks_of = [], {}
    pages_ = prose_pages() if pages_ is None else pages_

    def numbers(path: Path) -> set[str]:
        if path not in blocks_of:
            text = path.read_text(encoding="utf-8") if path.is_file() else ""
            blocks_of[path] = {_number(m.group(0)) for f in find_blocks(text) for m in MEASURED.finditer(f.text)}
        return blocks_of[path]
    for rel in pages_:
        page = root / rel
        text = page.read_text(encoding="utf-8")
        pool = set(numbers(page))
        for link in _MD_LINK.findall(text):
            pool |= numbers((page.parent / link).resolve())
        allowed = allowed_numbers(rel)
        for n, line in prose_lines(text):
            for m in MEASURED.finditer(line):
                x = _number(m.group(0))
                # "0.21 points" in prose is the "+0.21%" of a block
                unitless_pct = not x.endswith(("%", "x")) and f"{x}%" in pool
                if m.group(0) not in allowed and x not in pool and not unitless_pct:
                    problems.append(f"{rel}:{n}: number {m.group(0)} is in no generated block here or on a linked page")
    return problems

# ============================================================================================
# shared inputs

LENGTH_CELLS = "figures/results/length_cells.parquet"
SHIPPED_TABLE = "capacity_length"
HELD_NAMES = {"persuasion": "*Persuasion*", "hamlet": "*Hamlet*"}


def router_label(sha256: str) -> str:
    """``name (sha256 abcdef123456)`` for a router file's sha256: its manifest name, or the
    hash alone for a file the manifest does not name."""
    from focus_lab.hf.shipped import named_file
    name = named_file(sha256)
    return f"`{name}` (sha256 {sha256[:12]})" if name else f"sha256 {sha256[:12]}"


def name_sha256(name: str) -> str:
    """The sha256 the router manifest gives the file ``name``. Raises MissingInput when it names none."""
    from focus_lab.hf.shipped import registry
    entry = registry().get("files", {}).get(name)
    if entry is None:
        raise MissingInput(f"focus_lab/routers/MANIFEST.json (file {name})")
    return entry["sha256"]


def _cells(table: str) -> pd.DataFrame:
    from analyses.length_table import committed_cells
    df = committed_cells(REPO / LENGTH_CELLS)
    df = df[df["table"] == table]
    if not len(df):
        raise MissingInput(f"{LENGTH_CELLS} (table {table})")
    return df.drop(columns="table")


def _windows_text(df: pd.DataFrame) -> str:
    """``8 windows a length, 4 at 8192``: windows per (corpus, length), the most common count
    first, then the lengths that differ."""
    per = df.groupby(["seq_len", "corpus"]).window.nunique().groupby("seq_len").max()
    common = per.mode().iloc[0]
    others = [f"{n} at {L}" for L, n in per.items() if n != common]
    return f"{common} windows a length" + (", " + ", ".join(others) if others else "")


def _routers_text(df: pd.DataFrame) -> str:
    return "; ".join(router_label(s) for s in sorted(df.routers_sha256.unique()))


# ============================================================================================
# the blocks

@block("length-table", LENGTH_CELLS)
def length_table_readme() -> Generated:
    """The README's length table: per length and held-out corpus, dense perplexity, hard top-2 and
    top-1 (change over dense, distant pairs kept) and the router's margin over random groups."""
    from analyses.length_table import summarize
    df = _cells(SHIPPED_TABLE)
    s = summarize(df).set_index(["corpus", "seq_len", "label"])
    corpora = sorted(df.corpus.unique())
    held = {c: HELD_NAMES.get(df[df.corpus == c].heldout.iloc[0], c) for c in corpora}
    head = "| tokens | " + " | ".join(f"{held[c]} dense | hard top-2 | hard top-1 | vs random top-1 / top-2"
                                        for c in corpora) + " |"
    rule = "|---:|" + "---:|---|---|---|" * len(corpora)
    lines = [head, rule]
    for L in sorted(df.seq_len.unique()):
        cells = []
        for c in corpora:
            r = lambda p: s.loc[(c, L, p)]  # noqa: E731
            cells += [f"{r('dense').perplexity:.2f}",
                      f"{r('hard_top2').delta_vs_dense_pct:+.1f}% [{r('hard_top2').distant_pairs_kept:.2f}]",
                      f"{r('hard_top1').delta_vs_dense_pct:+.1f}% [{r('hard_top1').distant_pairs_kept:.2f}]",
                      f"{r('random_top1').control_vs_router_pct:+.1f}% / {r('random_top2').control_vs_router_pct:+.1f}%"]
        lines.append(f"| {L} | " + " | ".join(cells) + " |")
    inputs = (f"{LENGTH_CELLS} (table {SHIPPED_TABLE}); routers {_routers_text(df)}; "
              f"{_windows_text(df)}; patterns dense, hard_top1, hard_top2, random_top1, random_top2")
    return Generated(inputs, "\n".join(lines))


@block("length-table-full", LENGTH_CELLS)
def length_table_full() -> Generated:
    """figures/length_table.md: every pattern of the shipped table with its interval
    (``analyses.length_table.report_text``)."""
    from analyses.length_table import report_text
    df = _cells(SHIPPED_TABLE)
    text = report_text(None, table=SHIPPED_TABLE)
    inputs = f"{LENGTH_CELLS} (table {SHIPPED_TABLE}); routers {_routers_text(df)}; {_windows_text(df)}"
    return Generated(inputs, text)


#: Gemma-3-270M's shipped file, ``gemma3-270m/distill64-8k-keyshift`` (docs/studies/gemma-routers.md):
#: its rules hold the key shift, so its rows ``hard_topK`` and ``random_topK`` run with it
GEMMA_TABLE = "gemma3_keyshift_length"
#: the file of chain stage g5, ``gemma3-270m/distill64-8k`` (the same tensors, the paper's rule), whose
#: table the length-gap levers are compared with (docs/studies/gemma-length-gap.md)
GEMMA_G5_TABLE = "gemma3_distill64_8k"
GEMMA_G4_TABLE = "gemma3_needle_mix"  # its chain's stage g4, before the distillation at 8192 tokens


def _change(r, column: str = "delta_vs_dense_pct", lo: str = "ci_lo", hi: str = "ci_hi", windows: int = 3) -> str:
    """``+0.6% [+0.2, +1.0]``: a change in % with its 95% paired interval; the change alone under
    3 windows, where a bootstrap over windows gives no interval worth printing."""
    if windows < 3:
        return f"{getattr(r, column):+.1f}%"
    return f"{getattr(r, column):+.1f}% [{getattr(r, lo):+.1f}, {getattr(r, hi):+.1f}]"


@block("gemma-length-table", LENGTH_CELLS)
def gemma_length_table() -> Generated:
    """Gemma-3-270M's length table: per held-out corpus and length, dense perplexity, the change of
    window, hard top-1 and hard top-2 over dense (95% paired interval over windows from 3 windows
    up; distant pairs kept), and random groups' change over the router at the same k (> 0: the
    router is better)."""
    from analyses.length_table import summarize
    df = _cells(GEMMA_TABLE)
    s = summarize(df).set_index(["corpus", "seq_len", "label"])
    lines = ["| held out | tokens | windows | dense | window | hard top-1 | hard top-2 | random top-1 vs router "
             "| random top-2 vs router |", "|---|---:|---:|---:|---|---|---|---|---|"]
    for (c, L), g in df.groupby(["corpus", "seq_len"], sort=True):
        r = lambda p: s.loc[(c, L, p)]  # noqa: E731
        kept = lambda p: f" {{{r(p).distant_pairs_kept:.2f}}}"  # noqa: E731
        n = int(r("dense").windows)  # the windows every pattern ran on (summarize)
        vs = lambda p: _change(r(p), "control_vs_router_pct", "control_ci_lo", "control_ci_hi", n)  # noqa: E731
        lines.append(f"| {HELD_NAMES.get(g.heldout.iloc[0], g.heldout.iloc[0])} | {L} | {n} | "
                     f"{r('dense').perplexity:.2f} | {_change(r('window'), windows=n)} | "
                     f"{_change(r('hard_top1'), windows=n)}{kept('hard_top1')} | "
                     f"{_change(r('hard_top2'), windows=n)}{kept('hard_top2')} | {vs('random_top1')} | {vs('random_top2')} |")
    inputs = (f"{LENGTH_CELLS} (table {GEMMA_TABLE}); model gemma3-270m; routers {_routers_text(df)}; "
              f"{_windows_text(df)}; patterns dense, window, hard_top1, hard_top2, random_top1, random_top2")
    return Generated(inputs, "\n".join(lines))


GEMMA_CHAIN = "figures/gemma/chain.json"
#: stage g5's train log (``focus-lab train ... --seq-len 8192 --init-routers <g4's file>``, its own command)
GEMMA_G5_LOG = "figures/gemma/g5_train_log.parquet"
GEMMA_KEY_SLICED = "figures/gemma/bench_key_sliced.csv"


#: stage g6 (``routers set-rules`` with the key shift), timed by its own command from g5's file
GEMMA_G6 = "figures/gemma/g6_rules.json"


@block("gemma-chain", GEMMA_CHAIN, GEMMA_G5_LOG, GEMMA_G6)
def gemma_chain() -> Generated:
    """Gemma-3-270M's router chain (``focus-lab routers build --model gemma3-270m``): stages g1-g4's
    seconds and peak RSS as its ``chain.json`` recorded them, then stage g5's training steps (the
    sum of its train log's step seconds; it ran by its own command from g4's file, so no process
    time or peak RSS), stage g6 as its own command timed it (``GEMMA_G6``), and the total."""
    import json
    from focus_lab.train.chain import GEMMA_LONG_STEPS, gemma_stages
    rec = json.loads((REPO / GEMMA_CHAIN).read_text())
    if rec.get("model") != "gemma3-270m":
        raise MissingInput(f"{GEMMA_CHAIN} (a gemma3-270m chain)")
    lines = ["| stage | command | seconds | peak RSS |", "|---|---|---:|---:|"]
    for name, st in rec["stages"].items():
        cmd = st["command"].replace("checkpoints/gemma3_chain/", "")
        lines.append(f"| {name} | `{cmd}` | {st['seconds']:.0f} | {st['peak_rss_gb']:.2f} GiB |")
    log = pd.read_parquet(REPO / GEMMA_G5_LOG)
    steps = log.groupby("step").seconds.first()
    if len(steps) != GEMMA_LONG_STEPS:
        raise MissingInput(f"{GEMMA_G5_LOG} ({GEMMA_LONG_STEPS} steps)")
    (g5, g5_args, _), (g6, g6_args, _) = gemma_stages(Path("."))[-2:]
    lines.append(f"| {g5} | `focus-lab {' '.join(g5_args)}` | {steps.sum():.0f} (steps) | - |")
    last = json.loads((REPO / GEMMA_G6).read_text())
    if last.get("stage") != g6:
        raise MissingInput(f"{GEMMA_G6} (stage {g6})")
    lines.append(f"| {g6} | `focus-lab {' '.join(g6_args)}` | {last['seconds']:.0f} | {last['peak_rss_gb']:.2f} GiB |")
    total = rec["total_seconds"] + steps.sum() + last["seconds"]
    lines.append(f"| total | | **{total:.0f}** ({total / 60:.1f} min) | "
                 f"{max(st['peak_rss_gb'] for st in rec['stages'].values()):.2f} GiB (g1-g4) |")
    from focus_lab.hf.shipped import named_file
    final = list(rec["stages"].values())[-1]["sha256"]
    inputs = (f"{GEMMA_CHAIN} (stages g1-g4, result {named_file(final) or final[:12]}, sha256 {final[:12]}; this 2-core "
              f"CPU, load average 2.2-2.8); {GEMMA_G5_LOG} (stage g5 from that file, result gemma3-270m/distill64-8k, "
              f"nothing else running); {GEMMA_G6} (stage g6 from g5's file, result "
              f"{named_file(last['sha256']) or last['sha256'][:12]}, sha256 {last['sha256'][:12]}; {last['machine']['cpu_model']})")
    return Generated(inputs, "\n".join(lines))


@block("gemma-key-sliced", GEMMA_KEY_SLICED)
def gemma_key_sliced() -> Generated:
    """``analyses.bench_key_sliced``: Gemma-3-270M's Focus body forward with the whole masked
    product against key-sliced attention, per length and pattern, and the global layers' share."""
    df = pd.read_csv(REPO / GEMMA_KEY_SLICED)
    sliced = df[df.path == "key_sliced"].set_index(["seq_len", "pattern"]).body_s
    lines = ["| tokens | pattern | whole (s) | key-sliced (s) | speed-up | dense / pattern, key-sliced | global "
             "layers' share (key-sliced) | max abs difference |", "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for (T, pat), g in df.groupby(["seq_len", "pattern"], sort=False):
        g = g.set_index("path")
        k = g.loc["key_sliced"]
        w = g.body_s.get("whole")  # None where only the key-sliced path ran
        ratio = f"{sliced[(T, 'dense')] / k.body_s:.2f}x" if (T, "dense") in sliced.index else "-"
        diff = f"{k.max_abs_diff:.1e}" if pd.notna(k.max_abs_diff) else "-"
        lines.append(f"| {T} | {pat} | {'-' if w is None else f'{w:.1f}'} | {k.body_s:.1f} | "
                     f"{'-' if w is None else f'{w / k.body_s:.2f}x'} | {ratio} | {k.global_share_of_body:.0%} | {diff} |")
    runs = []  # each run (router file, commit, machine) with its lengths: the rows mix runs
    for (name, commit, machine), g in df.groupby(["router_name", "commit", "machine"], sort=False):
        runs.append(f"{', '.join(str(t) for t in sorted(g.seq_len.unique()))} tokens: routers {name}, commit {commit}, "
                    f"{machine}, load average {g.load_before.min():.1f}-{g.load_before.max():.1f} before a forward")
    inputs = f"{GEMMA_KEY_SLICED}; one Persuasion window a length; " + "; ".join(runs)
    return Generated(inputs, "\n".join(lines))


#: g5's file's oracle gap (`gemma3-270m/distill64-8k`); stage g4's is figures/gemma/oracle_needle_mix/
GEMMA_ORACLE = "figures/gemma/oracle_distill64_8k/oracle_gap.parquet"


def oracle_block(path: str) -> Generated:
    """An oracle-gap run's table (``analyses.studies.oracle_gap.gap_table``), its inputs line naming
    ``path`` and what ran."""
    from analyses.studies.oracle_gap import gap_table
    head, table = gap_table(pd.read_parquet(REPO / path))
    return Generated(f"{path}; {head}", table)


@block("gemma-oracle", GEMMA_ORACLE)
def gemma_oracle() -> Generated:
    """Gemma-3-270M's oracle gap (``analyses.studies.oracle_gap --model gemma3-270m``): the router,
    random groups and the oracle (each query's heaviest distant keys at its groups' budget) against
    dense and against each other."""
    return oracle_block(GEMMA_ORACLE)


#: g5's file's oracle gap on held-out *Hamlet* at 16384 tokens, where random groups beat it
#: (docs/studies/gemma-length-gap.md): whether better groups exist at its budget there
GEMMA_ORACLE_HAMLET = "figures/gemma/oracle_hamlet_16k/oracle_gap.parquet"


@block("gemma-oracle-hamlet-16k", GEMMA_ORACLE_HAMLET)
def gemma_oracle_hamlet() -> Generated:
    """``gemma-oracle``'s table for the run on *Hamlet*'s three windows of 16384 tokens."""
    return oracle_block(GEMMA_ORACLE_HAMLET)


#: stage g4's runs (``gemma3-270m/needle-mix``; dense, its default and random groups at its sparsity),
#: one probe's cases a file: RULER's single needle in its noise sentences at 8192 tokens (and 16384, 3
#: cases), in held-out prose (Persuasion) at 16384 and 32768 (``focus-lab probe retrieval --model
#: gemma3-270m --format plain``)
GEMMA_G4_RETRIEVAL = ("figures/gemma/retrieval_8k/cases.parquet", "figures/gemma/retrieval_16k_noise/cases.parquet",
                      "figures/gemma/retrieval_16k/cases.parquet", "figures/gemma/retrieval_32k/cases.parquet")
#: stage g5's file's runs (``gemma3-270m/distill64-8k``; dense and its default, ``--patterns default``)
#: on the same cases (seeds) as stage g4's
GEMMA_G5_RETRIEVAL = ("figures/gemma/retrieval_16k_distill64_8k/cases.parquet",
                      "figures/gemma/retrieval_32k_distill64_8k/cases.parquet")
#: the shipped file's default on the same cases: dense and ``hard_top2+key_shift``, run on g5's file
#: (the same tensors; the shipped file saves that pattern as its rules) at 16384 and 32768 tokens
GEMMA_RETRIEVAL = ("figures/gemma/retrieval_16k_keyshift/cases.parquet",
                   "figures/gemma/retrieval_32k_keyshift/cases.parquet")
#: the shipped file's rules for top-2, as its chain's stage g6 writes them
GEMMA_DEFAULT = KEY_SHIFT
#: each single-needle task's haystack (docs/retrieval.md's task table)
HAYSTACK = {"niah_single_1": "noise sentences", "niah_single_2": "*Persuasion*", "niah_single_3": "*Persuasion*"}
#: how far the same case's dense answer log-prob may differ between two runs (nats): the forwards are
#: the same but for torch's thread count
DENSE_AGREEMENT = 0.01


def _read_cases(files) -> pd.DataFrame:
    missing = [f for f in files if not (REPO / f).exists()]
    if missing:
        raise MissingInput(", ".join(missing))
    return pd.concat([pd.read_parquet(REPO / f) for f in files], ignore_index=True)


def gemma_retrieval_cases() -> pd.DataFrame:
    """The shipped file's retrieval cases (``GEMMA_RETRIEVAL``: dense and the file's default, the
    rows whose canonical pattern is ``GEMMA_DEFAULT``, as ``default``) with stage g4's
    ``random_default`` rows on the same (task, length, seed) (``GEMMA_G4_RETRIEVAL``: balanced random
    groups at top-2, without the key shift; they do not depend on the file's tensors, and shifting
    random groups by one token gives random groups again). Raises MissingInput when a case's dense
    score or answer log-prob differs between the two runs (by more than ``DENSE_AGREEMENT`` nats):
    then they did not run the same case."""
    new, g4 = _read_cases(GEMMA_RETRIEVAL), _read_cases(GEMMA_G4_RETRIEVAL)
    new = new.assign(pattern=new.pattern.where(new.canonical_pattern != GEMMA_DEFAULT, "default"))
    key = ["task", "length", "seed"]
    a = new[new.pattern == "dense"].set_index(key)
    b = g4[g4.pattern == "dense"].set_index(key).reindex(a.index)  # NaN where g4 did not run the case
    rand = g4[g4.pattern == "random_default"].set_index(key).reindex(a.index)
    if rand.score.isna().any():
        raise MissingInput(f"{', '.join(GEMMA_G4_RETRIEVAL)} (random_default on every case of {', '.join(GEMMA_RETRIEVAL)})")
    if ((a.score != b.score) | ~((a.answer_logprob - b.answer_logprob).abs() <= DENSE_AGREEMENT)).any():
        raise MissingInput(f"{', '.join(GEMMA_RETRIEVAL)} (dense answers equal to those of {', '.join(GEMMA_G4_RETRIEVAL)})")
    return pd.concat([new[new.pattern.isin(["dense", "default"])], rand.reset_index()], ignore_index=True)


@block("gemma-retrieval", *GEMMA_RETRIEVAL, *GEMMA_G4_RETRIEVAL)
def gemma_retrieval() -> Generated:
    """Gemma-3-270M's shipped file on RULER's single needle (``focus-lab probe retrieval --model
    gemma3-270m --format plain``), each task and length of ``gemma_retrieval_cases``: per pattern
    the score, the answer's log-prob change over dense (nats, 95% paired interval over cases),
    distant and needle pairs kept; then the router against random groups, paired over cases
    (``retrieval.paired_difference``)."""
    from focus_lab.eval import retrieval_tables as rt
    cases = gemma_retrieval_cases()
    s = rt.summary(cases)
    lines = ["| task | haystack | tokens | pattern | cases | score | answer log-prob vs dense | distant pairs kept | "
             "needle pairs kept |", "|---|---|---:|---|---:|---:|---|---:|---:|"]
    for r in s.itertuples():
        lines.append(f"| {r.task} | {HAYSTACK.get(r.task, '')} | {r.length} | `{r.pattern}` | {r.cases} | {r.score:.2f} | "
                     f"{r.logprob_change:+.2f} [{r.logprob_change_lo:+.2f}, {r.logprob_change_hi:+.2f}] | "
                     f"{r.distant_pairs_kept:.2f} | {r.needle_pairs_kept:.2f} |")
    lines += ["", "| router against random groups | task | tokens | difference | 95% interval | cases |",
              "|---|---|---:|---:|---|---:|"]
    for col, what in (("score", "score"), ("answer_logprob", "answer log-prob (nats)")):
        for r in rt.paired_difference(cases, "default", "random_default", col).itertuples():
            lines.append(f"| {what} | {r.task} | {r.length} | {r.difference:+.2f} | [{r.lo:+.2f}, {r.hi:+.2f}] | "
                         f"{r.cases} |")
    names = sorted(set(zip(cases.router_name, cases.router_sha256.str[:12])))
    inputs = (f"{', '.join(GEMMA_RETRIEVAL)} (dense, and `{GEMMA_DEFAULT}` on g5's file: the shipped file's default); "
              f"`random_default` (random top-2, no shift) from stage g4's runs "
              f"on the same seeds ({', '.join(GEMMA_G4_RETRIEVAL)}); model gemma3-270m, format plain (RULER's base template); routers "
              f"{'; '.join(f'{n} (sha256 {h})' for n, h in names)}; commits {', '.join(sorted(cases.commit.unique()))}; "
              f"seeds {cases.seed.min()}-{cases.seed.max()}")
    return Generated(inputs, "\n".join(lines))


DOMAIN_TABLES = ("capacity_length", "capacity_per_domain", "capacity_heldout_8k",
                 "needle_mix_length", "needle_mix_per_domain", "needle_mix_heldout_8k")


@block("per-domain", LENGTH_CELLS)
def per_domain() -> Generated:
    """docs/results.md's per-domain table (``analyses.studies.domain_table``)."""
    from analyses.length_table import committed_cells
    from analyses.studies.domain_table import domain_table
    cells = committed_cells(REPO / LENGTH_CELLS)
    missing = [t for t in DOMAIN_TABLES if t not in set(cells["table"])]
    if missing:
        raise MissingInput(f"{LENGTH_CELLS} (tables {', '.join(missing)})")
    shipped = cells[cells["table"].isin(DOMAIN_TABLES[:3])]
    inputs = (f"{LENGTH_CELLS} (tables {', '.join(DOMAIN_TABLES)}); routers {_routers_text(shipped)}; "
              "4 windows a domain at 4096 (the length table's 8 on Persuasion and Hamlet), 4 at 8192 where "
              "the text holds them")
    return Generated(inputs, domain_table(cells))


RETRIEVAL_CASES = "figures/results/retrieval_cases.parquet"


@block("retrieval", RETRIEVAL_CASES)
def retrieval() -> Generated:
    """docs/results.md's retrieval table (``analyses.studies.retrieval_table.results_markdown``)."""
    from analyses.studies.retrieval_table import results_markdown
    cases = pd.read_parquet(REPO / RETRIEVAL_CASES)
    if "router_name" not in cases:
        raise MissingInput(f"{RETRIEVAL_CASES} (column router_name: python -m analyses.migrate_tables)")
    routers = "; ".join(router_label(name_sha256(n)) for n in
                        sorted(cases.loc[cases.pattern == "hard_top2", "router_name"].dropna().unique()))
    inputs = f"{RETRIEVAL_CASES}; hard top-2 routers {routers}; every case of each task and length"
    return Generated(inputs, results_markdown(cases).strip())


OUTPUT_ERROR = "figures/results/output_error_8192.parquet"


@block("output-error", OUTPUT_ERROR)
def output_error() -> Generated:
    """docs/results.md's attention recall and output error table, one row per audited mask
    (``analyses.output_error_table.mask_rows``), and the correlation over heads."""
    from analyses.output_error_table import MASKS, mask_rows
    heads = pd.read_parquet(REPO / OUTPUT_ERROR)
    t = mask_rows(heads)
    lines = ["| mask | attention recall (coverage), mean over heads | output error, median [quartiles] | "
             "worst head | correlation over heads |", "|---|---:|---|---:|---:|"]
    for r in t.itertuples():
        lines.append(f"| {r.mask} | {r.recall:.3f} | {r.error} | {getattr(r, '_4')} | {r.correlation:+.2f} |")
    n = heads.groupby("pattern").size()
    inputs = (f"{OUTPUT_ERROR}; one window of 8192 tokens of Persuasion, {int(n.max())} heads a mask; masks "
              + ", ".join(m for m in MASKS if m in n.index))
    return Generated(inputs, "\n".join(lines))


COPY_LOSS = "figures/results/copy_loss.parquet"
COPY_DOMAINS = {"austen": "austen (Persuasion)", "shakespeare": "shakespeare (Hamlet)"}


@block("loss-split", COPY_LOSS)
def loss_split() -> Generated:
    """docs/results.md's "Where the loss goes" table from ``analyses.studies.copy_loss.summarize``:
    per domain, hard top-2's change over dense (nats/token), the distant copies' and the new
    tokens' share of tokens, share of the change and mean change, and random top-2's mean change
    on distant copies; domains in order of hard top-2's change."""
    from analyses.studies.copy_loss import summarize
    df = pd.read_parquet(REPO / COPY_LOSS)
    s = summarize(df).set_index(["corpus", "pattern", "copy_class"])
    total = df.groupby(["corpus", "pattern"]).apply(lambda d: d.delta_nll.sum() / d.tokens.sum(),
                                                    include_groups=False)
    lines = ["| domain | top-2: change (nats/token) | distant copies: tokens / share of change / nats | "
             "new: tokens / share / nats | random top-2: distant copies, nats |", "|---|---:|---|---|---:|"]
    cls = lambda c, p, k: s.loc[(c, p, k)]  # noqa: E731
    for corpus in total.xs("hard_top2", level="pattern").sort_values().index:
        d, n = cls(corpus, "hard_top2", "distant copy"), cls(corpus, "hard_top2", "new")
        rnd = (f"{cls(corpus, 'random_top2', 'distant copy').mean_delta:+.3f}"
               if (corpus, "random_top2", "distant copy") in s.index else "-")
        lines.append(f"| {COPY_DOMAINS.get(corpus, corpus)} | {total[(corpus, 'hard_top2')]:+.3f} | "
                     f"{d.token_share:.2f} / {d.loss_share:.2f} / {d.mean_delta:+.3f} | "
                     f"{n.token_share:.2f} / {n.loss_share:.2f} / {n.mean_delta:+.3f} | {rnd} |")
    windows = int(df.groupby("corpus").window.nunique().max())
    inputs = f"{COPY_LOSS}; {windows} windows of 4096 tokens a domain; patterns hard_top2, random_top2"
    return Generated(inputs, "\n".join(lines))


E2E = "figures/bench_attention/e2e.csv"


@block("speed-e2e", E2E)
def speed_e2e() -> Generated:
    """docs/results.md's end-to-end CPU speed table from ``analyses/bench_attention.py``'s e2e rows:
    dense time over each pattern's (bare prefill forward; decode per token)."""
    df = pd.read_csv(REPO / E2E)
    pre = df[df.phase == "prefill"]
    dec = df[df.phase == "decode"]
    cols = ["window", "hard_top1", "hard_top2", "random_top2"]
    lines = ["| dense / pattern | window + sinks (the bound) | hard top-1 | hard top-2 | random top-2 |",
             "|---|---:|---:|---:|---:|"]
    for L, g in pre.groupby("tokens"):
        g = g.set_index("pattern")
        lines.append(f"| prefill {L}, bare forward (dense {g.loc['dense'].bare_tokens_per_s:.1f} tokens/s) | "
                     + " | ".join(f"{g.loc[p].speedup_bare:.2f}x" if p in g.index else "-" for p in cols) + " |")
    if len(dec):
        sizes = sorted(dec.tokens.unique())
        d = dec.set_index(["pattern", "tokens"])
        per = lambda p: (" / ".join(f"{d.loc[(p, L)].speedup_decode:.2f}x" for L in sizes)  # noqa: E731
                         if all((p, L) in d.index for L in sizes) else "-")
        lines.append(f"| decode after {' / '.join(str(L) for L in sizes)} tokens (dense "
                     + " / ".join(f"{d.loc[('dense', L)].ms_per_token:.1f}" for L in sizes) + " ms a token) | "
                     + " | ".join(per(p) for p in cols) + " |")
    repeats = int(df.repeats.max())
    inputs = (f"{E2E}; the first Persuasion window of each length; medians over {repeats} repeats; "
              f"patterns {', '.join(['dense'] + cols)}")
    return Generated(inputs, "\n".join(lines))



@block("windows", LENGTH_CELLS)
def windows() -> Generated:
    """docs/results.md's "Which windows" table: dense perplexity of *Persuasion* at 4096 tokens on
    the three window sets the pages use, pooled from the length table's per-window dense rows (the
    figures' 4 windows and the first window are subsets of its 8; dense does not depend on the
    router file)."""
    import numpy as np
    df = _cells(SHIPPED_TABLE)
    dense = df[(df.corpus == "austen") & (df.seq_len == 4096) & (df.label == "dense")]
    all8 = sorted(int(w) for w in dense.window.unique())
    sets = [("the length table", all8, "the [README's table](../README.md#what-it-finds), figure 10, "
             "[per domain](#per-domain-trained-and-held-out-text) below"),
            ("the figures' experiments", [0, 7, 14, 21], "baselines (figures 1, 4), the [reproduction](reproduction.md) "
             "rows at 4 x 4096 tokens (`focus-lab-figures`, setting `eval_windows = 4`)"),
            ("the first window", [0], "the [speed benchmark](#speed), the main job's perplexity table")]
    lines = ["| window set | windows (indices) | dense perplexity | used by |", "|---|---|---:|---|"]
    for name, ws, used in sets:
        g = dense[dense.window.isin(ws)]
        if sorted(int(w) for w in g.window.unique()) != sorted(ws):
            raise MissingInput(f"{LENGTH_CELLS} (table {SHIPPED_TABLE}: dense at 4096 on windows {ws})")
        ppl = float(np.exp((g.nll * g.tokens).sum() / g.tokens.sum()))
        lines.append(f"| {name} | {len(ws)} ({', '.join(map(str, ws))}) | {ppl:.2f} | {used} |")
    inputs = f"{LENGTH_CELLS} (table {SHIPPED_TABLE}, dense rows of austen at 4096 tokens)"
    return Generated(inputs, "\n".join(lines))


@block("speed-breakdown", E2E)
def speed_breakdown() -> Generated:
    """docs/results.md's "where the time goes" table from the same e2e rows: per prefill length and
    pattern, the share of the bare forward spent in the attention calls and in gather/scatter, the
    attention calls' time over dense's, the distant pairs kept and ``pairs_bound`` (the speed-up if
    each kept pair cost what it costs inside dense attention), where the run measured them."""
    df = pd.read_csv(REPO / E2E)
    pre = df[df.phase == "prefill"].copy()
    pre["attention_s"] = pre.share_attention * pre.bare_s
    lines = ["| prefill | pattern | in attention calls | in gather / scatter | attention time / dense's | "
             "distant pairs kept | pairs bound |", "|---:|---|---:|---:|---:|---:|---:|"]
    opt = lambda v, f: "-" if pd.isna(v) else format(v, f)  # noqa: E731
    for L, g in pre.groupby("tokens"):
        dense_attention = g.loc[g.pattern == "dense", "attention_s"].iloc[0]
        for r in g.itertuples():
            lines.append(f"| {L} | {r.pattern} | {100 * r.share_attention:.0f}% | {100 * r.share_gather_scatter:.0f}% | "
                         f"{100 * r.attention_s / dense_attention:.0f}% | "
                         f"{opt(r.distant_pairs_kept, '.2f') if r.pattern != 'dense' else '1'} | "
                         f"{opt(r.pairs_bound, '.2f') + ('x' if not pd.isna(r.pairs_bound) else '')} |")
    inputs = f"{E2E} (prefill rows: share_attention, share_gather_scatter, bare_s, distant_pairs_kept, pairs_bound)"
    return Generated(inputs, "\n".join(lines))


FIGURE_DATA = "figures/data"
#: the experiments of ``focus-lab-figures`` the reproduction table reads (``table_reproduction._claims``)
REPRODUCTION_INPUTS = ("router", "baselines", "causal_leak", "transfer_domain", "records", "transfer_length", "lora",
                       "collapse", "ablation", "bench")


@block("reproduction", *(f"{FIGURE_DATA}/{n}.parquet" for n in REPRODUCTION_INPUTS))
def reproduction() -> Generated:
    """docs/reproduction.md's table: each claim of the paper against our measurement, its setting
    and verdict (``analyses.table_reproduction``: the verdict rules), from the committed results of
    ``focus-lab-figures``'s experiments (``figures/data/<experiment>.parquet``, their settings and
    the router file in ``figures/data/router.json``)."""
    import json
    from analyses.table_reproduction import make_table, to_markdown
    meta = json.loads((REPO / FIGURE_DATA / "router.json").read_text())
    seconds = sum(json.loads(f.read_text()).get("seconds") or 0 for f in (REPO / FIGURE_DATA).glob("*.json"))
    inputs = (f"{FIGURE_DATA}/{{{','.join(REPRODUCTION_INPUTS)}}}.parquet (focus-lab-figures, {seconds / 60:.0f} min of "
              f"experiments); routers {router_label(meta['routers_sha256'])}; figures/length_table.md's windows for "
              "the length rows, 4 x 4096 tokens of Persuasion for the baselines")
    return Generated(inputs, to_markdown(make_table(REPO / FIGURE_DATA)))


@block("baselines", f"{FIGURE_DATA}/baselines.parquet", f"{FIGURE_DATA}/router.json")
def baselines() -> Generated:
    """docs/results.md's baselines table: Focus and every grouping at matched sparsity on the
    figures' 4 windows of 4096 tokens (``analyses.table_baselines.make_table``): perplexity, change
    over dense with its 95% paired interval, distant pairs kept and the largest group's share. The
    evaluation's own tokens/s are left out: they shared the CPU (the speed tables are the
    benchmark's)."""
    import json
    from analyses.table_baselines import make_table
    t = make_table(REPO / FIGURE_DATA)
    lines = ["| method | pattern | perplexity | vs dense [95% interval] | distant pairs kept | largest group |",
             "|---|---|---:|---:|---:|---:|"]
    opt = lambda v: "-" if pd.isna(v) else f"{v:.3f}"  # noqa: E731
    for r in t.itertuples(index=False):
        lines.append(f"| {r[0]} | {r[1]} | {r[2]:.2f} | {r[3]} | {opt(r[4])} | {opt(r[5])} |")
    meta = json.loads((REPO / FIGURE_DATA / "router.json").read_text())
    inputs = (f"{FIGURE_DATA}/baselines.parquet (focus-lab-figures, experiment baselines); routers "
              f"{router_label(meta['routers_sha256'])}; 4 windows of 4096 tokens of Persuasion")
    return Generated(inputs, "\n".join(lines))


MAIN_JOB = "figures/results/main_job_stages.parquet"


@block("main-job-memory", MAIN_JOB)
def main_job_memory() -> Generated:
    """docs/reliability.md's per-stage peak memory of the main job on a fresh clone: the stage table
    ``focus-lab quickstart`` prints (each stage's largest process, ``ru_maxrss``), as recorded with
    its commit, machine and load."""
    df = pd.read_parquet(REPO / MAIN_JOB)
    what = {"setup": "setup (`scripts/setup.sh`: venv, packages)", "prepare": "prepare (`focus-lab prepare austen`)",
            "record": "record (4 windows x 4096 tokens, every metric)", "eval": "eval (1 window x 4096 tokens, 5 patterns)"}
    top = df.peak_gib.max()
    lines = ["| stage | peak RSS |", "|---|---:|"] + [
        f"| {what.get(r.stage, r.stage)} | " + (f"**{r.peak_gib:.2f} GiB**" if r.peak_gib == top else f"{r.peak_gib:.2f} GiB")
        + " |" for r in df.itertuples()]
    r = df.iloc[0]
    inputs = f"{MAIN_JOB}; `{r.command}` on a fresh clone of {r.commit}; {r.machine}; {r.load}"
    return Generated(inputs, "\n".join(lines))


STUDIES = "docs/studies"
#: the studies index's order (a page not listed follows, by file name)
STUDY_ORDER = ("chain-variants", "recipes-sweep", "broad-mix", "calibrated-bias", "key-router", "layer-top-k",
               "dense-layers-budget", "tech-budget-top2", "key-shift", "key-shift-trained", "copies-by-layer",
               "tech-budget-top1", "three-times-training", "secondary-sinks", "routers-in-early-layers",
               "eight-groups", "copy-weighted-distillation", "lm-objective", "token-match-pairs", "trained-with-pairs",
               "retrieval-suite", "needle-mix-distillation", "restored-rows", "restored-drops", "group-capacity",
               "group-capacity-layers", "oracle-gap")
_INDEX_LINE = re.compile(r"^<!-- index (title|question|verdict): (.*) -->$", re.M)


@block("studies-index", STUDIES)
def studies_index() -> Generated:
    """docs/studies/README.md's table: one row per study page, its title, question and verdict
    taken from the page's own ``<!-- index title|question|verdict: ... -->`` lines (so the index
    says what the page says, numbers included). Raises MissingInput naming a page without them."""
    pages_ = {p.stem: p for p in (REPO / STUDIES).glob("*.md") if p.name != "README.md"}
    order = [n for n in STUDY_ORDER if n in pages_] + sorted(set(pages_) - set(STUDY_ORDER))
    lines = ["| study | question | verdict |", "|---|---|---|"]
    for name in order:
        fields = dict(_INDEX_LINE.findall(pages_[name].read_text(encoding="utf-8")))
        missing = [k for k in ("title", "question", "verdict") if k not in fields]
        if missing:
            raise MissingInput(f"{STUDIES}/{name}.md (its <!-- index {missing[0]}: ... --> line)")
        lines.append(f"| [{fields['title']}]({name}.md) | {fields['question']} | {fields['verdict']} |")
    return Generated(f"{STUDIES}/*.md, each page's index lines", "\n".join(lines))


BENCH = "figures/bench_attention"
RUNS_KERNEL = "../figures/bench_attention/RUNS.md#2026-11-21-1839-2-core-amd-epyc-one-attention-call-1k-64k-tokens"
# (machine and dtype, data file, backend per top-k (None: the file has one), sizes shown, the link of the data column)
KERNEL_ROWS = (
    ("2-core AMD EPYC, fp32, 2 threads", "kernel.csv", None, (4096, 32768, 65536),
     f"[`kernel.csv`]({RUNS_KERNEL})"),
    ("NVIDIA H100, fp32", "gpu_h100_kernel_fp32.csv", None, (16384, 65536, 131072),
     "[gpu_h100.md](../figures/bench_attention/gpu_h100.md)"),
    ("NVIDIA H100, bf16 (flash)", "gpu_h100_kernel_bf16.csv", None, (16384, 65536, 131072),
     "[gpu_h100.md](../figures/bench_attention/gpu_h100.md)"),
    ("NVIDIA H200, bf16 (flash for top-1, flex for top-2: what `auto` picks)", "gpu_h200_kernel_bf16.csv",
     {1: "flash", 2: "flex"}, (16384, 65536, 131072), "[gpu_h200.md](../figures/bench_attention/gpu_h200.md)"),
    ("NVIDIA H100, fp32, trained groups (layer 15 of a shipped file, unbalanced)", "gpu_h100_kernel_fp32.csv", None,
     (16384, 65536, 131072), "[gpu_h100.md](../figures/bench_attention/gpu_h100.md)"),
)


@block("speed-kernel", *(f"{BENCH}/{r[1]}" for r in KERNEL_ROWS))
def speed_kernel() -> Generated:
    """docs/results.md's one-attention-call table: dense time over Focus's, K = 4 balanced groups,
    hard top-1 and top-2, per machine and dtype (``analyses/bench_attention.py``'s kernel rows)."""
    def size(n: int) -> str:
        return f"{n // 1024}K"
    lines = ["| machine, dtype | tokens | hard top-1 | hard top-2 | data |", "|---|---:|---:|---:|---|"]
    for machine, name, backend, sizes, link in KERNEL_ROWS:
        df = pd.read_csv(REPO / BENCH / name)
        df = df[(df.K == 4) & (df.groups == ("trained" if "trained groups" in machine else "balanced"))]
        cells = []
        for k in (1, 2):
            g = df[df.k == k]
            if backend is not None:
                g = g[g.backend == backend[k]]
            by = g.groupby("n").speedup.mean()  # a size run twice: the mean, as analyses.common.gpu_kernel_runs
            cells.append(" / ".join(f"{by.loc[n]:.2f}x" if n in by.index else "-" for n in sizes))
        lines.append(f"| {machine} | {' / '.join(size(n) for n in sizes)} | {cells[0]} | {cells[1]} | {link} |")
    inputs = (", ".join(f"{BENCH}/{r[1]}" for r in KERNEL_ROWS)
              + "; K = 4, balanced groups unless the row says trained; SmolLM2's attention shapes; a size run twice "
              "shows the mean of its runs")
    return Generated(inputs, "\n".join(lines))


AUDIT_DROPPED = "figures/results/audit_dropped_mass.parquet"
AUDIT_COSTLY = "figures/results/audit_costly.parquet"


def _audit_inputs(df: pd.DataFrame, path: str) -> str:
    r = df.iloc[0]
    return (f"{path} (python -m analyses.audit_table runs/smollm2-austen --save: the main job's run); routers "
            f"{router_label(r.routers_sha256)}; {int(r.windows)} windows of {int(r.seq_len)} tokens of Persuasion; "
            "hard top-2 mask audited against dense")


@block("audit-summary", AUDIT_DROPPED, AUDIT_COSTLY)
def audit_summary() -> Generated:
    """docs/results.md's audit summary: the share of the dropped dense mass on edges of at least
    512 tokens (mean and range over layers, the highest layers) and where the costly queries'
    heaviest dropped edges end (on " the", on the query's own token, with a spaCy relation, in
    the random-group layers 1-9)."""
    layers = pd.read_parquet(REPO / AUDIT_DROPPED)
    heavy = pd.read_parquet(REPO / AUDIT_COSTLY)
    top = layers.sort_values("far_share", ascending=False).layer_idx.head(6).tolist()
    pct = lambda x: f"{100 * x:.0f}%"  # noqa: E731
    rows = [("dropped dense mass on edges of 512 tokens or more, mean over layers", pct(layers.far_share.mean())),
            ("the same, per layer", f"{pct(layers.far_share.min())} to {pct(layers.far_share.max())}"),
            ("layers where it is highest", ", ".join(map(str, top))),
            (f"costly queries (the {len(heavy)} whose next-token loss rises most), their heaviest dropped edge: "
             "on a \" the\" key", pct((heavy.key_token.str.strip() == "the").mean())),
            ("... on the query's own token", pct((heavy.key_token.str.strip() == heavy.query_token.str.strip()).mean())),
            ("... with a spaCy relation", pct((heavy.relation.fillna("") != "").mean())),
            ("... in layers 1-9 (random groups)", pct(heavy.layer_idx.between(1, 9).mean()))]
    lines = ["| measure | value |", "|---|---:|"] + [f"| {a} | {b} |" for a, b in rows]
    return Generated(_audit_inputs(heavy, f"{AUDIT_DROPPED}, {AUDIT_COSTLY}"), "\n".join(lines))


def _quoted(*tokens: str) -> str:
    """Tokens as the audit shows them: each in double quotes, a newline as \\n."""
    return " ".join('"' + t.replace("\n", "\\n").replace("|", "\\|") + '"' for t in tokens if t != "")


@block("audit-costliest", AUDIT_COSTLY)
def audit_costliest() -> Generated:
    """docs/results.md's six costliest drops: query (with the token before it) and next token, the
    loss delta (nats), the heaviest dropped key (with the token before it), distance (tokens),
    layer / head with the dense weight, and the spaCy relation."""
    heavy = pd.read_parquet(REPO / AUDIT_COSTLY).head(6)
    lines = ["| query -> next token | loss delta (nats) | heaviest dropped key | distance | layer / head, dense weight | relation |",
             "|---|---:|---|---:|---|---|"]
    for r in heavy.itertuples():
        lines.append(f"| {_quoted(r.query_prev, r.query_token)} -> {_quoted(r.next_token)} | {r.delta:.2f} | "
                     f"{_quoted(r.key_prev, r.key_token)} | {int(r.distance)} | L{int(r.layer_idx)} H{int(r.head)}, "
                     f"{r.weight:.2f} | {r.relation or ''} |")
    return Generated(_audit_inputs(heavy, AUDIT_COSTLY), "\n".join(lines))

# ============================================================================================
# passkey blocks (docs/passkey_reference.md)

PASSKEY_CASES = "figures/results/passkey_cases.parquet"
PASSKEY_TABLES = "figures/results/passkey_tables.json"
#: the model whose shipped file the passkey tables measure (the manifest ships files for several)
PASSKEY_MODEL = "smollm2-135m-instruct"
#: the file whose per-layer budget the budget columns run under (its rows: the same tensors
#: before the budget was saved, under that budget as ``--layer-top-k``)
PASSKEY_BUDGET_FILE = "smollm2-135m/soup-budget"
#: the broad-mix file is not in the manifest: its tables by name (uniform top-2)
PASSKEY_BROAD_MIX = ("broad_mix_4k", "broad_mix_4k_seeds6-11")


@dataclass(frozen=True)
class _PasskeyColumn:
    heading: str  # the table's column heading
    source: str  # what ran, for the inputs line (router file, k rule)
    cases: pd.DataFrame  # its rows (pattern: the heading), every length


def _short(name: str) -> str:
    return f"`{name.split('/')[-1]}`"


def _provenance(name: str) -> dict:
    """The manifest's provenance record of the file ``name`` (the shipped file's, or one of the
    records it nests). Raises MissingInput when none has its sha256."""
    from focus_lab.hf.shipped import registry
    sha = name_sha256(name)
    todo = list(registry().get("provenance", {}).values())
    while todo:
        rec = todo.pop()
        if rec.get("sha256") == sha:
            return rec
        todo += [v for v in rec.values() if isinstance(v, dict)]
    raise MissingInput(f"focus_lab/routers/MANIFEST.json (provenance of {name})")


def _budget_spec(name: str) -> dict[int, int]:
    """{layer: k} of the top-2 per-layer budget the file ``name`` carries (its provenance's
    ``top_k_budgets`` spec ``layers:k;layers:k``)."""
    spec = _provenance(name).get("top_k_budgets", {}).get("spec", {}).get("2")
    if not spec:
        raise MissingInput(f"focus_lab/routers/MANIFEST.json (top-2 budget of {name})")
    return {int(layer): int(k) for part in spec.split(";") for layers, k in [part.split(":")]
            for layer in layers.split(",")}


def _table_budget(meta: dict, table: str) -> dict[int, int]:
    """{layer: k} of a probe table's ``--layer-top-k`` ({}: the file's own configuration)."""
    over = meta[table].get("settings", {}).get("config_overrides") or {}
    return {int(layer): int(k) for layer, k in (over.get("layer_top_k") or {}).items()}


def _passkey_columns() -> tuple[pd.DataFrame, list[_PasskeyColumn]]:
    """The dense reference rows (the shipped file's cases, ``committed_passkey``) and the depth
    tables' columns: the shipped file's hard top-2; the budget file's tensors under its budget and
    at uniform top-2 (``budget_only_sha256``: the file before its budget); the broad-mix file."""
    import json

    from focus_lab.eval.committed import committed_passkey
    shipped = committed_passkey(model=PASSKEY_MODEL)
    meta = json.loads((REPO / PASSKEY_TABLES).read_text())
    cases = shipped.cases
    dense = cases[cases.pattern == "dense"]
    own = cases[cases.pattern != "dense"]
    src = shipped.source
    cols = [_PasskeyColumn(f"hard top-2, {_short(src.router_name)} (shipped)",
                           f"{router_label(src.router_sha256)}, its own configuration", own)]

    spec = _budget_spec(PASSKEY_BUDGET_FILE)
    before = _provenance(PASSKEY_BUDGET_FILE).get("budget_only_sha256", [])
    from focus_lab.hf.shipped import named_file
    names = [named_file(s) for s in before]
    if len(names) != 1 or names[0] is None:
        raise MissingInput(f"focus_lab/routers/MANIFEST.json (the file {PASSKEY_BUDGET_FILE} is before its budget)")
    tensors = committed_passkey(names[0])
    budget_t = [t for t in tensors.source.tables if _table_budget(meta, t) == spec]
    uniform_t = [t for t in tensors.source.tables if not _table_budget(meta, t)]
    rows = tensors.cases[tensors.cases.pattern == "hard_top2"]
    label = router_label(tensors.source.router_sha256)
    cols.append(_PasskeyColumn(f"hard top-2, {_short(PASSKEY_BUDGET_FILE)}",
                               f"{label} under {_short(PASSKEY_BUDGET_FILE)}'s per-layer k",
                               rows[rows.table.isin(budget_t)]))
    cols.append(_PasskeyColumn(f"{_short(PASSKEY_BUDGET_FILE)}, uniform top-2",
                               f"{label}, {_short(PASSKEY_BUDGET_FILE)} without its budget, every layer at k = 2",
                               rows[rows.table.isin(uniform_t)]))

    missing = [t for t in PASSKEY_BROAD_MIX if t not in meta]
    if missing:
        raise MissingInput(f"{PASSKEY_TABLES} (tables {', '.join(missing)})")
    shas = {meta[t]["settings"]["routers"]["sha256"] for t in PASSKEY_BROAD_MIX}
    broad = pd.read_parquet(REPO / PASSKEY_CASES)
    broad = broad[broad.table.isin(PASSKEY_BROAD_MIX) & (broad.pattern == "hard_top2")]
    if len(shas) != 1 or any(_table_budget(meta, t) for t in PASSKEY_BROAD_MIX):
        raise ValueError(f"the broad-mix tables {PASSKEY_BROAD_MIX} do not share one file at uniform top-2")
    cols.append(_PasskeyColumn("uniform top-2, broad mix", f"the broad-mix file, {router_label(shas.pop())}, "
                               "every layer at k = 2", broad))
    return dense, [c for c in cols if len(c.cases)]


def _passkey_cell(r, is_dense: bool, all_row: bool, dense_misses: bool) -> str:
    """``hits/cases, log-prob``; on the "all" row of a pattern also ``(K of dense's N)`` (when dense
    misses a key of those cases) and ``[distant pairs kept]``."""
    out = f"{r.hits}/{r.cases}"
    if all_row and not is_dense and dense_misses:
        out += (f" (all {r.dense_hits} of dense's)" if r.dense_hits_kept == r.dense_hits
                else f" ({r.dense_hits_kept} of dense's {r.dense_hits})")
    out += f", {r.key_logprob:.2f}"
    if all_row and not is_dense:
        out += f" [{r.distant_pairs_kept:.3f}]"
    return out


def _tables_text(df: pd.DataFrame) -> str:
    return ", ".join(dict.fromkeys(df.table))


def _passkey_depth_table(length: int) -> Generated:
    """One depth table: per depth and column, exact matches / cases and mean key log-prob (nats);
    the "all" row adds, of the keys dense retrieves, how many the pattern keeps, and the mean
    share of distant pairs kept (``focus_lab.eval.committed.passkey_summary``, paired on the
    same cases)."""
    from focus_lab.eval.committed import PASSKEY_CASE, passkey_summary
    dense, cols = _passkey_columns()
    dense = dense[dense.length == length]
    cols = [c for c in cols if (c.cases.length == length).any()]
    if not len(dense) or not cols:
        raise MissingInput(f"{PASSKEY_CASES} (rows at {length} tokens)")
    keys = dense[PASSKEY_CASE].drop_duplicates()
    parts = [dense]
    for c in cols:
        rows = c.cases[c.cases.length == length]
        if len(rows.merge(keys, on=PASSKEY_CASE)) != len(keys) or len(rows) != len(keys):
            raise ValueError(f"{c.heading} at {length} tokens: not the dense rows' {len(keys)} cases "
                             f"(tables {_tables_text(rows)})")
        parts.append(rows.assign(pattern=c.heading))
    cases = pd.concat(parts, ignore_index=True)
    heads = ["dense"] + [c.heading for c in cols]
    per = passkey_summary(cases, by=("depth",)).set_index(["depth", "pattern"])
    tot = passkey_summary(cases).set_index("pattern")
    dense_misses = bool(tot.loc["dense"].hits < tot.loc["dense"].cases)
    lines = ["| depth | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for d in sorted(cases.depth.unique()):
        lines.append(f"| {d:g} | " + " | ".join(_passkey_cell(per.loc[(d, h)], h == "dense", False, dense_misses)
                                               for h in heads) + " |")
    lines.append("| all | " + " | ".join(_passkey_cell(tot.loc[h], h == "dense", True, dense_misses)
                                         for h in heads) + " |")
    seeds = sorted(keys.seed.unique())
    inputs = (f"{PASSKEY_CASES} with {PASSKEY_TABLES}; chat format, {length} tokens, {len(seeds)} keys (case seeds "
              f"{seeds[0]}-{seeds[-1]}) x depths {', '.join(f'{d:g}' for d in sorted(keys.depth.unique()))}; "
              f"dense: tables {_tables_text(dense)}; "
              + "; ".join(f"{c.heading}: {c.source}, tables {_tables_text(c.cases[c.cases.length == length])}"
                          for c in cols))
    return Generated(inputs, "\n".join(lines))


@block("passkey-4k", PASSKEY_CASES, PASSKEY_TABLES)
def passkey_4k() -> Generated:
    """docs/passkey_reference.md's 4096-token depth table (``_passkey_depth_table``)."""
    return _passkey_depth_table(4096)


@block("passkey-8k", PASSKEY_CASES, PASSKEY_TABLES)
def passkey_8k() -> Generated:
    """docs/passkey_reference.md's 8184-token depth table (``_passkey_depth_table``)."""
    return _passkey_depth_table(8184)


@block("passkey-random", PASSKEY_CASES, PASSKEY_TABLES)
def passkey_random() -> Generated:
    """docs/passkey_reference.md's random-group rows: balanced random groups at top-2
    (``random_top2``) on the depth tables' cases, every layer at k = 2 and under the budget file's
    per-layer k; random groups do not depend on the router file, so every committed table with
    the shipped tables' prompt settings counts (the first by name gives a case's row)."""
    import json

    from focus_lab.eval import committed as ck
    meta = json.loads((REPO / PASSKEY_TABLES).read_text())
    shipped = ck.committed_passkey(model=PASSKEY_MODEL)
    dense = shipped.cases[shipped.cases.pattern == "dense"]

    def prompt(t: str) -> dict:
        return {k: meta[t].get("settings", {}).get(k) for k in ck.PASSKEY_SAME_PROMPT}

    same = [t for t in sorted(meta) if prompt(t) == prompt(shipped.source.tables[0])]
    rows = pd.read_parquet(REPO / PASSKEY_CASES)
    rows = rows[rows.table.isin(same) & (rows.pattern == "random_top2")]
    rows = rows.assign(_o=rows.table.map(same.index)).sort_values("_o", kind="stable").drop(columns="_o")
    rows = rows.merge(dense[ck.PASSKEY_CASE], on=ck.PASSKEY_CASE)
    spec = _budget_spec(PASSKEY_BUDGET_FILE)
    kinds = {"every layer at k = 2": [t for t in same if not _table_budget(meta, t)],
             f"{_short(PASSKEY_BUDGET_FILE)}'s per-layer k": [t for t in same if _table_budget(meta, t) == spec]}
    parts = [dense]
    for kind, tables in kinds.items():
        parts.append(rows[rows.table.isin(tables)].drop_duplicates(ck.PASSKEY_CASE).assign(pattern=kind))
    cases = pd.concat(parts, ignore_index=True)
    if not (cases.pattern != "dense").any():
        raise MissingInput(f"{PASSKEY_CASES} (random_top2 rows)")
    s = ck.passkey_summary(cases).set_index(["length", "pattern"])
    lengths = sorted(cases[cases.pattern != "dense"].length.unique())  # where random groups ran
    lines = ["| random groups, top-2 | " + " | ".join(f"{L} tokens" for L in lengths) + " |",
             "|---" * (len(lengths) + 1) + "|"]
    described = []
    for kind in kinds:
        mine = cases[cases.pattern == kind]
        cells = []
        for L in lengths:
            r = s.loc[(L, kind)] if (L, kind) in s.index else None
            cells.append("-" if r is None else _passkey_cell(r, False, True, bool(r.dense_hits < r.cases)))
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
        seeds = [sorted(mine[mine.length == L].seed.unique()) for L in lengths]
        described.append(f"{kind}: tables {_tables_text(mine)} (case seeds "
                         + ", ".join(f"{x[0]}-{x[-1]} at {L}" for L, x in zip(lengths, seeds) if x) + ")")
    depths = ", ".join(f"{L} tokens depths " + ", ".join(f"{d:g}" for d in sorted(cases[cases.length == L].depth.unique()))
                       for L in lengths)
    inputs = (f"{PASSKEY_CASES} with {PASSKEY_TABLES}; chat format; pattern random_top2 on the depth tables' "
              f"cases ({depths}); " + "; ".join(described) + f"; dense: tables {_tables_text(dense)}")
    return Generated(inputs, "\n".join(lines))

# ============================================================================================
# intervention blocks (docs/intervene.md)

INTERVENE_NOUNS = "figures/results/intervene_nouns.json"


def _nats(x: float) -> str:
    """A mean change of the loss (nats) with its sign: four decimals, five where four would round
    it to zero."""
    return f"{x:+.4f}" if abs(x) >= 5e-5 else f"{x:+.5f}"


@block("intervene-nouns", INTERVENE_NOUNS)
def intervene_nouns() -> Generated:
    """docs/intervene.md's noun table: a window's noun tokens moved into each group of layer 15 (the
    page's ``move_into_group`` example), per group the mean change of the next-token loss over all
    predictions and over those made at a noun, and the largest rise and fall of one prediction."""
    import json
    d = json.loads((REPO / INTERVENE_NOUNS).read_text())
    lines = ["| group | all predictions | at a noun | largest rise / fall of one prediction |", "|---|---:|---:|---|"]
    for g, r in sorted(d["groups"].items(), key=lambda kv: int(kv[0])):
        lines.append(f"| {g} | {_nats(r['mean_all'])} | {_nats(r['mean_at_nouns'])} | {r['max']:+.2f} / {r['min']:+.2f} |")
    inputs = (f"{INTERVENE_NOUNS} (mean_all, mean_at_nouns, max, min per group); {d['nouns']} noun tokens of one "
              f"window of {d['tokens']} tokens moved into each group of layer 15, hard mode")
    return Generated(inputs, "\n".join(lines))

# ============================================================================================
# the alternatives table (docs/recipes.md)

RECIPES_SWEEP = "figures/results/recipes.parquet"
#: the held-out technical domains, in the order the alternatives table names them
TECHNICAL = ("python-docs", "man-pages", "debian-reference")
#: the retrieval task whose repeated noise sentences the suite's pair bound is about
NOISE_TASK = "niah_single_1"


class _Cells:
    """The committed length-table cells (``LENGTH_CELLS``) and retrieval cases, read once:
    ``summarize`` rows per table, paired changes between tables on the windows both have, the
    retrieval summary. Raises MissingInput naming a table, cell or pattern that is absent."""

    def __init__(self):
        from analyses.length_table import committed_cells
        self.cells = committed_cells(REPO / LENGTH_CELLS)
        self._summaries: dict[str, pd.DataFrame] = {}
        self._retrieval = None

    def rows(self, table: str, corpus: str, L: int, label: str) -> pd.DataFrame:
        c = self.cells
        g = c[(c["table"] == table) & (c.corpus == corpus) & (c.seq_len == L) & (c.label == label)]
        if not len(g):
            raise MissingInput(f"{LENGTH_CELLS} (table {table}: {label} on {corpus} at {L})")
        return g

    def summary(self, table: str, corpus: str, L: int, label: str) -> pd.Series:
        from analyses.length_table import summarize
        if table not in self._summaries:
            df = self.cells[self.cells["table"] == table]
            if not len(df):
                raise MissingInput(f"{LENGTH_CELLS} (table {table})")
            self._summaries[table] = summarize(df.drop(columns="table")).set_index(["corpus", "seq_len", "label"])
        s = self._summaries[table]
        if (corpus, L, label) not in s.index:
            raise MissingInput(f"{LENGTH_CELLS} (table {table}: {label} on {corpus} at {L})")
        return s.loc[(corpus, L, label)]

    def dense(self, table: str, corpus: str, L: int, label: str) -> float:
        """Change of perplexity over dense, %."""
        return float(self.summary(table, corpus, L, label).delta_vs_dense_pct)

    def kept(self, table: str, corpus: str, L: int, label: str) -> float:
        return float(self.summary(table, corpus, L, label).distant_pairs_kept)

    def margin(self, table: str, corpus: str, L: int, control: str) -> float:
        """The control's change over the router at the same k, % (> 0: the router is better)."""
        return float(self.summary(table, corpus, L, control).control_vs_router_pct)

    def paired(self, a: tuple[str, str], b: tuple[str, str], corpus: str, L: int) -> float:
        """Paired change of perplexity of ``a`` = (table, label) over ``b``, %, on their common windows."""
        from focus_lab.eval.evaluate import paired_change
        return float(paired_change(self.rows(a[0], corpus, L, a[1]), self.rows(b[0], corpus, L, b[1]))[0])

    def paired_cells(self, a: tuple[str, str], b: tuple[str, str], labels: tuple[str, ...] | None = None,
                     corpora: tuple[str, ...] | None = None, lengths: tuple[int, ...] | None = None,
                     min_windows: int = 1) -> list[float]:
        """``paired`` on every (corpus, length) of table ``a`` (restricted to ``corpora`` and
        ``lengths``) that both tables hold with at least ``min_windows`` common windows; with
        ``labels``, each label against the same label of table ``b``."""
        c = self.cells
        out = []
        for (corpus, L), g in c[c["table"] == a[0]].groupby(["corpus", "seq_len"], sort=True):
            if (corpora and corpus not in corpora) or (lengths and L not in lengths):
                continue
            for la, lb in ([(x, x) for x in labels] if labels else [(a[1], b[1])]):
                other = c[(c["table"] == b[0]) & (c.corpus == corpus) & (c.seq_len == L) & (c.label == lb)]
                mine = g[g.label == la]
                if len(mine) and len(set(mine.window) & set(other.window)) >= min_windows:
                    out.append(self.paired((a[0], la), (b[0], lb), corpus, L))
        if not out:
            raise MissingInput(f"{LENGTH_CELLS} (tables {a[0]} and {b[0]}: no common cells)")
        return out

    def retrieval(self, pattern: str, L: int, task: str = NOISE_TASK) -> pd.Series:
        """The retrieval summary row (``focus_lab.eval.retrieval_tables.summary``) of a pattern."""
        from focus_lab.eval.retrieval_tables import summary
        if self._retrieval is None:
            self._retrieval = summary(pd.read_parquet(REPO / RETRIEVAL_CASES)).set_index(["task", "length", "pattern"])
        if (task, L, pattern) not in self._retrieval.index:
            raise MissingInput(f"{RETRIEVAL_CASES} ({pattern} on {task} at {L})")
        return self._retrieval.loc[(task, L, pattern)]


def _pct(x: float, nd: int = 1) -> str:
    return f"{x:+.{nd}f}%"


def _slashed(xs, nd: int = 1) -> str:
    return " / ".join(_pct(x, nd) for x in xs)


def _span(xs, nd: int = 2) -> str:
    """``+a% to +b%``: the lowest and highest of ``xs``."""
    return f"{_pct(min(xs), nd)} to {_pct(max(xs), nd)}"


def _points(xs, nd: int = 2) -> str:
    """``a-b``: the smallest and largest size of ``xs`` (points, no sign)."""
    a = sorted(abs(x) for x in xs)
    return f"{a[0]:.{nd}f}-{a[-1]:.{nd}f}"


def _within(xs, nd: int = 2) -> str:
    """The largest size of ``xs`` (points, no sign)."""
    return f"{max(abs(x) for x in xs):.{nd}f}"


def _count(n: int) -> str:
    """A small count as a word (``two``), a larger one in digits."""
    return ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")[n] if n <= 10 else str(n)


def _sized(xs, word: str, nd: int = 2) -> str:
    """``a-b points worse`` (or ``better``, by ``word``) when every change of ``xs`` has the sign
    ``word`` says, else the signed span (``-a% to +b%``)."""
    sign = 1 if word == "worse" else -1
    if all(sign * x > 0 for x in xs):
        return f"{_points(xs, nd)} points {word}"
    return _span(xs, nd)


def _alternative_rows(c: _Cells) -> list[tuple[str, str, str, str, str]]:
    """The alternatives table's rows: (routers or lever, tables, result, why not shipped, study),
    the numbers of result and why computed from the committed cells (the needles from the
    retrieval cases, the recipes from the recipe sweep); the criteria (+1.0%, 3%, 0.60, 90%, ...)
    are the rules the page states."""
    T, P, H = TECHNICAL, "austen", "shakespeare"
    cv = "[chain variants](studies/chain-variants.md)"
    gc = "[group capacity](studies/group-capacity.md)"
    gcl = "[group capacity in some layers](studies/group-capacity-layers.md)"

    def tech(table: str, label: str, L: int = 4096) -> list[float]:
        return [c.dense(table, d, L, label) for d in T]

    def pairs(pattern: str, nd: int) -> str:
        return " / ".join(f"{c.retrieval(pattern, L).distant_pairs_kept:.{nd}f}" for L in (4096, 8192))

    def rel(pattern: str, L: int) -> str:
        return f"{c.retrieval(pattern, L).relative:.2f}"

    def n(pattern: str, L: int) -> int:
        return int(c.retrieval(pattern, L).cases)

    def windows(table: str, corpus: str, L: int) -> int:
        return int(c.summary(table, corpus, L, "dense").windows)

    def hamlet_margin(table: str, L: int = 8192) -> str:
        return _slashed([c.margin(table, H, L, "random_top1"), c.margin(table, H, L, "shuffled_top1")])

    def tech_paired(a: tuple[str, str], b: tuple[str, str]) -> list[float]:
        return [c.paired(a, b, d, 4096) for d in T]

    # the shipped file and the one before it: technical text at 4096 and 8192 (cells of more than
    # one window), paired with the file before; the length table, each pattern paired
    held = {"corpora": T, "min_windows": 2}
    cap_tech = (c.paired_cells(("capacity_per_domain", "hard_top2"), ("needle_mix_per_domain", "hard_top2"), **held)
                + c.paired_cells(("capacity_heldout_8k", "hard_top2"), ("needle_mix_heldout_8k", "hard_top2"), **held))
    cap_len = c.paired_cells(("capacity_length", ""), ("needle_mix_length", ""),
                             labels=("hard_top1", "hard_top2", "random_top1", "random_top2", "shuffled_top1", "window"))
    mix_tech = (c.paired_cells(("needle_mix_per_domain", "hard_top2"), ("shipped_per_domain", "hard_top2"), **held)
                + c.paired_cells(("needle_mix_heldout_8k", "hard_top2"), ("shipped_heldout_8k", "hard_top2"), **held))
    mix_len = c.paired_cells(("needle_mix_length", ""), ("shipped", ""), labels=("hard_top1", "hard_top2"))
    nocap, shipped = "hard_top2_nocap", "hard_top2"

    # the recipe sweep at 512 tokens: sinks64 and the paper's recipe against dense
    sweep = pd.read_parquet(REPO / RECIPES_SWEEP)
    sweep = sweep[sweep.sweep == "30 steps"]

    def ppl(recipe: str, label: str) -> float:
        r = sweep[(sweep.recipe == recipe) & (sweep.label == label)]
        if len(r) != 1:
            raise MissingInput(f"{RECIPES_SWEEP} (30 steps, {recipe} {label})")
        return float(r.perplexity.iloc[0])
    dense512 = ppl("controls", "dense")
    sinks = [100 * (ppl("sinks64", f"hard_top{k}") / dense512 - 1) for k in (1, 2)]

    # the capacity variants: technical text paired with the same file without the capacity
    def capacity(table: str, label: str) -> tuple[list[float], list[float], float | None]:
        corpora = sorted(set(c.cells.loc[c.cells["table"] == table, "corpus"]))
        other = [d for d in corpora if d not in (P, "bible-kjv")]
        ch = [c.paired((table, label), (table, "hard_top2"), d, 4096) for d in other]
        bible = [c.paired((table, label), (table, "hard_top2"), "bible-kjv", 4096)] if "bible-kjv" in corpora else []
        prose = c.paired((table, label), (table, "hard_top2"), P, 4096) if P in corpora else None
        return ch, bible, prose

    cap = capacity("capacity", "hard_top2_cap")
    nine = capacity("capacity_layers", "hard_top2_cap@0+13+15-16+21+24-25+28-29")
    evict = capacity("capacity_evict", "hard_top2_evict@13+15-16+21+24-25+28-29")
    evict7 = capacity("capacity_evict7", "hard_top2_evict@13+15-16+21+25+28-29")

    def prose(x: float | None) -> str:
        # the size to a hundredth of a point, 0.01 at least (never "within 0.00%")
        return "" if x is None else f"; *Persuasion* within {max(round(abs(x), 2), 0.01):.2f}%"

    def five(v) -> str:
        return f"({_count(len(v[0]))} corpora; Bible {_pct(v[1][0], 2)})" if v[1] else f"({_count(len(v[0]))} corpora)"

    # key shift, trained, with both budgets: which technical domains meet the three held-out criteria
    kt = "keyshift_top1_budget_domains"
    meets = [d for d in T if c.dense(kt, d, 4096, "hard_top2_keyshift") <= 1.5
             and c.dense(kt, d, 4096, "hard_top1_keyshift") <= 4 and c.margin(kt, d, 4096, "random_top2_keyshift") >= 2]
    names = {"python-docs": "Python docs", "man-pages": "man pages", "debian-reference": "Debian Reference"}
    missed = [d for d in T if d not in meets]
    top1_budgets = ("keyshift_pooled_top1", "keyshift_tech_top1")
    literary = ("keyshift_budgets_persuasion", "hard_top1_keyshift")
    match_trained = tech_paired(("match_trained_domains", "hard_top2"), ("broad_s5_match_domains", "hard_top2"))
    match_margin = [c.margin("match_trained_domains", d, 4096, "random_top2") for d in T]
    ks_budgets, ks_top1 = ("keyshift_budgets_domains", "hard_top2_keyshift"), ("keyshift_tech_top1_domains", "hard_top1_keyshift")

    rows = [
        ("**shipped** (stages 1-9: the needle-mix file with a group capacity for top-2)",
         "`capacity_length`, `capacity_per_domain`, `capacity_heldout_8k`",
         (f"{NOISE_TASK} at {pairs(shipped, 2)} of the distant pairs ({pairs(nocap, 2)} before) and {rel(shipped, 4096)} / "
         f"{rel(shipped, 8192)} of dense's needles at 4096 / 8192; technical top-2 {_sized(cap_tech, 'worse')}, "
         f"paired; the length table at most {max(cap_len):.2f} points worse"), "-", gcl),
        ("needle-mix file (stages 1-8: the file before distilled on the needle mix)",
         "`needle_mix_length`, `needle_mix_per_domain`, `needle_mix_heldout_8k`",
         (f"single needles found at 4096 and 8192 tokens; technical top-2 {_sized(mix_tech, 'better')} than the "
         f"file before, paired; the length table at most {max(mix_len):.2f} points worse"),
         (f"keeps {c.retrieval(nocap, 4096).distant_pairs_kept:.2f} of the pairs on repeated noise sentences, above "
         "the suite's 0.60"), "[needle mix](studies/needle-mix-distillation.md)"),
        ("the two-domain file (stages 1-5: average of stages 2 and 3, top-2 budget)", "`shipped`, `shipped_8k_all_*`",
         (f"*Persuasion* 8192, {windows('shipped_8k_all_persuasion', P, 8192)} windows: "
         f"uniform top-2 {_pct(c.dense('shipped_8k_all_persuasion', P, 8192, 'hard_top2'), 2)} "
         f"[{c.kept('shipped_8k_all_persuasion', P, 8192, 'hard_top2'):.2f}]; *Hamlet* 8192, "
         f"{windows('shipped_8k_all_hamlet', H, 8192)} windows: top-1 margin "
         f"{hamlet_margin('shipped_8k_all_hamlet')}"), "misses 90% of dense's score on the single needles", cv),
        ("stage 2 alone", "`stage2_distill64`, `stage2_distill64_8k_all_*`",
         (f"top-2 {_pct(c.dense('stage2_distill64_8k_all_persuasion', P, 8192, 'hard_top2'), 2)} on the "
         f"{windows('stage2_distill64_8k_all_persuasion', P, 8192)} windows; "
         f"*Hamlet* margin {hamlet_margin('stage2_distill64_8k_all_hamlet')}"), "margin over shuffled groups below 3%", cv),
        ("stage 3 alone (90 steps)", "`two_domain90*`",
         (f"*Hamlet* margin {hamlet_margin('two_domain90_8k_all_hamlet')}; top-2 "
         f"{_pct(c.dense('two_domain90_8k_all_persuasion', P, 8192, 'hard_top2'), 2)} on the "
         f"{windows('two_domain90_8k_all_persuasion', P, 8192)} windows"),
         "top-2 over +1.0%", cv),
        ("stage 3 after 60 steps", "`two_domain60*`",
         (f"*Hamlet* 8192 margin {hamlet_margin('two_domain60')} ({windows('two_domain60', H, 8192)} "
         f"windows); top-2 {_pct(c.dense('two_domain60_top2_8k', P, 8192, 'hard_top2'))} at 8192"), "top-2 over +1.0%", cv),
        ("stage 2 with every layer routed", "`every_layer_routed`, `distill4k`",
         (f"8192: top-2 {_slashed([c.dense('every_layer_routed', x, 8192, 'hard_top2') for x in (P, H)])} (*Persuasion* / "
         f"*Hamlet*); loses to random groups ({_slashed([c.margin('every_layer_routed', x, 8192, 'random_top1') for x in (P, H)])})"),
         "does not transfer to 8192", cv),
        ("stage 1 alone (`sinks64`, 512 tokens)", "`sinks64_512`",
         (f"4096: top-2 {_pct(c.dense('sinks64_512', P, 4096, 'hard_top2'))} [{c.kept('sinks64_512', P, 4096, 'hard_top2'):.2f}], "
         f"top-1 {_pct(c.dense('sinks64_512', P, 4096, 'hard_top1'))}"), "trained at too short a context", cv),
        ("distill64 at 8192 tokens, 24 more steps", "`distill8k`",
         f"8192: top-2 {_pct(c.dense('distill8k', P, 8192, 'hard_top2'))}; "
         + ("still loses to random groups" if c.margin("distill8k", P, 8192, "random_top2") < 0 else
            f"random groups {_pct(c.margin('distill8k', P, 8192, 'random_top2'))}"), "no better than 4096", cv),
        ("distillation against the top-k masks", "`distill4k_topk`",
         (f"4096: top-2 {_pct(c.dense('distill4k_topk', P, 4096, 'hard_top2'))} [{c.kept('distill4k_topk', P, 4096, 'hard_top2'):.2f}], "
         f"margin {_slashed([c.margin('distill4k_topk', P, 4096, x) for x in ('random_top1', 'shuffled_top1')])}"),
         "worse at both k, less balanced", cv),
        ("the two-domain routers in 5 layers only", "`merge5*`",
         (f"top-2 {_pct(c.dense('merge5_top2', P, 8192, 'hard_top2'))} ({windows('merge5_top2', P, 8192)} "
         f"windows); *Hamlet* margin {hamlet_margin('merge5')}"), "keeps a third of the margin gain", cv),
        ("two-domain file, group bias re-calibrated at 8192", "`two_domain60_calibrated_top2`",
         f"top-2 {_pct(c.dense('two_domain60_calibrated_top2', P, 8192, 'hard_top2'))} at 8192", "top-2 worse", cv),
        ("other recipes, 30 steps at 512 tokens", "[recipes.parquet](../figures/results/recipes.parquet)",
         (f"`sinks64` top-1 / top-2 {_slashed(sinks)}; the paper's recipe collapses (top-2 {ppl('paper', 'hard_top2'):.1f} "
         f"against {dense512:.1f})"), "`sinks64` is the best", "[recipes at 512 tokens](studies/recipes-sweep.md)"),
        ("a broader training mix (five domains)", "`broad_mix_*`",
         (f"technical, uniform top-2: {_slashed(tech('broad_mix_domains', 'hard_top2'))} (shipped "
         f"{_slashed(tech('shipped_domains', 'hard_top2'))})"),
         (f"{_points(tech_paired(('broad_mix_domains', 'hard_top2'), ('shipped_domains', 'hard_top2')), 1)} points, "
         "criteria missed"), "[broad mix](studies/broad-mix.md)"),
        ("group bias re-fitted on the user's text", "`calibrated_*`",
         (f"technical top-2 {_span([c.paired((f'calibrated_{d}', 'hard_top2'), ('shipped_per_domain', 'hard_top2'), d, 4096) for d in T])} "
         f"worse, at {_points([c.kept(f'calibrated_{d}', d, 4096, 'hard_top2') for d in T])} of the pairs"),
         "worse", "[re-fitted bias](studies/calibrated-bias.md)"),
        ("a key projection of its own", "`key_router_domains`, `key_fit_domains`",
         f"top-2 {_span(tech_paired(('key_router_domains', 'hard_top2'), ('broad_unsouped_domains', 'hard_top2')))}, within noise",
         "no gain", "[key router](studies/key-router.md)"),
        ("top-1 budget per layer", "`shipped_budget_top1*`",
         (f"technical top-1 {_slashed(tech('shipped_budget_top1_domains', 'hard_top1'))} (uniform "
         f"{_slashed(tech('shipped_domains', 'hard_top1'))})"),
         (f"*Hamlet* margin {_slashed([c.margin('shipped_budget_top1_hamlet', H, L, 'random_top1') for L in (4096, 8192)])}, "
         "below 3%; an option"), "[top-k per layer](studies/layer-top-k.md)"),
        ("dense layers in the top-2 budget", "`budget_dense6*`, `budget_dense8*`",
         "*Persuasion* " + _slashed([c.paired((t, "hard_top2"), ("shipped_budget_top2_persuasion", "hard_top2"), P, 4096)
                                     for t in ("budget_dense6", "budget_dense8")], 2)
         + ", man pages " + _slashed([c.paired((f"{t}_domains", "hard_top2"), ("shipped_budget_top2_domains", "hard_top2"),
                                                "man-pages", 4096) for t in ("budget_dense6", "budget_dense8")], 2) + " paired",
         "worse everywhere", "[dense layers](studies/dense-layers-budget.md)"),
        ("a top-2 budget chosen on technical text", "`tech_budget_*`, `pooled_budget_*`",
         f"`pooled`: technical top-2 {_slashed(tech('pooled_budget_domains', 'hard_top2'))}, *Persuasion* unchanged",
         "criteria missed; margin below 2% on prose", "[technical top-2 budget](studies/tech-budget-top2.md)"),
        ("keys in their predecessor's group (`_keyshift`)", "`keyshift_domains`, `keyshift_persuasion`, `keyshift_hamlet`",
         (f"technical top-2 {_slashed(tech('keyshift_domains', 'hard_top2_keyshift'))}, top-1 "
         f"{_slashed(tech('keyshift_domains', 'hard_top1_keyshift'))}, same pairs"), "criteria missed; an option",
         "[key shift](studies/key-shift.md)"),
        ("routers trained with the key shift, budgets in the file",
         "`keyshift_trained_*`, `keyshift_budgets_*`, `keyshift_top1_budget_domains`",
         (", ".join(names[d] for d in meets) + " meet all three held-out criteria; " if meets else "")
         + ", ".join(f"{names[d]} {_slashed([c.dense(kt, d, 4096, 'hard_top2_keyshift'), c.dense(kt, d, 4096, 'hard_top1_keyshift')])}"
                     for d in missed),
         f"criteria missed on {_count(len(missed))} domains; fewer passkeys", "[key shift, trained](studies/key-shift-trained.md)"),
        ("a top-1 budget chosen on technical text", "`keyshift_tech_top1_*`, `keyshift_pooled_top1_*`",
         "technical top-1 at best " + ", ".join(
             f"{_pct(min(c.dense(f'{b}_domains', d, 4096, 'hard_top1_keyshift') for b in top1_budgets))} ({names[d]})"
             for d in ("man-pages", "debian-reference")),
         "*Persuasion* top-1 " + _span([c.paired((f"{b}_persuasion", "hard_top1_keyshift"), literary, P, L)
                                        for b in top1_budgets for L in (4096, 8192)]) + " paired",
         "[technical top-1 budget](studies/tech-budget-top1.md)"),
        ("three times the training (90 steps)", "`keyshift90_domains`, `keyshift90_controls_domains`, `keyshift90_heldout_8k`",
         f"every paired change within {_within(tech_paired(('keyshift90_domains', 'hard_top2_keyshift'), ks_budgets) + tech_paired(('keyshift90_domains', 'hard_top1_keyshift'), ks_top1), 1)} points",
         "no gain", "[three times the training](studies/three-times-training.md)"),
        ("routers instead of random groups in layers 1-9", "`keyshift90_all_routed_domains`",
         f"top-2 {_span(tech_paired(('keyshift90_all_routed_domains', 'hard_top2_keyshift'), ('keyshift90_domains', 'hard_top2_keyshift')))} worse",
         "worse", "[routers in layers 1-9](studies/routers-in-early-layers.md)"),
        ("a group capacity (`_cap`)", "`capacity`",
         (f"technical top-2 {_slashed([c.paired(('capacity', 'hard_top2_cap'), ('capacity', 'hard_top2'), d, 4096) for d in T], 2)} "
         f"paired{prose(cap[2])}; {NOISE_TASK} {c.retrieval('hard_top2_cap', 4096).distant_pairs_kept:.2f} of the pairs at "
         f"{rel('hard_top2_cap', 4096)} of dense"), "worse on technical text; an option", gc),
        ("the group capacity in nine layers (`_cap@0+13+15-16+21+24-25+28-29`)", "`capacity_layers`",
         (f"technical top-2 {_span(nine[0] + nine[1])} paired ({_count(len(nine[0]) + len(nine[1]))} corpora){prose(nine[2])}; "
         f"{NOISE_TASK} {c.retrieval('hard_top2_cap@0+13+15-16+21+24-25+28-29', 4096).distant_pairs_kept:.3f} of the pairs at "
         f"{rel('hard_top2_cap@0+13+15-16+21+24-25+28-29', 4096)} of dense (4096), {rel('hard_top2_cap@0+13+15-16+21+24-25+28-29', 8192)} "
         f"at 8192 ({n('hard_top2_cap@0+13+15-16+21+24-25+28-29', 8192)} cases)"),
         (f"meets the suite's pair bound by {0.60 - c.retrieval('hard_top2_cap@0+13+15-16+21+24-25+28-29', 4096).distant_pairs_kept:.3f}, "
         "not its 0.90 at 8192; an option"), gcl),
        ("the group capacity evicting in eight layers (`_evict@13+15-16+21+24-25+28-29`)", "`capacity_evict`",
         (f"technical top-2 {_span(evict[0])} paired {five(evict)}{prose(evict[2])}; {NOISE_TASK} "
         f"{pairs('hard_top2_evict@13+15-16+21+24-25+28-29', 3)} of the pairs at {rel('hard_top2_evict@13+15-16+21+24-25+28-29', 4096)} / "
         f"{rel('hard_top2_evict@13+15-16+21+24-25+28-29', 8192)} of dense (4096 / 8192, "
         f"{n('hard_top2_evict@13+15-16+21+24-25+28-29', 4096)} / {n('hard_top2_evict@13+15-16+21+24-25+28-29', 8192)} cases)"),
         "meets both of the suite's bounds, worse on technical text; an option", gcl),
        ("the same without layer 24 (`_evict@13+15-16+21+25+28-29`)", "`capacity_evict7`",
         (f"technical top-2 {_span(evict7[0])} paired {five(evict7)}{prose(evict7[2])}; {NOISE_TASK} {pairs(shipped, 3)} of the pairs "
         f"at {rel(shipped, 4096)} / {rel(shipped, 8192)} of dense (4096 / 8192, {n(shipped, 4096)} / {n(shipped, 8192)} cases)"),
         ("meets both of the suite's bounds; shipped: the top-2 `default` of `smollm2-135m/needle-mix-capacity`, measured "
         "on all 11 tasks ([retrieval](results.md#retrieval-beyond-passkey))"), gcl),
        ("eight groups at top-4", "`k8_split_domains`",
         f"every paired change within {_within(tech_paired(('k8_split_domains', 'hard_top2_keyshift'), ks_top1) + tech_paired(('k8_split_domains', 'hard_top4_keyshift'), ks_budgets), 1)} points",
         "no gain", "[eight groups](studies/eight-groups.md)"),
        ("distillation weighted to copies", "`copy_share_domains`",
         f"within {_within(tech_paired(('copy_share_domains', 'hard_top2_keyshift'), ks_budgets) + tech_paired(('copy_share_domains', 'hard_top1_keyshift'), ks_top1))} points",
         "no gain", "[copy-weighted distillation](studies/copy-weighted-distillation.md)"),
        ("the LM objective at 4096 tokens", "`lm_objective_domains`",
         f"within {_within([x for lab in ('hard_top2_keyshift', 'hard_top1_keyshift') for x in tech_paired(('lm_objective_domains', lab), ('keyshift90_domains', lab))])} points",
         "no gain", "[LM objective](studies/lm-objective.md)"),
        ("token-match pairs (`--match-shifts 0,1`)", "`match_per_domain`, `match_persuasion`, `keyshift90_match_domains`",
         (f"technical top-2 {_slashed(tech('match_per_domain', 'hard_top2'))}, top-1 {_slashed(tech('match_per_domain', 'hard_top1'))}, "
         f"about {100 * sum(c.kept('match_per_domain', d, 4096, 'hard_top2') - c.kept('shipped_per_domain', d, 4096, 'hard_top2') for d in T) / len(T):.0f}% more pairs"),
         (f"random groups with the pairs within {_points([c.margin('match_per_domain', d, 4096, 'random_top2') for d in T], 1)}%; "
         f"*Persuasion* 8192 {_pct(c.dense('match_persuasion', P, 8192, 'hard_top2'), 2)}; an option"),
         "[token-match pairs](studies/token-match-pairs.md)"),
        ("routers trained with the pairs kept", "`match_trained_*`, `broad_s5_match_domains`",
         f"top-2 changes by at most {_within(match_trained)}%",
         f"margin over random groups {_span(match_margin, 1)}", "[trained with the pairs](studies/trained-with-pairs.md)"),
    ]
    return rows


@block("alternatives", LENGTH_CELLS, RETRIEVAL_CASES, RECIPES_SWEEP)
def alternatives() -> Generated:
    """docs/recipes.md's "Alternatives measured" table: per router file or lever measured, the
    tables, the result, why it was not shipped and its study (``_alternative_rows``)."""
    rows = _alternative_rows(_Cells())
    lines = ["| routers or lever | table(s) | result | why not shipped | study |", "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    inputs = (f"{LENGTH_CELLS} (the tables each row names and the tables they are paired with: changes over dense, "
              "margins over random / shuffled groups, paired changes on the windows both tables have; technical text "
              f"at 4096 and 8192 tokens on cells of more than one window), {RETRIEVAL_CASES} ({NOISE_TASK}), "
              f"{RECIPES_SWEEP} (30 steps at 512 tokens)")
    return Generated(inputs, "\n".join(lines))



# the blocks of the other pages (studies, the recipe's stages, reference tables): analyses/blocks/,
# one module per page or group of pages; importing the package registers them
import analyses.blocks  # noqa: E402,F401

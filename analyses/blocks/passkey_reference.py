"""docs/passkey_reference.md's prompt-format table: dense attention, SmolLM2-135M-Instruct, each
prompt format (``focus_lab.eval.passkey``: ``plain``, ``bare``, ``chat``) at 1024 and 2048 tokens,
3 keys x depths 0 / 50 / 100 (9 cases a format and length): exact matches and the mean key log-prob
(nats, summed over the key's tokens), from the committed probe table ``FORMATS_TABLE``
(``focus-lab probe passkey --formats plain,bare,chat --patterns dense --lengths 1024,2048 --depths
0,50,100``, committed with ``python -m analyses.exp_passkey --commit``). The page's other
measured tables are ``analyses.doc_blocks``' passkey blocks."""

from __future__ import annotations

import json

import pandas as pd

from analyses.doc_blocks import PASSKEY_CASES, PASSKEY_TABLES, REPO, Generated, MissingInput, block

PAGE = "docs/passkey_reference.md"
PROSE_PAGES = (PAGE,)
ALLOWED = {PAGE: set()}
FORMATS_TABLE = "prompt_formats_1k_2k"
#: format -> what its prompt holds (focus_lab.eval.passkey's formats)
FORMATS = {"plain": "instruction, text, question, continued", "bare": "text and question only",
           "chat": "the same as the user turn of the chat template, the assistant turn primed with \"The pass key is\""}


def format_cells() -> pd.DataFrame:
    """Per (format, length): cases, exact matches and mean key log-prob (nats) of table ``FORMATS_TABLE``."""
    df = pd.read_parquet(REPO / PASSKEY_CASES)
    df = df[(df.table == FORMATS_TABLE) & (df.pattern == "dense")]
    if df.empty:
        raise MissingInput(f"{PASSKEY_CASES} (table {FORMATS_TABLE})")
    return (df.groupby(["format", "length"])
            .agg(cases=("exact_match", "size"), found=("exact_match", "sum"), key_logprob=("key_logprob", "mean"))
            .reset_index())


@block("passkey-formats", PASSKEY_CASES, PASSKEY_TABLES)
def passkey_formats() -> Generated:
    """One row per format: exact matches and mean key log-prob at each length; the best log-prob
    of each length in bold."""
    cells = format_cells()
    lengths = sorted(cells.length.unique())
    meta = json.loads((REPO / PASSKEY_TABLES).read_text()).get(FORMATS_TABLE, {})
    head = ["format", "what"] + [f"exact match, {n} tokens" for n in lengths] + [f"key log-prob, {n} tokens"
                                                                                  for n in lengths]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    best = {n: cells[cells.length == n].key_logprob.max() for n in lengths}
    for fmt in [f for f in FORMATS if f in set(cells.format)]:
        row = cells[cells.format == fmt].set_index("length")
        found = [f"{int(row.found[n])}/{int(row.cases[n])}" for n in lengths]
        lp = [(f"**{row.key_logprob[n]:.2f}**" if row.key_logprob[n] == best[n] else f"{row.key_logprob[n]:.2f}")
              for n in lengths]
        lines.append(f"| `{fmt}` | {FORMATS[fmt]} | " + " | ".join(found + lp) + " |")
    settings = meta.get("settings", {})
    routers = settings.get("routers", {})
    inputs = (f"{PASSKEY_CASES} with {PASSKEY_TABLES}, table {FORMATS_TABLE}: dense, "
              f"{settings.get('haystack', 'held-out Persuasion')}, depths "
              f"{', '.join(f'{d:g}' for d in meta.get('depths', []))}, {settings.get('keys', '?')} keys; routers "
              f"attached: sha256 {str(routers.get('sha256', ''))[:12]}; {meta.get('seconds', float('nan')):.0f} s")
    return Generated(inputs, "\n".join(lines))

"""What every result table records of what ran (docs/api.md "Patterns"): the canonical pattern
of each row (``Pattern.from_config`` of the config in force), the router file's manifest name
and sha256, and the commit of the code."""

from __future__ import annotations

import pandas as pd


def canonical_spellings(config, patterns, as_is: tuple[str, ...] = ()) -> dict[str, str]:
    """{label: canonical pattern} of ``patterns`` ([(label, FocusConfig changes, ...)]) on a
    model whose default config is ``config`` (the router file's); the labels ``as_is`` (the
    retrieval suite's ``moba_matched``, not a pattern of groups) keep their label."""
    from focus_lab.patterns import Pattern
    return {label: label if label in as_is else str(Pattern.from_config(config.replace(**changes)))
            for label, changes, *_ in patterns}


def with_provenance(df: pd.DataFrame, label_column: str, config, patterns, routers=None,
                    as_is: tuple[str, ...] = ()) -> pd.DataFrame:
    """``df`` with ``canonical_pattern`` (mapped from ``label_column``, ``canonical_spellings``)
    and, when ``routers`` (a router file's path) is given, ``router_name``, ``router_sha256`` and
    ``commit`` (``shipped.router_columns``)."""
    out = df.assign(canonical_pattern=df[label_column].map(canonical_spellings(config, patterns, as_is)))
    if routers is not None:
        from focus_lab.hf.shipped import router_columns
        out = out.assign(**router_columns(routers))
    return out

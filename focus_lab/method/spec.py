"""The leaf of the configuration: its error and the integer-list spelling (``'0,3,5-7'``) that
FocusConfig, the CLI and the pattern rules share (``focus_lab.method.config``,
``focus_lab.patterns.rules``); it imports nothing of focus_lab."""

from __future__ import annotations


class ConfigError(ValueError):
    """An invalid Focus configuration; the message names the field and the fix."""


def format_int_list(values) -> str:
    """The inverse of ``parse_int_list``: integers -> ascending, runs as ranges, e.g.
    [1, 2, 3, 7, 9, 10] -> '1-3,7,9-10'; [] -> ''."""
    runs: list[list[int]] = []
    for v in sorted(int(x) for x in values):
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def parse_int_list(spec: str) -> list[int]:
    """'0,3,5-7' -> [0, 3, 5, 6, 7] (layer or head indices, in the order given; spaces ignored).
    Raises ValueError naming the spec and the accepted form."""
    out: list[int] = []
    for part in spec.replace(" ", "").split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            out += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
        except ValueError:
            raise ValueError(f"cannot read {spec!r} as a list of integers like '0,3,5-7'") from None
    return out

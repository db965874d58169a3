"""Figure 12: passkey retrieval by prompt length and needle depth, per attention pattern
(``passkey.heatmap_figure`` over ``data/passkey.parquet``; experiment ``analyses/exp_passkey.py``).
Sources: docs/passkey.md (the probe).
"""

from __future__ import annotations

import sys
from pathlib import Path

from analyses.common import read

TITLE = "Passkey retrieval on held-out Austen haystacks (shipped routers)"


def make_figure(data_dir: Path):
    from focus_lab.eval.passkey_figure import heatmap_figure
    cases = read(data_dir, "passkey")
    fig = heatmap_figure(cases)
    n = cases.groupby(["length", "depth", "pattern"]).size()
    keys = f"{int(n.min())}" if n.min() == n.max() else f"{int(n.min())}-{int(n.max())}"
    fig.update_layout(title=f"{TITLE}<br><sup>colour: exact-match rate over {keys} keys per "
                            "cell; text: mean key log-prob (nats); rows: prompt tokens, columns: needle depth</sup>")
    return fig


if __name__ == "__main__":
    make_figure(Path(sys.argv[1] if len(sys.argv) > 1 else "figures/data")).write_html("fig_passkey.html")

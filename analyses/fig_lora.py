"""Figure 9: LoRA vs Focus at the same parameter budget. Left: perplexity on held-out Austen (the
training domain); right: perplexity on general text (Shakespeare, Python docs) relative to the
untouched model, i.e. how much general-text quality each keeps (docs/method.md §5: "LoRA lowers
benchmarks at every LR and rank; Focus keeps TruthfulQA"; benchmarks are out of reach here, PPL
is the proxy). LoRA: peft on q/v, rank matched to the router's parameter count, trained at 512
tokens (``data/lora``), evaluated on the windows of ``data/baselines`` (Austen) and
``data/transfer_domain`` (the others), whose Focus hard top-k numbers stand beside it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analyses.common import METHOD_COLORS, read

TITLE = "LoRA vs Focus at equal parameter budget: domain gain and general-text cost"
DATA = ("lora", "baselines", "transfer_domain")


def lora_table(data_dir: Path) -> pd.DataFrame:
    lora = read(data_dir, "lora")
    base = read(data_dir, "baselines")
    k = max(1, int(base["num_groups"].iloc[0]) // 2)
    rows = pd.concat([base.assign(corpus="austen"), read(data_dir, "transfer_domain")], ignore_index=True)
    rows = rows[rows["label"].isin(["dense", "soft", f"hard_top{k}"]) & rows["method"].isin(["dense", "focus"])]
    rows = rows.assign(model=rows["label"].map({"dense": "base model (dense)", "soft": "Focus soft",
                                                f"hard_top{k}": f"Focus hard top-{k}"}))
    lo = lora.assign(model=[f"LoRA r={r} ({p:,} params)" for r, p in zip(lora["rank"], lora["lora_parameters"])])
    df = pd.concat([rows[["model", "corpus", "perplexity"]], lo[["model", "corpus", "perplexity"]]], ignore_index=True)
    dense = df[df["model"] == "base model (dense)"].set_index("corpus")["perplexity"]
    df["ppl_vs_base"] = df["perplexity"] / df["corpus"].map(dense)
    return df


def make_figure(data_dir: Path):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    df = lora_table(data_dir)
    lora = read(data_dir, "lora")
    colors = {"base model (dense)": METHOD_COLORS["dense"], "Focus soft": "#ff9896"}
    fig = make_subplots(rows=1, cols=2, column_widths=[0.35, 0.65],
                        subplot_titles=("domain: held-out Austen (PPL)", "general text: PPL / base model PPL"))
    for model, part in df.groupby("model", sort=False):
        c = colors.get(model, METHOD_COLORS["lora"] if model.startswith("LoRA") else METHOD_COLORS["focus"])
        d = part[part["corpus"] == "austen"]
        g = part[part["corpus"] != "austen"]
        fig.add_trace(go.Bar(x=[model], y=d["perplexity"], name=model, marker_color=c, legendgroup=model,
                             text=[f"{v:.2f}" for v in d["perplexity"]], textposition="outside"), row=1, col=1)
        fig.add_trace(go.Bar(x=g["corpus"], y=g["ppl_vs_base"], name=model, marker_color=c, legendgroup=model,
                             showlegend=False, text=[f"{v:.2f}" for v in g["perplexity"]], textposition="outside"),
                      row=1, col=2)
    fig.add_hline(y=1.0, line=dict(color="gray", dash="dash"), row=1, col=2)
    d, g = df[df["corpus"] == "austen"]["perplexity"], df[df["corpus"] != "austen"]["ppl_vs_base"]
    fig.update_yaxes(range=[d.min() * 0.97, d.max() * 1.03], row=1, col=1)  # zoomed: labels give the values
    fig.update_yaxes(range=[min(1.0, g.min()) * 0.97, max(1.0, g.max()) * 1.03], row=1, col=2)
    r = lora.iloc[0]
    fig.update_layout(title=f"{TITLE}<br><sup>LoRA rank {r['rank']} on q/v = {int(r['lora_parameters']):,} params vs "
                            f"router {int(r['router_parameters']):,}; {int(r['steps'])} steps of {int(r['batch_size'])} x "
                            f"{int(r['train_seq_len'])} tokens, lr {r['lr']}; evaluated on "
                            + ", ".join(f"{c} {int(g['windows'].iloc[0])} x {int(g['seq_len'].iloc[0])}" for c, g in lora.groupby("corpus", sort=False)
                                        if "windows" in g and "seq_len" in g) + " tokens</sup>", barmode="group",
                      template="plotly_white", width=1400, height=560)
    return fig

"""The reproduction table: each claim of the paper (docs/method.md §5, plus the §1-§4 notes we can
test), our measured number, the setting, and a verdict: **holds**, **does not hold**, or **not
testable here** (and why). Every number is read from the cached experiment results under
``data/`` (``focus-lab figures``); the verdict rules are written next to each claim below, so
that a rerun with other data re-decides them. Models and data here: SmolLM2-135M-Instruct
(Llama family, 30 layers), router-only training on five Austen novels, held-out *Persuasion*;
CPU only, short schedules, few windows: differences of about 1% are within noise."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analyses.common import bench_dir, read

TITLE = "Reproduction of the paper's claims"
DATA = ("router", "baselines", "collapse", "ablation", "transfer_domain", "lora", "transfer_length",
        "causal_leak", "records", "bench")

HOLDS, FAILS, NT = "holds", "does not hold", "not testable here"


def _pct(a: float, b: float) -> str:
    return f"{(a / b - 1):+.1%}"


class _Ctx:
    def __init__(self, data_dir: Path):
        self.d = Path(data_dir)
        self._c = {}

    def __call__(self, name):
        if name not in self._c:
            self._c[name] = read(self.d, name)
        return self._c[name]

    def ppl(self, method, label):
        b = self("baselines")
        r = b[(b["method"] == method) & (b["label"] == label)]
        return float(r["perplexity"].iloc[0])

    def matched(self, method):
        """(label, perplexity, kept) of ``method``'s hard pattern whose distant pairs kept is
        closest to Focus's at its top-k (matched sparsity)."""
        b = self("baselines")
        f = float(b[(b.method == "focus") & (b.label == f"hard_top{self.k}")].distant_pairs_kept.iloc[0])
        m = b[(b.method == method) & b.distant_pairs_kept.notna()]
        r = m.iloc[(m.distant_pairs_kept - f).abs().argsort().iloc[0]]
        return str(r.label), float(r.perplexity), float(r.distant_pairs_kept)

    @property
    def k(self):
        return max(1, int(self("baselines")["num_groups"].iloc[0]) // 2)

    @property
    def setting(self):
        b = self("baselines")
        r = b.iloc[0]
        router = self("router").iloc[0]
        steps = router.get("steps")
        model = {"smollm2-135m-instruct": "SmolLM2-135M"}.get(str(router.get("model")), str(router.get("model")))
        return (f"{model}, router-only ({'' if steps is None or pd.isna(steps) else f'{int(steps)} steps, '}"
                f"K={int(r.num_groups)}, w={int(r.window)}, {int(r.sink_tokens)} sink tokens), held-out Austen, "
                f"{int(b['tokens'].iloc[0] / (r.seq_len - 1))} x {int(r.seq_len)} tokens")


def _ablation_setting(d: Path) -> str:
    import json
    p = Path(d) / "ablation.json"
    st = json.loads(p.read_text()).get("settings", {}) if p.is_file() else {}
    b = read(d, "ablation")
    b = b[b["axis"] == "base"].iloc[0]
    return (f"one axis at a time around the base (K, w, tau, N) = ({int(b.num_groups)}, {int(b.window)}, {b.tau:g}, "
            f"{int(b.sinkhorn_iters)}); "
            f"{st.get('ablation_steps', '?')} steps of 1 x {st.get('ablation_seq_len', '?')} tokens from one init, "
            f"{st.get('ablation_eval_windows', '?')} eval windows")


def _claims(c: _Ctx) -> list:
    """[(claim, paper, fn)]: fn() -> (ours, setting, verdict)."""
    out = []

    def add(claim, paper):
        def deco(fn):
            out.append((claim, paper, fn))
            return fn
        return deco

    @add("GPT-2 124M on PG-19, full fine-tune: Focus vs full attention PPL [abstract]", "30.3 vs 31.4")
    def _():
        s, d = c.ppl("focus", "soft"), c.ppl("dense", "dense")
        return (f"analogue, router-only: soft {s:.2f} vs dense {d:.2f} ({_pct(s, d)})", c.setting,
                f"{NT}: no GPT-2/PG-19 here and full fine-tuning is out of a 2-core CPU's reach")

    @add("7B from scratch, 2B tokens: Focus vs full [abstract]", "13.82 vs 13.89")
    def _():
        return "-", "-", f"{NT}: pretraining a 7B model needs a GPU cluster"

    @add("Pretrained model, top-k inference: Focus PPL below the dense baseline [abstract]", "41.3 vs 42.8 (GPT-2)")
    def _():
        h, d = c.ppl("focus", f"hard_top{c.k}"), c.ppl("dense", "dense")
        h1 = c.ppl("focus", "hard_top1")
        return (f"hard top-{c.k}: {h:.2f} vs dense {d:.2f} ({_pct(h, d)}); top-1 {h1:.2f} ({_pct(h1, d)})",
                c.setting, HOLDS if h <= d else FAILS)

    @add("Top-k inference is 2x faster [abstract]", "2x")
    def _():
        b = c("baselines")
        sp = float(b.loc[(b.method == "focus") & (b.label == f"hard_top{c.k}"), "speedup"].iloc[0])
        T = int(b["seq_len"].iloc[0])
        txt = f"end to end at {T} tokens: x{sp:.2f}"
        best = sp
        bd = bench_dir(c.d.parent)
        if bd is not None and (bd / "e2e.csv").is_file():
            e = pd.read_csv(bd / "e2e.csv")
            e = e[e.attention == "hard"]
            txt += "; benchmark end to end " + ", ".join(
                f"{int(t)}: x{s:.2f} (K={int(K)} k={int(k)}{', untrained router' if str(r).startswith('untrained') else ''})"
                for t, s, K, k, r in zip(e.tokens, e.speedup_vs_dense, e.K, e.k, e.router))
            best = max(best, float(e.speedup_vs_dense.max()))
        return txt, "CPU, hard mode through the decomposition (512 tokens: 1 torch thread; benchmark: 2 threads)", HOLDS if best >= 2 else \
            f"{FAILS} at these lengths on CPU"

    @add("Decomposition: two FlashAttention calls, 8.6x at 1M tokens (K=8) [abstract]", "8.6x")
    def _():
        bd = bench_dir(c.d.parent)
        k = pd.read_csv(bd / "kernel.csv") if bd is not None else c("bench")
        sub = k[(k.K == 8) & (k.k == 1) & (k.groups == "balanced") & k.speedup.notna()]
        if not len(sub):
            return "no K=8 k=1 rows in the benchmark", "-", NT
        r = sub.sort_values("n").iloc[-1]
        return (f"K=8 k=1 at n={int(r.n):,}: x{r.speedup:.2f} (ideal x{r.ideal_speedup:.2f})",
                "CPU kernel benchmark (analyses/bench_attention.py), balanced groups",
                f"{NT} at 1M tokens (dense attention at 1M is infeasible on this CPU); "
                + ("trend consistent" if r.speedup >= 0.5 * r.ideal_speedup else "below half the ideal at the largest n"))

    @add("No speedup at <= 4K tokens (sort + gather overhead) [notes]", "<= 1x at 4K (H100)")
    def _():
        bd = bench_dir(c.d.parent)
        k = pd.read_csv(bd / "kernel.csv") if bd is not None else c("bench")
        sub = k[(k.n == 4096) & (k.groups == "balanced")]
        if not len(sub):
            return "no 4K rows in the benchmark", "-", NT
        txt = ", ".join(f"K={int(r.K)} k={int(r.k)}: x{r.speedup:.2f}" for r in sub.itertuples())
        return (f"kernel at 4096 tokens: {txt}", "CPU kernel benchmark", HOLDS if sub.speedup.max() <= 1.1 else
                f"{FAILS} on CPU (the overhead is small next to CPU attention)")

    @add("Centroid-only parameters [abstract]", "148K (GPT-2 124M)")
    def _():
        gpt2 = 12 * (768 * 16 + 4 * 16)
        r = c("router").iloc[0]
        return (f"12 x (768 x 16 + 4 x 16) = {gpt2:,} for GPT-2 (K=4, d_g=16); SmolLM2-135M: {int(r.router_parameters):,}",
                "parameter count of core.Router", HOLDS if abs(gpt2 - 148_000) < 1000 else FAILS)

    @add("Mistral 7B, top-2: PPL cost [notes]", "+0.7")
    def _():
        h, d = c.ppl("focus", f"hard_top{c.k}"), c.ppl("dense", "dense")
        return (f"analogue on SmolLM2: hard top-{c.k} {h - d:+.2f} PPL ({_pct(h, d)})", c.setting,
                f"{NT}: no 7B model on this CPU")

    @add("Retrofit baselines (Longformer-style window, Performer, Routing Transformer) lose to Focus [notes]",
         "Performer +75.6 PPL; Focus best")
    def _():
        k = c.k
        f = c.ppl("focus", f"hard_top{k}")
        b = c("baselines")
        fk = float(b[(b.method == "focus") & (b.label == f"hard_top{k}")].distant_pairs_kept.iloc[0])
        w = c.ppl("window", "window")
        parts = [f"Focus top-{k} {f:.2f} (keeps {fk:.2f} of distant pairs)", f"window w=128 {w:.2f}"]
        others = {}
        for m in ("window_matched", "online_kmeans", "kmeans", "random", "moba"):
            if m in set(b.method):
                lab, v, kept = c.matched(m)
                others[m] = v
                parts.append(f"{m} {lab.replace('window_matched_', '').replace('hard_', '')} {v:.2f} ({kept:.2f})")
        # the paper's retrofit baselines here: Longformer-style window (also at matched sparsity) and the
        # Routing-Transformer-style online k-means; k-means, random groups and MoBA are reported beside them
        named = {m: v for m, v in others.items() if m in ("window_matched", "online_kmeans")}
        beaten = [m for m, v in named.items() if v <= f] + (["window"] if w <= f else [])
        extra = [m for m in ("kmeans", "random", "moba") if m in others and others[m] <= f]
        verdict = (HOLDS if not beaten else f"{FAILS}: {', '.join(beaten)} at least as good") + \
            (f" (but {', '.join(extra)} also at least as good)" if extra else "") + \
            "; margins of 1-2% on 4 windows"
        return ("; ".join(parts) + " (Performer not implemented)",
                c.setting + "; each baseline at the top-k whose distant pairs kept (in brackets) is closest to Focus's",
                verdict)

    @add("Token-selection baselines (SparQ, MagicPIG) lose 5-10 PPL; Focus gains 6.6 [notes]", "-5..-10 vs +6.6")
    def _():
        d = c.ppl("dense", "dense")
        lab, v, kept = c.matched("moba")
        b = c("baselines")
        m2 = b[(b.method == "moba") & (b.label == f"hard_top{c.k}")]
        extra = f"; at top-{c.k} it keeps {float(m2.distant_pairs_kept.iloc[0]):.2f}: {float(m2.perplexity.iloc[0]):.2f}" \
            if len(m2) else ""
        return (f"MoBA block gate {lab.replace('hard_', '')} (keeps {kept:.2f}): {v:.2f} ({_pct(v, d)} vs dense){extra}",
                c.setting, f"{NT}: SparQ / MagicPIG are not implemented; MoBA (block selection) is the nearest here")

    @add("LoRA at equal budget lowers benchmarks at every LR and rank; Focus keeps TruthfulQA [abstract]",
         "LoRA worse, Focus unchanged")
    def _():
        lora = c("lora")
        td = c("transfer_domain")
        parts, lora_worse, focus_better = [], [], []
        for corpus in ("shakespeare", "python-docs"):
            base = float(td[(td.corpus == corpus) & (td.label == "dense")].perplexity.iloc[0])
            lo = float(lora[lora.corpus == corpus].perplexity.iloc[0])
            fh = float(td[(td.corpus == corpus) & (td.method == "focus") & (td.label == f"hard_top{c.k}")].perplexity.iloc[0])
            fs = float(td[(td.corpus == corpus) & (td.label == "soft")].perplexity.iloc[0])
            parts.append(f"{corpus}: LoRA {_pct(lo, base)}, Focus soft {_pct(fs, base)}, hard top-{c.k} {_pct(fh, base)}")
            lora_worse.append(lo > base)
            focus_better.append(min(fs, fh) <= lo)
        d = c.ppl("dense", "dense")
        la = float(lora[lora.corpus == "austen"].perplexity.iloc[0])
        parts.insert(0, f"Austen (domain): LoRA {la:.2f} ({_pct(la, d)}), Focus soft {_pct(c.ppl('focus', 'soft'), d)}")
        r = lora.iloc[0]
        verdict = HOLDS if all(lora_worse) and all(focus_better) else FAILS
        return ("; ".join(parts) + " (general-text PPL vs base)",
                f"LoRA r={int(r['rank'])} on q/v ({int(r.lora_parameters):,} params vs router {int(r.router_parameters):,}), "
                f"{int(r.steps)} steps, lr {r.lr}, one LR only; PPL as the benchmark proxy",
                verdict + " (PPL proxy; benchmarks not testable here)")

    @add("Centroid-only training improves domain perplexity with zero downstream degradation [abstract, docs/method.md §3]",
         "domain PPL down, general text unchanged")
    def _():
        d, s_ = c.ppl("dense", "dense"), c.ppl("focus", "soft")
        td = c("transfer_domain")
        gen = []
        for corpus in ("shakespeare", "python-docs"):
            base = float(td[(td.corpus == corpus) & (td.label == "dense")].perplexity.iloc[0])
            fs = float(td[(td.corpus == corpus) & (td.label == "soft")].perplexity.iloc[0])
            gen.append((corpus, fs / base - 1))
        txt = (f"held-out Austen: soft {s_:.2f} vs dense {d:.2f} ({_pct(s_, d)}); general text, soft vs dense: "
               + ", ".join(f"{cp} {g:+.1%}" for cp, g in gen))
        verdict = HOLDS if s_ < d and all(g <= 0.005 for _, g in gen) else \
            (f"{FAILS}: the router does not lower domain PPL" if s_ >= d else f"{FAILS}: general text degrades")
        return (txt, c.setting + " (the dense pattern, i.e. the routers switched off, is the base model exactly)",
                verdict)

    @add("Works on GPT-2, Mistral, Qwen2.5, OLMo-2, Gemma-2, LLaMA-2 [notes]", "6 architectures")
    def _():
        return ("attach/detach exact and hard = dense reference on tiny random configs of GPT-2, Llama, Mistral, "
                "Qwen2, OLMo-2, Gemma-2, Gemma-3 (tests/test_architectures.py); quality measured on SmolLM2 only",
                "unit tests on tiny configs", f"{NT} for quality (no such weights here); mechanics hold")

    @add("Groups discover linguistic categories without supervision [abstract]", "qualitative")
    def _():
        from focus_lab.runs import Run
        run = Run.open(c.d / "runs" / "focus")
        sc = run.table("linguistic_scores")
        m = sc[sc.labels == "pos"].groupby("assignment")["nmi"].mean()
        best = sc[(sc.labels == "pos") & (sc.assignment == "focus")].sort_values("nmi").iloc[-1]
        txt = (f"mean NMI(groups, POS) over layers: Focus {m.get('focus', np.nan):.3f}, k-means {m.get('kmeans', np.nan):.3f}, "
               f"random {m.get('random', np.nan):.3f}; best Focus layer {int(best.layer_idx)}: {best.nmi:.3f}")
        ok = m.get("focus", 0) > m.get("random", 0) + 0.05
        return (txt, f"{run.manifest.get('windows')} recorded windows x {run.manifest.get('seq_len')} tokens, spaCy coarse POS",
                (HOLDS if ok else FAILS) + (" (k-means on the same inputs does better)" if m.get("kmeans", 0) > m.get("focus", 0) else ""))

    @add("Plain softmax collapses (one group takes almost every token); Sinkhorn stays balanced [notes, docs/method.md §1]",
         "99.4% vs 15.9% (K=8)")
    def _():
        df = c("collapse")
        last = df[df.step == df.step.max()].groupby("gate")["argmax_largest_share"].mean()
        K = int(df.num_groups.iloc[0])
        sm, sk = float(last.get("softmax", np.nan)), float(last.get("sinkhorn", np.nan))
        ok = sm >= 0.5 and sk <= 2 / K
        return (f"largest group after {int(df.step.max()) + 1} steps: softmax {sm:.1%}, Sinkhorn {sk:.1%} (1/K = {1 / K:.1%})",
                f"K={K}, {int(df.step.max()) + 1} training steps from the same init, mean over layers",
                HOLDS if ok else (f"{FAILS} at this short schedule" if sm < 0.5 else FAILS))

    @add("16 settings of K, w, tau, Sinkhorn iterations move fine-tuned PPL by only 0.6 [notes, Table 9]", "0.6 PPL")
    def _():
        df = c("ablation")
        rows = df[df["mode"] != "dense"]
        soft = rows[rows["mode"] == "soft"].perplexity
        hard = rows[rows["mode"] == "hard"].perplexity
        rng_s, rng_h = soft.max() - soft.min(), hard.max() - hard.min()
        return (f"range over {rows.setting.nunique()} settings: soft {rng_s:.2f} PPL, hard top-K/2 {rng_h:.2f} PPL "
                f"(soft {soft.min():.2f}..{soft.max():.2f})",
                _ablation_setting(c.d), HOLDS if rng_s <= 0.6 else f"{FAILS} at this short schedule")

    @add("Centroids trained at T=1024 transfer to T=8192 [notes]", "transfer")
    def _():
        t = c("transfer_length")
        k = c.k
        b = c("baselines")
        T0 = int(b.seq_len.iloc[0])
        rows = {T0: {"hard": c.ppl("focus", f"hard_top{k}"), "soft": c.ppl("focus", "soft"),
                     "random": c.ppl("random", f"hard_top{k}"), "dense": c.ppl("dense", "dense")}}
        for T, part in t.groupby("seq_len"):
            get = lambda m, l: float(part[(part.method == m) & (part.label == l)].perplexity.iloc[0])
            rows[int(T)] = {"hard": get("focus", f"hard_top{k}"), "soft": get("focus", "soft"),
                            "random": get("random", f"hard_top{k}"), "dense": get("dense", "dense")}
        txt = "; ".join(f"{T}: hard top-{k} {_pct(r['hard'], r['dense'])}, random top-{k} {_pct(r['random'], r['dense'])}, "
                        f"soft {_pct(r['soft'], r['dense'])}" for T, r in sorted(rows.items()))
        Tmax = max(rows)
        gap = lambda T, kind: rows[T][kind] / rows[T]["dense"] - 1
        hard_ok = gap(Tmax, "hard") <= gap(T0, "hard") + 0.01 and rows[Tmax]["hard"] <= rows[Tmax]["random"]
        soft_ok = gap(Tmax, "soft") <= gap(T0, "soft") + 0.01
        verdict = HOLDS if hard_ok else (f"{FAILS} for hard top-k (worse than random groups at {Tmax})"
                                          if rows[Tmax]["hard"] > rows[Tmax]["random"] else f"{FAILS} for hard top-k")
        verdict += "; soft mode " + ("transfers" if soft_ok else "degrades mildly")
        return (f"PPL vs dense at each length: {txt}", f"router trained at {T0}; "
                f"{int(t.tokens.iloc[0] / (t.seq_len.iloc[0] - 1))} window per longer length (noisy)", verdict)

    @add("The soft gate's Sinkhorn looks ahead; hard inference must be causal [docs/method.md §1 ours]", "(a project question)")
    def _():
        df = c("causal_leak").set_index("variant")["perplexity"]
        full, pre = df["soft, Sinkhorn over the window"], df["soft, prefix-causal Sinkhorn"]
        hard = df[f"hard causal top{c.k}"]
        return (f"soft whole-window {full:.2f}, soft prefix-causal {pre:.2f}, hard causal top-{c.k} {hard:.2f}, "
                f"dense {df['dense']:.2f}", c.setting,
                "the look-ahead flatters soft PPL by " + _pct(pre, full).lstrip("+") if pre > full else
                "no measurable leak (prefix-causal soft is as good)")

    return out


def make_table(data_dir: Path) -> pd.DataFrame:
    c = _Ctx(data_dir)
    rows = []
    for claim, paper, fn in _claims(c):
        try:
            ours, setting, verdict = fn()
        except FileNotFoundError as e:
            ours, setting, verdict = f"not measured yet ({Path(str(e).split(' is missing')[0]).name} missing)", "-", "pending"
        except (KeyError, IndexError, ValueError) as e:
            ours, setting, verdict = f"not measured ({type(e).__name__}: {e})", "-", "pending"
        rows.append({"claim": claim, "paper": paper, "ours": ours, "setting": setting, "verdict": verdict})
    return pd.DataFrame(rows)


def to_markdown(df: pd.DataFrame) -> str:
    esc = lambda s: str(s).replace("|", "\\|").replace("\n", " ")
    lines = ["| claim | paper | ours | setting | verdict |", "|---|---|---|---|---|"]
    for r in df.itertuples():
        lines.append(f"| {esc(r.claim)} | {esc(r.paper)} | {esc(r.ours)} | {esc(r.setting)} | **{esc(r.verdict)}** |")
    return "\n".join(lines) + "\n"

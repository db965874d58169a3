"""The reproduction table: each claim of the paper (docs/method.md §5, plus the §1-§4 notes we can
test), our measured number, the setting, and a verdict: **holds**, **does not hold**, or **not
testable here** (and why). Every number is read from the cached experiment results under
``data/`` (``focus-lab-figures``); the verdict rules are written next to each claim below, so
that a rerun with other data re-decides them. Models and data here: SmolLM2-135M-Instruct
(Llama family, 30 layers), router-only training on five Austen novels, held-out *Persuasion*;
CPU only, short schedules, few windows: differences of about 1% are within noise."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from focus_lab.method.config import FocusConfig, format_int_list

from analyses.common import bench_dir, gpu_kernel_tables, gpu_kernel_runs, read

TITLE = "Reproduction of the paper's claims"
DATA = ("router", "baselines", "collapse", "ablation", "transfer_domain", "lora", "transfer_length",
        "causal_leak", "records", "bench")

HOLDS, FAILS, NT = "holds", "does not hold", "not testable here"


def _pct(a: float, b: float) -> str:
    return f"{(a / b - 1):+.1%}"


class _Ctx:
    """Cached experiment results and the measured changes every claim reads."""

    def __init__(self, data_dir: Path):
        self.d = Path(data_dir)
        self._c = {}

    def __call__(self, name, per_window=False):
        """Experiment ``name``'s cached rows (``common.read``), read once."""
        if (name, per_window) not in self._c:
            self._c[name, per_window] = read(self.d, name, per_window=per_window)
        return self._c[name, per_window]

    def lora_rows(self, on_austen: bool) -> pd.DataFrame:
        """LoRA's per-window rows beside the base model's (dense) rows on the same windows: the
        held-out Austen windows of ``baselines``, or the other corpora of ``transfer_domain``."""
        lora = self("lora", per_window=True)
        if on_austen:
            lora, ref = lora[lora.corpus == "austen"], self("baselines", True).assign(corpus="austen")
        else:
            lora, ref = lora[lora.corpus != "austen"], self("transfer_domain", True)
        return pd.concat([lora, ref[ref.method == "dense"]], ignore_index=True)

    def ppl(self, method, label):
        b = self("baselines")
        r = b[(b["method"] == method) & (b["label"] == label)]
        return float(r["perplexity"].iloc[0])

    def change(self, a: tuple, b: tuple = ("dense", "dense"), name: str | pd.DataFrame = "baselines",
               **where):
        """Pattern ``a`` = (method, label) over pattern ``b`` in experiment ``name`` (or in a
        frame of per-window rows, e.g. ``lora_rows``; rows filtered by ``where``, e.g. corpus=,
        seq_len=): (perplexity of a, change %, 95% low, 95% high, windows), paired over the
        windows both have (``evaluate.paired_change``)."""
        from focus_lab.eval.evaluate import paired_change, pool_windows
        df = name if isinstance(name, pd.DataFrame) else self(name, per_window=True)
        for col, val in where.items():
            df = df[df[col] == val]
        pick = lambda m, l: df[(df["method"] == m) & (df["label"] == l)]
        x, y = pick(*a), pick(*b)
        if not len(x) or not len(y):
            what = "these rows" if isinstance(name, pd.DataFrame) else name
            raise KeyError(f"{what}: no rows for {a} or {b} at {where}")
        pooled = pool_windows(x[["window", "nll", "tokens", "seconds", "distant_pairs_kept", "max_group_share"]]
                              .assign(label="a"))
        return (float(pooled["perplexity"].iloc[0]), *paired_change(x, y), int(pooled["windows"].iloc[0]))

    def matched(self, method):
        """(label, perplexity, kept) of ``method``'s hard pattern whose distant pairs kept is
        closest to Focus's at its top-k (matched sparsity)."""
        b = self("baselines")
        f = float(b[(b.method == "focus") & (b.label == f"hard_top{self.k}")].distant_pairs_kept.iloc[0])
        m = b[(b.method == method) & b.distant_pairs_kept.notna() & (b["mode"] == "hard")]
        if method == "window_matched":
            m = b[(b.method == method) & b.distant_pairs_kept.notna()]
        r = m.iloc[(m.distant_pairs_kept - f).abs().argsort().iloc[0]]
        return str(r.label), float(r.perplexity), float(r.distant_pairs_kept)

    @property
    def k(self):
        return max(1, int(self("baselines")["num_groups"].iloc[0]) // 2)

    @property
    def routers(self) -> str:
        router = self("router").iloc[0]
        steps, T = router.get("steps"), router.get("train_seq_len")
        model = {"smollm2-135m-instruct": "SmolLM2-135M"}.get(str(router.get("model")), str(router.get("model")))
        sched = "" if steps is None or pd.isna(steps) else f"last stage {int(steps)} steps at {int(T)} tokens, "
        rl = FocusConfig.from_json(router["focus_config"]).random_layers or []
        mixed = f", balanced random groups in layers {format_int_list(rl)}" if rl else ""
        return (f"{model}, router-only ({sched}K={int(router.num_groups)}, w={int(router.window)}, "
                f"{int(router.sink_tokens)} sink tokens{mixed})")

    @property
    def setting(self):
        b = self("baselines", per_window=True)
        return (f"{self.routers}, held-out Austen, {b['window'].nunique()} x {int(b.seq_len.iloc[0])} tokens; "
                "[95% paired bootstrap interval over windows]")

    @property
    def soft_setting(self):
        s = self("causal_leak", per_window=True)
        return (f"{self.routers}, held-out Austen, {s['window'].nunique()} x {int(s.seq_len.iloc[0])} tokens "
                "(the soft gate's O(T^2) float bias keeps it at this length); [95% interval over windows]")


def _ci(ch: tuple) -> str:
    """'+1.2% [+0.4, +2.0]' from a ``_Ctx.change`` tuple."""
    return f"{ch[1]:+.1f}% [{ch[2]:+.1f}, {ch[3]:+.1f}]"


MIN_WINDOWS = 4   # fewer windows than this: no verdict, whatever the interval says


def _sign(ch: tuple) -> int:
    """+1 / -1 when the 95% interval lies above / below 0, 0 when it contains 0 or rests on
    fewer than ``MIN_WINDOWS`` windows (no verdict)."""
    if ch[4] < MIN_WINDOWS:
        return 0
    return 1 if ch[2] > 0 else (-1 if ch[3] < 0 else 0)


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
    """[(claim, paper, fn)]: fn() -> (ours, setting, verdict). A perplexity difference is called a
    verdict only when its 95% paired bootstrap interval over windows excludes 0; otherwise the
    verdict says "within noise"."""
    out = []

    def add(claim, paper):
        def deco(fn):
            out.append((claim, paper, fn))
            return fn
        return deco

    @add("GPT-2 124M on PG-19, full fine-tune: Focus vs full attention PPL [abstract]", "30.3 vs 31.4")
    def _():
        d = c.change(("dense", "dense"), ("dense", "dense"), "causal_leak")[0]
        sf = c.change(("focus", "soft"), name="causal_leak")
        return (f"analogue, router-only: soft {sf[0]:.2f} vs dense {d:.2f}: {_ci(sf)}", c.soft_setting,
                f"{NT}: no GPT-2/PG-19 here and full fine-tuning is out of a 2-core CPU's reach")

    @add("7B from scratch, 2B tokens: Focus vs full [abstract]", "13.82 vs 13.89")
    def _():
        return "-", "-", f"{NT}: pretraining a 7B model needs a GPU cluster"

    @add("Pretrained model, top-k inference: Focus PPL below the dense baseline [abstract]", "41.3 vs 42.8 (GPT-2)")
    def _():
        parts, signs = [], []
        t = c("transfer_length", per_window=True)
        for corpus in dict.fromkeys(t.corpus):
            for T in sorted(t[t.corpus == corpus].seq_len.unique())[-2:]:   # the two longest lengths
                ch = [c.change(("focus", f"hard_top{k}"), name="transfer_length", corpus=corpus, seq_len=T)
                      for k in (1, c.k)]
                parts.append(f"{corpus} {T} ({ch[1][4]} windows): top-{c.k} {_ci(ch[1])}, top-1 {_ci(ch[0])}")
                signs.append(_sign(ch[1]))
        verdict = HOLDS if signs and all(x < 0 for x in signs) else \
            (FAILS + f": hard top-{c.k} costs perplexity at every length and corpus here" if signs and all(x > 0 for x in signs)
             else FAILS + " (some cells within noise)")
        return ("; ".join(parts), f"{c.routers}; held-out Persuasion and Hamlet (the length table's windows); "
                "[95% paired bootstrap interval over windows]", verdict)

    @add("Top-k inference is 2x faster [abstract]", "2x")
    def _():
        b = c("baselines")
        T = int(b["seq_len"].iloc[0])
        sp = {k: float(b.loc[(b.method == "focus") & (b.label == f"hard_top{k}"), "speedup"].iloc[0]) for k in (1, c.k)}
        # the evaluation's own timings share the CPU with whatever else runs: they speak only where
        # the dedicated benchmark (patterns interleaved in one run, its load recorded) is absent
        txt = f"end to end at {T} tokens (inside the evaluation): top-1 x{sp[1]:.2f}, top-{c.k} x{sp[c.k]:.2f}"
        best = max(sp.values())
        bd = bench_dir(c.d.parent)
        e = pd.read_csv(bd / "e2e.csv") if bd is not None and (bd / "e2e.csv").is_file() else None
        if e is not None and "phase" in e:
            pre = e[(e.phase == "prefill") & e.pattern.str.startswith("hard_top")]
            txt = "benchmark (analyses/bench_attention.py, shipped routers, bare forward vs dense): prefill " + \
                ", ".join(f"{int(t)}: " + " ".join(f"{p.replace('hard_', '')} x{x:.2f}" for p, x in zip(g.pattern, g.speedup_bare))
                          + f" (window bound x{g.window_bound.iloc[0]:.2f})" for t, g in pre.groupby("tokens"))
            dec = e[(e.phase == "decode") & e.pattern.str.startswith("hard_top")]
            if len(dec):
                t = int(dec.tokens.max())
                d = dec[dec.tokens == t]
                txt += f"; decode at {t} tokens of context: " + ", ".join(
                    f"{p.replace('hard_', '')} x{x:.2f}" for p, x in zip(d.pattern, d.speedup_decode))
            best = max([*pre.speedup_bare.tolist(), *dec.speedup_decode.tolist()])
        return txt, "CPU (2 cores, shared), hard mode through the decomposition", HOLDS if best >= 2 else \
            f"{FAILS} at these lengths on CPU"

    @add("Decomposition: two FlashAttention calls, 8.6x at 1M tokens (K=8) [abstract]", "8.6x")
    def _():
        bd = bench_dir(c.d.parent)
        k = pd.read_csv(bd / "kernel.csv") if bd is not None else c("bench")
        sub = k[(k.K == 8) & (k.k == 1) & (k.groups == "balanced") & k.speedup.notna()]
        if not len(sub):
            return "no K=8 k=1 rows in the benchmark", "-", NT
        r = sub.sort_values("n").iloc[-1]
        txt = f"K=8 k=1 at n={int(r.n):,}: x{r.speedup:.2f} (ideal x{r.ideal_speedup:.2f})"
        setting = "CPU kernel benchmark (analyses/bench_attention.py), balanced groups"
        gpu_name, tables = gpu_kernel_tables(bd)
        for dt, g in tables.items():
            for backend, s in g[(g.K == 8) & (g.k == 1) & (g.groups == "balanced")].groupby("backend"):
                s = s.sort_values("n")
                txt += f"; {gpu_name} {dt} {backend}, n={int(s.n.iloc[-1]):,}: x{s.speedup.iloc[-1]:.2f}"
                setting = f"CPU and {gpu_name} kernel benchmarks (analyses/bench_attention.py), balanced groups"
        return (txt, setting,
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
        verdict = HOLDS if sub.speedup.max() <= 1.1 else f"{FAILS} on CPU (the overhead is small next to CPU attention)"
        names = []
        for gpu_name, tables in gpu_kernel_runs(bd):  # every GPU measured, oldest first
            gpu = {dt: g[(g.n == 4096) & (g.groups == "balanced")] for dt, g in tables.items()}
            gpu = {dt: g for dt, g in gpu.items() if len(g)}
            if not gpu:
                continue
            names.append(gpu_name)
            for dt, g in gpu.items():
                txt += f"; {gpu_name} {dt}: " + ", ".join(f"K={int(r.K)} k={int(r.k)} {r.backend}: x{r.speedup:.2f}"
                                                          for r in g.itertuples())
            holds = all(g.speedup.max() <= 1.0 for g in gpu.values())
            verdict += "; " + (f"{HOLDS.lower()} on the {gpu_name}" if holds else f"{FAILS.lower()} on the {gpu_name}")
        return (f"kernel at 4096 tokens: {txt}", "CPU kernel benchmark" + "".join(f", {n} kernel benchmark" for n in names),
                verdict)

    @add("Centroid-only parameters [abstract]", "148K (GPT-2 124M)")
    def _():
        gpt2 = 12 * (768 * 16 + 4 * 16)
        r = c("router").iloc[0]
        return (f"12 x (768 x 16 + 4 x 16) = {gpt2:,} for GPT-2 (K=4, d_g=16); SmolLM2-135M: {int(r.router_parameters):,}",
                "parameter count of core.Router", HOLDS if abs(gpt2 - 148_000) < 1000 else FAILS)

    @add("Mistral 7B, top-2: PPL cost [notes]", "+0.7")
    def _():
        h = c.change(("focus", f"hard_top{c.k}"))
        d = c.ppl("dense", "dense")
        return (f"analogue on SmolLM2: hard top-{c.k} {h[0] - d:+.2f} PPL ({_ci(h)})", c.setting,
                f"{NT}: no 7B model on this CPU")

    @add("Retrofit baselines (Longformer-style window, Performer, Routing Transformer) lose to Focus [notes]",
         "Performer +75.6 PPL; Focus best")
    def _():
        k = c.k
        b = c("baselines")
        fk = float(b[(b.method == "focus") & (b.label == f"hard_top{k}")].distant_pairs_kept.iloc[0])
        focus = ("focus", f"hard_top{k}")
        parts = [f"Focus top-{k} {c.ppl(*focus):.2f} (keeps {fk:.2f} of distant pairs)"]
        signs = {}
        for m in ("window", "window_matched", "online_kmeans", "kmeans", "random", "moba"):
            if m not in set(b.method):
                continue
            lab, v, kept = ("window", c.ppl("window", "window"), np.nan) if m == "window" else c.matched(m)
            ch = c.change((m, lab), focus)   # the baseline over Focus: > 0 means Focus is better
            signs[m] = _sign(ch)
            short = f"(w={int(b.attention_window.iloc[0])})" if m == "window" else \
                lab.replace("window_matched_", "").replace("hard_", "")
            parts.append(f"{m} {short} {v:.2f}" + ("" if np.isnan(kept) else f" ({kept:.2f})") + f": {_ci(ch)}")
        named = [m for m in ("window", "window_matched", "online_kmeans") if m in signs]
        lost = [m for m in named if signs[m] < 0]
        noise = [m for m in named if signs[m] == 0]
        others = [m for m in ("kmeans", "random", "moba") if m in signs and signs[m] <= 0]
        verdict = (HOLDS if not lost and not noise else
                   f"{FAILS}: {', '.join(lost)} better" if lost else f"{HOLDS} only partly: {', '.join(noise)} within noise")
        if others:
            verdict += f" (not better than {', '.join(others)} beyond noise)"
        return ("; ".join(parts) + " (each: baseline over Focus, > 0 means Focus is better; Performer not implemented)",
                c.setting + "; each baseline at the top-k whose distant pairs kept (in brackets) is closest to Focus's",
                verdict)

    @add("Token-selection baselines (SparQ, MagicPIG) lose 5-10 PPL; Focus gains 6.6 [notes]", "-5..-10 vs +6.6")
    def _():
        lab, v, kept = c.matched("moba")
        ch = c.change(("moba", lab))
        return (f"MoBA block gate {lab.replace('hard_', '')} (keeps {kept:.2f}): {v:.2f}, {_ci(ch)} vs dense",
                c.setting, f"{NT}: SparQ / MagicPIG are not implemented; MoBA (block selection) is the nearest here")

    @add("LoRA at equal budget lowers benchmarks at every LR and rank; Focus keeps TruthfulQA [abstract]",
         "LoRA worse, Focus unchanged")
    def _():
        lora = c("lora")
        parts, lora_worse, focus_better = [], [], []
        la = c.change(("lora", "lora"), ("dense", "dense"), c.lora_rows(on_austen=True))
        parts.append(f"Austen (domain): LoRA {la[0]:.2f} ({_ci(la)})")
        for corpus in ("shakespeare", "python-docs"):
            lo = c.change(("lora", "lora"), ("dense", "dense"), c.lora_rows(on_austen=False), corpus=corpus)
            fh = c.change(("focus", f"hard_top{c.k}"), name="transfer_domain", corpus=corpus)
            parts.append(f"{corpus}: LoRA {_ci(lo)}, Focus hard top-{c.k} {_ci(fh)}")
            lora_worse.append(_sign(lo) > 0)
            focus_better.append(fh[1] <= lo[1])
        r = lora.iloc[0]
        verdict = HOLDS if all(lora_worse) and all(focus_better) else FAILS
        return ("; ".join(parts) + " (PPL change vs the base model on the same windows)",
                f"LoRA r={int(r['rank'])} on q/v ({int(r.lora_parameters):,} params vs router {int(r.router_parameters):,}), "
                f"{int(r.steps)} steps of {int(r.batch_size)} x {int(r.train_seq_len)} tokens, lr {r.lr}, one LR only; "
                f"evaluated at {int(r.seq_len)} tokens; PPL as the benchmark proxy",
                verdict + " (PPL proxy; benchmarks not testable here)")

    @add("Centroid-only training improves domain perplexity with zero downstream degradation [abstract, docs/method.md §3]",
         "domain PPL down, general text unchanged")
    def _():
        sf = c.change(("focus", "soft"), name="causal_leak")
        hd = c.change(("focus", f"hard_top{c.k}"))
        gen = [(corpus, c.change(("focus", f"hard_top{c.k}"), name="transfer_domain", corpus=corpus))
               for corpus in ("shakespeare", "python-docs")]
        txt = (f"held-out Austen: soft {_ci(sf)} at {int(c('causal_leak').seq_len.iloc[0])} tokens, hard top-{c.k} "
               f"{_ci(hd)} at {int(c('baselines').seq_len.iloc[0])}; general text, hard top-{c.k}: "
               + ", ".join(f"{cp} {_ci(g)}" for cp, g in gen))
        domain_down = _sign(sf) < 0 or _sign(hd) < 0
        verdict = HOLDS if domain_down and all(_sign(g) <= 0 for _, g in gen) else \
            (f"{FAILS}: the router does not lower domain PPL" if not domain_down else f"{FAILS}: general text degrades")
        return (txt, c.routers + " (the dense pattern, i.e. the routers switched off, is the base model exactly); "
                "[95% interval over windows]", verdict)

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
                _ablation_setting(c.d), (HOLDS if rng_s <= 0.6 else f"{FAILS} at this short schedule")
                + " (no interval: 2 windows, one seed)")

    @add("Centroids trained at T=1024 transfer to T=8192 [notes]", "transfer")
    def _():
        t = c("transfer_length", per_window=True)
        k = c.k
        parts, verdicts = [], []
        for corpus in dict.fromkeys(t.corpus):
            Ts = sorted(t[t.corpus == corpus].seq_len.unique())
            cells = []
            for T in Ts:
                h = c.change(("focus", f"hard_top{k}"), name="transfer_length", corpus=corpus, seq_len=T)
                r = c.change(("random", f"random_top{k}"), ("focus", f"hard_top{k}"), "transfer_length",
                             corpus=corpus, seq_len=T)
                cells.append((T, h, r))
            parts.append(f"{corpus}: " + "; ".join(f"{T} ({h[4]} w): top-{k} vs dense {_ci(h)}, random over router "
                                                   f"{_ci(r)}" for T, h, r in cells))
            T, h, r = cells[-1]
            verdicts.append(f"{corpus} {T}: router " + {1: "beats", 0: "ties with", -1: "loses to"}[_sign(r)]
                            + " random groups")
        ok = all("beats" in v for v in verdicts)
        return ("; ".join(parts) + " (random over router > 0: the router is better)",
                f"{c.routers}; held-out Persuasion and Hamlet, the length table's windows; [95% interval over windows]",
                (HOLDS if ok else FAILS) + ": " + "; ".join(verdicts))

    @add("The soft gate's Sinkhorn looks ahead; hard inference must be causal [docs/method.md §1 ours]", "(a project question)")
    def _():
        df = c("causal_leak").set_index("variant")["perplexity"]
        full = c.change(("focus", "soft"), name="causal_leak")
        pre = c.change(("focus", "soft_prefix_causal"), ("focus", "soft"), "causal_leak")
        hard = df[f"hard causal top{c.k}"]
        return (f"soft whole-window {full[0]:.2f}, soft prefix-causal {df['soft, prefix-causal Sinkhorn']:.2f} "
                f"({_ci(pre)} over whole-window), hard causal top-{c.k} {hard:.2f}, dense {df['dense']:.2f}",
                c.soft_setting,
                {1: "the look-ahead flatters soft PPL (prefix-causal is worse beyond noise)",
                 0: "no leak beyond noise (prefix-causal soft within the interval)",
                 -1: "prefix-causal soft is better: no leak"}[_sign(pre)])

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

"""The ``focus-lab`` command line: prepare, train, calibrate, soup, eval, record, app, quickstart,
probe passkey. (The figures are the analyses package's own command, ``focus-lab-figures``.)"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="focus-lab: retrofit Focus sparse attention, train routers, record, browse.")

REPO = Path(__file__).resolve().parent.parent
DEFAULT_NAME = "smollm2-austen"
from focus_lab.train.recipes import DEFAULT_RECIPE  # noqa: E402  (light: no torch import)
from focus_lab.method.config import FocusConfig as _FocusConfig, TrainConfig as _TrainConfig  # noqa: E402
from focus_lab.recording.options import RecordOptions as _RecordOptions  # noqa: E402

# the CLI's defaults are the dataclasses' (one place for each default)
_F, _T, _R = _FocusConfig(), _TrainConfig(), _RecordOptions()


from focus_lab.errors import fail as _fail, guard, known_errors as _known_errors  # noqa: E402,F401


def _pattern_context(path, **overrides) -> tuple:
    """(the router file's FocusConfig with ``overrides``, the layers a pattern's rules may name:
    one past its last routed layer), from the file's header alone (``shipped.read_header``): what
    ``parse_patterns`` needs to refuse a bad pattern before the model loads."""
    from focus_lab.hf.shipped import read_header
    h = read_header(path)
    return h["config"].replace(**overrides), max(h["layers"], default=-1) + 1


def _device(device: str) -> str:
    """``hf.models.resolve_device``; a device it refuses exits 2 with its one line."""
    from focus_lab.hf.models import resolve_device
    try:
        return resolve_device(device)
    except ValueError as e:
        _fail(str(e))


def _dtype(dtype: str):
    """``hf.models.resolve_dtype``; a dtype it refuses exits 2 with its one line."""
    from focus_lab.hf.models import resolve_dtype
    try:
        return resolve_dtype(dtype)
    except ValueError as e:
        _fail(str(e))


def _spec(spec: str, option: str, parser=None):
    """A CLI option's spec through one of config's parsers (default ``parse_int_list``; also
    ``parse_random_layers``, ``parse_layer_top_k``): a bad spec exits 2 with one line naming it."""
    from focus_lab.method.config import parse_int_list
    try:
        return (parser or parse_int_list)(spec)
    except ValueError as e:
        _fail(f"{option}: {e}")


RANDOM_LAYERS_OPTION = typer.Option(None, "--random-layers", help="layers routed by balanced random groups "
                                    "instead of the router, e.g. 1-9, or 'none'; default: the router file's "
                                    "(FocusConfig.random_layers, docs/method.md §2.6)")
LAYER_TOP_K_OPTION = typer.Option(None, "--layer-top-k", help="hard patterns: per-layer k overriding the "
                                  "pattern's top_k, e.g. '1-9:0;10-14:2' (0: window and sinks only), or 'none' "
                                  "(top_k in every layer, no per-layer budget); default: the router file's "
                                  "(FocusConfig.layer_top_k, else its top_k_budgets for the asked top_k: the "
                                  "shipped file has one for top-2, docs/method.md §2.7)")

MATCH_SHIFTS_OPTION = typer.Option(None, "--match-shifts", help="hard patterns: also keep the distant pairs "
                                   "(i, j) with ids[j-s] == ids[i] for these shifts, e.g. '0,1' (1: the induction "
                                   "pair), or 'none'; default: the router "
                                   "file's (FocusConfig.match_shifts, docs/method.md §2.8)")


PATTERN_FILE_OPTION = typer.Option(None, "--pattern-file", help="a JSON or YAML file holding the patterns (a list "
                                   "of spellings, or a mapping {label: spelling}), read instead of --patterns")


def _budget_note(cfg, pats: list) -> str:
    """One line naming the hard patterns that run with a per-layer k (the router file's budget for
    their top_k or --layer-top-k; docs/method.md §2.7), '' when every pattern is uniform."""
    from focus_lab.eval.evaluate import pattern_layer_spec
    by_spec: dict[str, list[str]] = {}
    for label, changes in pats:
        if spec := pattern_layer_spec(cfg, changes):
            by_spec.setdefault(spec, []).append(label)
    return "".join(f"per-layer k for {', '.join(labels)}: {spec} (a bare name such as hard_top2 is uniform)\n"
                   for spec, labels in by_spec.items()).rstrip("\n")


def _config_overrides(random_layers: Optional[str], layer_top_k: Optional[str],
                      match_shifts: Optional[str] = None) -> dict:
    """FocusConfig changes from ``--random-layers`` / ``--layer-top-k`` / ``--match-shifts`` (None:
    keep the router file's), for ``load_routers(..., config_overrides=...)``; a bad spec exits 2
    (``_spec``)."""
    from focus_lab.method.config import parse_layer_top_k, parse_match_shifts, parse_random_layers
    out = {}
    if match_shifts is not None:
        out["match_shifts"] = _spec(match_shifts, "--match-shifts", parse_match_shifts)
    if random_layers is not None:
        out["random_layers"] = _spec(random_layers, "--random-layers", parse_random_layers)
    if layer_top_k is not None:
        out["layer_top_k"] = _spec(layer_top_k, "--layer-top-k", parse_layer_top_k)
    return out


def _focus_cfg(num_groups, window, top_k, tau, sinkhorn_iters, router_dim, seed):
    from focus_lab.method.config import FocusConfig
    return FocusConfig(num_groups=num_groups, window=window, top_k=top_k, tau=tau,
                       sinkhorn_iters=sinkhorn_iters, router_dim=router_dim, seed=seed)


def _routers(routers, model_name) -> Path:
    """The router file to use, said once: ``--routers`` or the one shipped for the model."""
    from focus_lab.hf.shipped import resolve_routers
    path = resolve_routers(routers, model_name)
    if routers is None:
        typer.echo(f"using the routers shipped with focus-lab: {path} (pass --routers to use others)")
    return path


def _routers_unless_group_free(routers, model_name, patterns: str, pattern_file) -> Path | None:
    """``_routers``, or None when no router file is given, none ships for the model
    (``shipped.ships``) and every requested pattern uses no groups (``Pattern.uses_groups``:
    dense, window), which run without one. Otherwise as ``_routers``: where no file ships, its
    one-line refusal names ``focus-lab train`` ('all' and 'default' need the file's groups)."""
    from focus_lab.hf.shipped import ships
    from focus_lab.patterns import PatternError, parse_pattern_file, parse_patterns
    if routers is None and not ships(model_name):
        try:
            pats = parse_pattern_file(pattern_file) if pattern_file else parse_patterns(patterns)
        except PatternError:
            pats = None  # 'all', 'default', ... name the router file's groups or rules: refused below
        if pats and not any(p.uses_groups for _, p in pats):
            return None
    return _routers(routers, model_name)


def _load(model_name, corpus, seq_len):
    """(model, tokenizer, corpus, seq_len): seq_len is capped at the model's positions, said once."""
    from focus_lab.data import load_corpus
    from focus_lab.hf.models import load_model
    corp = load_corpus(corpus)
    model, tok = load_model(model_name)
    n_pos = getattr(model.config, "max_position_embeddings", None)
    if n_pos and seq_len > n_pos:
        typer.secho(f"note: --seq-len {seq_len} exceeds the model's {n_pos} positions; the text is "
                    f"split into windows of {n_pos} tokens instead", fg=typer.colors.YELLOW, err=True)
        seq_len = n_pos
    return model, tok, corp, seq_len


def _windows(docs, tok, seq_len: int, max_windows: int, which: str) -> list:
    """``make_windows`` of ``docs``, saying how many fit when fewer than ``max_windows`` do."""
    from focus_lab.data import make_windows
    windows = make_windows(docs, tok, seq_len, max_windows=max_windows)
    if len(windows) < max_windows:
        typer.secho(f"note: the {which} text holds only {len(windows)} windows of {seq_len} tokens "
                    f"({max_windows} requested)", fg=typer.colors.YELLOW, err=True)
    return windows


# ------------------------------------------------------------------------------------------
@app.command()
def prepare(corpus: str = typer.Argument("austen", help="austen | shakespeare | python-docs | kernel-docs | "
                                         "python-source | bible-kjv | man-pages | debian-reference")):
    """Prepare a named corpus into data/ (from locally installed packages; data/README.md)."""
    from focus_lab.data import prepare_corpus
    path = guard(lambda: prepare_corpus(corpus))
    typer.echo(f"prepared {corpus} in {path}")


@app.command()
def train(
    model: Optional[str] = typer.Option(None, help="gemma3-270m, an HF id or a local path; default: embedded SmolLM2-135M"),
    corpus: str = typer.Option("austen", help="corpus name or a local text file / folder"),
    out: Path = typer.Option(Path("checkpoints") / DEFAULT_NAME, help="training directory"),
    steps: int = typer.Option(_T.steps, help="optimizer steps (short schedule; --full for the long one)"),
    full: bool = typer.Option(False, help="full schedule: 1000 steps of 4 x 1024 tokens"),
    seq_len: int = typer.Option(_T.seq_len, help="tokens per training window"),
    batch_size: int = typer.Option(_T.batch_size),
    lr: float = typer.Option(_T.lr),
    checkpoint_every: int = typer.Option(_T.checkpoint_every),
    num_groups: int = typer.Option(_F.num_groups), window: int = typer.Option(_F.window),
    top_k: int = typer.Option(_F.top_k), tau: float = typer.Option(_F.tau),
    sinkhorn_iters: int = typer.Option(_F.sinkhorn_iters),
    router_dim: int = typer.Option(_F.router_dim), seed: int = typer.Option(_F.seed),
    resume: bool = typer.Option(False, help="continue from <out>/checkpoint"),
    recipe: str = typer.Option(DEFAULT_RECIPE, help="training recipe (focus_lab/train/recipes.py; docs/cli.md "
                               "'Router recipes'): sinks64 (default, best measured), paper, calibrated, "
                               "straight_through, anneal, hard_phase, sinks, coverage, ..."),
    sink_tokens: Optional[int] = typer.Option(None, help="first tokens always visible (attention sinks); "
                                              "default: the recipe's (sinks64: 64; paper: 0)"),
    device: str = typer.Option("cpu", help="cpu | cuda (under torchrun: cuda:$LOCAL_RANK)"),
    init_routers: Optional[Path] = typer.Option(None, help="start from this router file (length "
                                                "curriculum: e.g. routers trained at 512, continued at 4096); "
                                                "its seed and random layers carry over"),
    distill_queries: int = typer.Option(_T.distill_queries, help="distill objective: queries sampled per window"),
    distill_copy_share: float = typer.Option(_T.distill_copy_share, help="distill objective: share of the "
                                             "queries drawn from positions whose next token a distant copy "
                                             "predicts (distill.copy_queries)"),
    stop_after: Optional[int] = typer.Option(None, help="end after this many steps; the learning-rate "
                                             "schedule still spans --steps (default: run every step)"),
    random_layers: Optional[str] = typer.Option(None, "--random-layers", help="layers given balanced random "
                                                "groups instead of a router (not trained), e.g. 1-9, or 'none'; "
                                                "default: the --init-routers file's, else none"),
    key_router: bool = typer.Option(False, "--key-router", help="give the key role its own projection "
                                    "(FocusConfig.key_router, docs/method.md §1.6); from a shared "
                                    "--init-routers file it starts as that file's projection"),
    key_shift: bool = typer.Option(False, "--key-shift", help="each key in the group of the token before "
                                   "it (FocusConfig.key_shift, docs/method.md §1.7): the soft gate pairs a "
                                   "query with its key's predecessor; the file keeps the shift for its hard patterns"),
    match_shifts: Optional[str] = typer.Option(None, "--match-shifts", help="train with the token-match "
                                               "pairs kept by rule (e.g. '0,1'; the soft gate gives them bias "
                                               "0, docs/method.md §2.8); the file keeps them for its hard "
                                               "patterns; default: none"),
    gradient_checkpointing: bool = typer.Option(False, "--gradient-checkpointing", help="lm objective: "
                                                "recompute each decoder layer in the backward instead of "
                                                "keeping its activations (the same gradients, for one more "
                                                "forward of each layer; one layer's soft-gate graph in memory)"),
):
    """Train only the routers (frozen base model) on the corpus's training documents."""
    from focus_lab.method.config import TrainConfig, parse_match_shifts, parse_random_layers
    random_list = None if random_layers is None else _spec(random_layers, "--random-layers", parse_random_layers)
    shifts = None if match_shifts is None else _spec(match_shifts, "--match-shifts", parse_match_shifts)

    def run():
        from focus_lab.data import make_windows
        from focus_lab.train.loop import train as train_fn
        if full:
            nonlocal steps, seq_len, batch_size
            steps, seq_len, batch_size = 1000, 1024, 4
        from focus_lab.train.recipes import recipe as get_recipe
        fchanges, tchanges = get_recipe(recipe)
        if sink_tokens is not None:
            fchanges["sink_tokens"] = sink_tokens
        fcfg = _focus_cfg(num_groups, window, top_k, tau, sinkhorn_iters, router_dim, seed)
        fcfg = fcfg.replace(**fchanges, key_router=key_router, key_shift=int(key_shift), match_shifts=shifts)
        tcfg = TrainConfig(steps=steps, seq_len=seq_len, batch_size=batch_size, lr=lr,
                           checkpoint_every=checkpoint_every, seed=seed,
                           init_routers=str(init_routers) if init_routers else None,
                           distill_queries=distill_queries, distill_copy_share=distill_copy_share,
                           stop_after=stop_after, gradient_checkpointing=gradient_checkpointing,
                           random_layers=random_list, **tchanges)
        dev = _device(device)
        m, tok, corp, seq_len = _load(model, corpus, seq_len)
        m.to(dev)
        windows = make_windows(corp.train, tok, seq_len)
        names = [d.name for d in corp.train]
        shown = ", ".join(names[:8]) + (f", and {len(names) - 8} more" if len(names) > 8 else "")
        typer.echo(f"training routers on {len(windows)} windows of {seq_len} tokens "
                   f"({corp.name}, {len(names)} documents: {shown})")
        res = train_fn(m, windows, fcfg, tcfg, out, resume=resume,
                       meta={"model": m.config._name_or_path, "corpus": corp.name, "recipe": recipe})
        unit = {"lm": "nats/token",
                "coverage": "(coverage loss: share of distant dense attention dropped)",
                "distill": "(distillation loss: relative squared error of the layer outputs)"}.get(tcfg.objective, "")
        typer.echo(f"trained {res.router_parameters} router parameters for {res.steps} steps in "
                   f"{res.seconds:.0f} s ({res.tokens_per_second:.0f} tokens/s); mean loss of the first/last 5 steps "
                   f"{res.first_loss:.4f} -> {res.last_loss:.4f} {unit}; routers: "
                   f"{out / 'routers.safetensors'}")
        return res
    return guard(run)


@app.command()
def calibrate(
    routers_opt: Optional[Path] = typer.Option(None, "--routers", help="router file to re-calibrate; default: "
                                               "the routers shipped with focus-lab for the model"),
    model: Optional[str] = typer.Option(None), corpus: str = typer.Option("austen"),
    seq_len: int = typer.Option(4096, help="the target length (tokens per window)"),
    max_windows: int = typer.Option(4, help="training windows at the target length (forward passes only)"),
    out: Path = typer.Option(Path("checkpoints") / "calibrated" / "routers.safetensors",
                             help="router file to write (the input is never overwritten)"),
):
    """Re-calibrate the routers' per-group bias at a target length: forward passes only, no gradient."""
    def run():
        nonlocal seq_len
        from focus_lab.train.calibrate import calibrate_bias
        from focus_lab.hf.retrofit import load_routers, read_router_file, save_routers
        routers = _routers(routers_opt, model)
        if out.resolve() == routers.resolve():
            _fail(f"--out {out} is the input router file; choose another path")
        extra = read_router_file(routers)[3]
        m, tok, corp, seq_len = _load(model, corpus, seq_len)
        load_routers(m, routers)
        windows = _windows(corp.train, tok, seq_len, max_windows, "training")
        typer.echo(f"calibrating the group bias on {len(windows)} training windows of {seq_len} tokens "
                   f"({corp.name})")
        t0 = time.perf_counter()
        calibrate_bias(m, windows)
        dt = time.perf_counter() - t0
        save_routers(m, out, extra={**extra, "calibrated": {"from": str(routers), "corpus": corp.name,
                                                            "seq_len": seq_len, "windows": len(windows),
                                                            "seconds": round(dt, 1)}})
        typer.echo(f"calibrated in {dt:.0f} s; routers: {out}")
        return out
    return guard(run)


@app.command()
def soup(
    files: list[Path] = typer.Argument(..., help="two or more router files of one base model and one config"),
    weights: Optional[str] = typer.Option(None, help="one weight per file, comma-separated (normalized); "
                                          "default equal weights"),
    out: Path = typer.Option(..., help="router file to write"),
):
    """Average router files tensor by tensor (a model soup), e.g. a file and the same file trained further."""
    def run():
        from focus_lab.hf.retrofit import soup_router_files
        w = _spec(weights, "--weights", lambda v: [float(x) for x in v.split(",")]) if weights else None
        soup_router_files(files, out, w)
        typer.echo(f"averaged {len(files)} router files; routers: {out}")
        return out
    return guard(run)


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether the option ``name`` (its Python name) was given, not left at its default."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


@app.command("eval")
def eval_cmd(
    ctx: typer.Context,
    run_dir: Optional[Path] = typer.Option(None, "--run", help="evaluate the windows recorded in this run "
                                           "directory, with its model and router file, and write the table into "
                                           "the run (eval.parquet; docs/run_schema.md); only --patterns and "
                                           "--max-windows (the run's first N windows) apply"),
    routers_opt: Optional[Path] = typer.Option(None, "--routers", help="router file; default: the routers shipped "
                                           "with focus-lab for the model (focus_lab/routers/); where none ships, "
                                           "dense and window run without one"),
    model: Optional[str] = typer.Option(None), corpus: str = typer.Option("austen"),
    seq_len: int = typer.Option(512), max_windows: int = typer.Option(8, help="held-out windows (with --run: the "
                                                                     "run's first N; default every recorded one)"),
    out: Optional[Path] = typer.Option(None, help="parquet output; default next to the routers"),
    random_groups: bool = typer.Option(False, help="control: random groups instead of the router"),
    random_layers: Optional[str] = RANDOM_LAYERS_OPTION,
    layer_top_k: Optional[str] = LAYER_TOP_K_OPTION,
    match_shifts: Optional[str] = MATCH_SHIFTS_OPTION,
    patterns: str = typer.Option("all", help="comma list of dense, window, soft, hard_topK, random_topK, "
                                 "shuffled_topK (controls at equal sparsity), or 'all' (dense, window, "
                                 "soft, hard_top1..K); e.g. dense,window,hard_top1,hard_top2,random_top2,shuffled_top2; "
                                 "rules added with '+', e.g. hard_top2+capacity(0.5,layers=[13-16],evict); "
                                 "'default': the router file's own rules (docs/api.md, Patterns)"),
    pattern_file: Optional[Path] = PATTERN_FILE_OPTION,
    device: str = typer.Option("cpu", help="cpu | cuda | cuda:N: where the model runs (hard mode on a GPU: "
                               "docs/method.md §4)"),
    dtype: str = typer.Option("fp32", help="fp32 | bf16 | fp16: the model's weights and activations (the routers "
                              "score in fp32 either way); on a GPU, bf16/fp16 hard top-2 runs through "
                              "FlexAttention (docs/method.md §4)"),
):
    """Held-out perplexity of the chosen patterns on the same windows (controls included); with --run, of a
    recorded run's windows, written into the run."""
    torch_dtype = _dtype(dtype)
    if run_dir is not None:
        given = [f"--{n.replace('_opt', '').replace('_', '-')}" for n in
                 ("routers_opt", "model", "corpus", "seq_len", "out", "random_groups", "random_layers", "layer_top_k",
                  "match_shifts", "device", "dtype")
                 if _given(ctx, n)]
        if given:
            _fail(f"--run takes the model, router file and windows from the run: drop {', '.join(given)}")
        limit = max_windows if _given(ctx, "max_windows") else None
        if limit is not None and limit < 1:
            _fail(f"--max-windows {limit}: at least one window")
        return guard(lambda: _eval_run(run_dir, patterns, limit, pattern_file))

    def run():
        nonlocal seq_len
        from focus_lab.eval.evaluate import evaluate, parse_patterns
        from focus_lab.hf.shipped import router_columns
        from focus_lab.io import write_parquet
        from focus_lab.hf.retrofit import attach, load_routers
        routers = _routers_unless_group_free(routers_opt, model, patterns, pattern_file)
        overrides = {"assignment": "random"} if random_groups else {}
        overrides.update(_config_overrides(random_layers, layer_top_k, match_shifts))
        # the file's rules (reached through 'default'), as the options change them; fail before loading
        shape = {k: v for k, v in overrides.items() if k != "assignment"}
        cfg0, layers = _pattern_context(routers, **shape) if routers is not None else (_F.replace(**shape), None)
        pats = parse_patterns(patterns, cfg0, pattern_file, layers)
        dev = _device(device)
        m, tok, corp, seq_len = _load(model, corpus, seq_len)
        if routers is None:  # dense / window only: no router acts, so untrained ones stand in
            attach(m, cfg := _F.replace(**overrides))
            typer.echo(f"no router file ships for model {model!r}; {', '.join(lab for lab, _ in pats)} use no "
                       f"groups and run without one (window {cfg.window} tokens, {cfg.sink_tokens} sink tokens: "
                       "the FocusConfig defaults)")
        else:
            cfg = load_routers(m, routers, config_overrides=overrides or None)
        m.to(dev, dtype=torch_dtype)
        if random_groups:
            pats = [(lab, {**c, "assignment": "random"} if c.get("assignment") == "router" else c)
                    for lab, c in pats]
        windows = _windows(corp.heldout, tok, seq_len, max_windows, "held-out")
        typer.echo(f"evaluating {len(pats)} patterns on {len(windows)} held-out windows of {seq_len} tokens "
                   f"({', '.join(d.name for d in corp.heldout)})" + ("" if dtype == "fp32" else f", model in {dtype}"))
        if note := _budget_note(cfg, pats):
            typer.echo(note)
        if cfg.key_shift:
            typer.echo("the router file puts keys in the group of the token before them (key_shift, "
                       "docs/method.md §1.7): 'default' keeps it, a bare name such as hard_top2 does not")
        if cfg.match_shifts:
            typer.echo(f"the router file's token-match pairs, shifts {cfg.match_shifts} (docs/method.md §2.8): "
                       "'default' keeps them, a bare name such as hard_top2 does not")
        df = evaluate(m, windows, pats).assign(**router_columns(routers))
        target = out or (routers.parent / "eval.parquet" if routers_opt is not None
                         else Path("eval") / f"{corp.name}_{seq_len}.parquet")
        write_parquet(target, df)
        show = df[["label", "perplexity", "nll", "distant_pairs_kept", "tokens_per_second"]]
        typer.echo(show.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
        typer.echo(f"wrote {target}")
        return df
    return guard(run)


def _run_router_file(run, manifest: dict) -> Path:
    """The router file a run was recorded with (manifest ``routers``: a relative path is taken
    from the working directory), checked against the recorded sha256; RunError otherwise."""
    from focus_lab.io import file_sha256
    from focus_lab.runs import RunError
    entry = manifest.get("routers") or {}
    if not entry.get("path"):
        raise RunError(f"run {run.path} names no router file (manifest 'routers.path'); record it again")
    path = Path(entry["path"])
    if not path.is_file():
        raise RunError(f"run {run.path} was recorded with the router file {path}, which is missing here; "
                       "record the run again with 'focus-lab record --routers <file>'")
    if entry.get("sha256") and file_sha256(path) != entry["sha256"]:
        raise RunError(f"the router file {path} changed since run {run.path} was recorded (sha256 "
                       f"{file_sha256(path)[:12]}, recorded {str(entry['sha256'])[:12]}); record the run again")
    return path


@dataclasses.dataclass
class _RecordedWindow:
    """A window read back from a run's tokens table: what ``evaluate`` needs of ``data.Window``."""

    doc: str
    index: int  # the run's window number (tokens.window)
    input_ids: "torch.Tensor"  # (T,) int64


def _eval_run(run_dir: Path, patterns: str, max_windows: int | None, pattern_file: Path | None = None
              ) -> "pd.DataFrame":
    """``focus-lab eval --run``: the perplexity of ``patterns`` on the run's recorded windows
    (``Run.window_token_ids``; the first ``max_windows`` of them when given), with the run's
    model (manifest ``model.name``, checked by config and embedding sha256) and router file
    (``_run_router_file``), written into the run as its ``eval`` table (``runs.write_table``)
    with the manifest entry ``eval``: patterns, windows, tokens per window, seconds, command,
    router sha256, created (UTC). Raises RunError / ModelLoadError / RouterMismatchError."""
    import datetime as dt
    import torch
    from focus_lab.eval.evaluate import evaluate, parse_patterns
    from focus_lab.hf.models import load_model
    from focus_lab.hf.retrofit import load_routers, model_identity
    from focus_lab.runs import Run, RunError, write_table
    run = Run.open(run_dir)
    mf = run.manifest
    routers = _run_router_file(run, mf)
    cfg0, layers = _pattern_context(routers)
    pats = parse_patterns(patterns, cfg0, pattern_file, layers)  # fail before loading
    ids = run.window_token_ids()
    chosen = sorted(ids)[:max_windows] if max_windows else sorted(ids)
    if not chosen:
        raise RunError(f"run {run.path} has no recorded windows to evaluate")
    recorded = mf.get("model") if isinstance(mf.get("model"), dict) else {}
    m, _ = load_model(recorded.get("name") or None)
    here = model_identity(m)
    for key in ("config_sha256", "embedding_sha256"):
        if recorded.get(key) and recorded[key] != here[key]:
            raise RunError(f"the model {recorded.get('name')!r} loaded here is not the one run {run.path} was "
                           f"recorded with ({key} {here[key][:12]}, recorded {recorded[key][:12]}); record it again")
    cfg = load_routers(m, routers)
    docs = run.columns("tokens", ["window", "doc"]).drop_duplicates("window").set_index("window")["doc"]
    windows = [_RecordedWindow(str(docs[w]), w, torch.tensor(ids[w])) for w in chosen]
    T = len(ids[chosen[0]])
    typer.echo(f"evaluating {len(pats)} patterns on {len(windows)} recorded window{'s' * (len(windows) != 1)} "
               f"of {T} tokens of run "
               f"{run.path} ({', '.join(sorted(set(docs[chosen])))})")
    if note := _budget_note(cfg, pats):
        typer.echo(note)
    t0 = time.perf_counter()
    from focus_lab.hf.shipped import router_columns
    df = evaluate(m, windows, pats).assign(**router_columns(routers))
    seconds = time.perf_counter() - t0
    entry = {"patterns": [lab for lab, _ in pats], "windows": chosen, "seq_len": T,
             "seconds": round(seconds, 1),
             "command": f"focus-lab eval --run {run_dir} --patterns {patterns}"
                        + (f" --max-windows {max_windows}" if max_windows else ""),
             "routers_sha256": (mf.get("routers") or {}).get("sha256"),
             "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    target = write_table(run.path, "eval", df, entry)
    show = df[["label", "perplexity", "nll", "distant_pairs_kept", "tokens_per_second"]]
    typer.echo(show.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    typer.echo(f"wrote {target} ({len(windows)} window{'s' * (len(windows) != 1)} x {T} tokens, {seconds:.0f} s)")
    return df


RECORD_HELP = (
    "Record held-out text through Focus into a run directory (schema: docs/run_schema.md).\n\n"
    "Before loading anything heavy, the peak memory is estimated from the length, windows, layers, heads, "
    "metrics and --pattern maps (focus_lab.recording.recorder.estimate_memory, docs/reliability.md); a recording that "
    "would not fit is refused with exit code 2 and nothing written: one line naming the estimate, the "
    "available memory and the options that lower it (--layers, --heads, --seq-len, --max-windows, "
    "--no-per-query, fewer --pattern). --memory-limit GIB sets the limit.")


@app.command(help=RECORD_HELP)
def record(
    routers_opt: Optional[Path] = typer.Option(None, "--routers", help="router file; default: the routers shipped "
                                           "with focus-lab for the model (focus_lab/routers/)"),
    model: Optional[str] = typer.Option(None), corpus: str = typer.Option("austen"),
    out: Path = typer.Option(Path("runs") / DEFAULT_NAME, help="run directory to write"),
    seq_len: int = typer.Option(512), max_windows: int = typer.Option(4),
    pos: bool = typer.Option(True, help="join spaCy POS / dependency labels"),
    mode: str = typer.Option("dense", help="attention mode of the recorded forward: dense (the "
                             "pretrained model's own attention, audited against the Focus masks), "
                             "hard or soft (the Focus model's)"),
    metrics: str = typer.Option("default", help="comma list of assignments, balance, coverage, crossing, "
                                "dropped_edges, linguistics, loss_delta (per-token loss dense vs hard: two "
                                "extra forwards per window; with dropped_edges also the costly_drops "
                                "table), output_error (each mask's relative attention-output error per layer "
                                "and head); 'default': all but output_error; 'all'"),
    layers: Optional[str] = typer.Option(None, help="layers to record, e.g. '0,5,10-12' (default: all)"),
    heads: Optional[str] = typer.Option(None, help="query heads to record, e.g. '0-3' (default: all)"),
    pattern: Optional[list[str]] = typer.Option(None, help="LAYER:HEAD whose full T x T maps are "
                                                "kept (repeatable)"),
    edge_threshold: float = typer.Option(_R.edge_threshold, help="dropped-edge audit: dense weight above "
                                         "which a dropped edge is kept"),
    edge_top_n: int = typer.Option(_R.edge_top_n, help="also keep each query's n heaviest dropped edges ..."),
    edge_min_weight: float = typer.Option(_R.edge_min_weight, help="... when their weight exceeds this"),
    sink_positions: int = typer.Option(_R.sink_positions, help="first key positions reported as attention "
                                       "sinks"),
    per_query: bool = typer.Option(_R.per_query, help="write the per-query tables (coverage_query, "
                                   "crossing_query)"),
    costly_top_n: int = typer.Option(_R.costly_top_n, help="costly_drops: keep the dropped edges of the n "
                                     "queries whose loss delta (hard minus dense, nats) is largest"),
    memory_limit: Optional[float] = typer.Option(None, metavar="GIB", help="refuse (exit 2, nothing written) when "
                                                 "the estimated peak memory exceeds this many GiB; default: the "
                                                 "available memory plus what this process holds"),
):
    """Record held-out text through Focus into a run directory (help: ``RECORD_HELP``)."""
    def ints(spec):
        return None if spec is None else _spec(spec, "--layers / --heads / --pattern")

    def run():
        nonlocal seq_len
        import pandas as pd
        from focus_lab.data import make_windows
        from focus_lab.io import file_sha256
        from focus_lab.recording.recorder import ALL_METRICS, DEFAULT_METRICS, GiB, RecordMemoryError, record_run
        from focus_lab.hf.retrofit import load_routers
        routers = _routers(routers_opt, model)
        named = {"all": ALL_METRICS, "default": DEFAULT_METRICS}
        chosen = named.get(metrics.strip()) or tuple(x.strip() for x in metrics.split(",") if x.strip())
        bad = [x for x in chosen if x not in ALL_METRICS]
        if bad:
            _fail(f"unknown metrics {bad}; choose from {', '.join(ALL_METRICS)}, 'default' or 'all'")
        if mode not in ("dense", "hard", "soft"):
            _fail(f"--mode {mode!r}: choose dense, hard or soft")
        pats = []
        for p in pattern or []:
            lh = ints(p.replace(":", ","))
            if len(lh) != 2:
                _fail(f"--pattern {p!r}: write LAYER:HEAD, e.g. 3:0")
            pats.append((lh[0], lh[1]))
        if memory_limit is not None and not memory_limit > 0:
            _fail(f"--memory-limit {memory_limit}: give a positive number of GiB")
        limit = None if memory_limit is None else memory_limit * GiB
        chosen_layers, chosen_heads = ints(layers), ints(heads)
        _record_memory_preflight(model, routers, seq_len, max_windows, chosen, chosen_layers, chosen_heads,
                                 len(pats), pos, mode, per_query, edge_top_n, limit)
        m, tok, corp, seq_len = _load(model, corpus, seq_len)
        loaded = load_routers(m, routers, config_overrides={"mode": mode})
        windows = make_windows(corp.heldout, tok, seq_len, max_windows=max_windows)
        extra = {}
        for name in ("eval", "train_log"):
            p = routers.parent / f"{name}.parquet"
            if p.is_file():
                extra[name] = pd.read_parquet(p)
        sha = file_sha256(routers)
        shipped = _shipped_provenance(sha)
        meta = {"corpus": {"name": corp.name, "heldout": [d.name for d in corp.heldout],
                           "train": [d.name for d in corp.train]},
                "routers": {"path": str(routers), "sha256": sha, **({"shipped": shipped} if shipped else {}),
                            **_router_record(sha, loaded)}}
        if extra:  # where the copied tables come from (the eval table: the router file's own windows)
            meta["copied_tables"] = {name: str(routers.parent / f"{name}.parquet") for name in extra}
        typer.echo(f"recording {len(windows)} held-out windows of {seq_len} tokens in {mode} mode "
                   f"(metrics: {', '.join(chosen)})")
        try:
            record_run(m, tok, windows, {d.name: d.text for d in corp.heldout}, out, meta=meta,
                       with_pos=pos, extra_tables=extra, metrics=chosen, layers=chosen_layers,
                       heads=chosen_heads, patterns=pats, edge_threshold=edge_threshold,
                       edge_top_n=edge_top_n, edge_min_weight=edge_min_weight,
                       sink_positions=sink_positions, per_query=per_query, costly_top_n=costly_top_n,
                       memory_limit=limit)
        except (ValueError, RecordMemoryError) as e:  # bad layers / heads / patterns, too big: one line
            _fail(str(e))
        typer.echo(f"recorded {len(windows)} windows into {out}")
        return out
    return guard(run)


def _router_record(sha256: str, config) -> dict:
    """What a run's manifest records of its router file beside path and sha256: its manifest
    ``name`` (None when unlisted), the ``hard_pattern`` the recording's hard masks run (the file's
    rules at its top_k, ``Pattern.from_config``) and the code's ``commit``."""
    from focus_lab.hf.shipped import code_commit, named_file
    from focus_lab.patterns import Pattern
    return {"name": named_file(sha256), "hard_pattern": str(Pattern.from_config(config, mode="hard")),
            "commit": code_commit()}


def _shipped_provenance(sha256: str) -> dict | None:
    """The shipped router file whose sha256 is ``sha256``, as ``{"model": name, **its entry}`` of
    ``focus_lab/routers/MANIFEST.json`` (file, sha256, bytes, command, data, from_scratch, ...);
    None for any other file. Recorded in a run's manifest as ``routers.shipped``, so the run
    keeps its routers' provenance after another file ships."""
    from focus_lab.hf.shipped import manifest
    for name, entry in manifest().items():
        if entry.get("sha256") == sha256:
            return {"model": name, **entry}
    return None


def _record_memory_preflight(model_name, routers: Path, seq_len: int, max_windows: int, metrics, layers, heads,
                             patterns: int, pos: bool, mode: str, per_query: bool, edge_top_n: int,
                             limit: float | None) -> None:
    """Refuse (exit 2, one line) a recording whose estimated peak memory exceeds ``limit`` bytes
    (None: the available memory + this process's), before the model, corpus or spaCy load: the
    model's config and parameter count come from ``models.peek_model`` (skipped when it cannot
    tell: ``record_run`` checks again after loading), T is ``seq_len`` capped at the model's
    positions, W = ``max_windows`` (an upper bound: the text may hold fewer)."""
    from focus_lab.hf.models import peek_model
    from focus_lab.recording.recorder import ModelShape, RecordMemoryError, check_memory, estimate_memory
    from focus_lab.hf.retrofit import read_router_file
    peek = peek_model(model_name)
    if peek is None:
        return
    config, param_bytes = peek
    fcfg, _, tensors, _ = read_router_file(routers)
    routed = {k.split(".")[1] for k in tensors if k.startswith("layers.")}
    n_pos = getattr(config, "max_position_embeddings", None)
    T = min(seq_len, n_pos) if n_pos else seq_len
    L = len(set(layers)) if layers is not None else len(routed)
    H = len(set(heads)) if heads is not None else int(config.num_attention_heads)
    est = estimate_memory(ModelShape.from_config(config, param_bytes), T, max_windows, L, H, metrics=metrics,
                          patterns=patterns, per_query=per_query, with_pos=pos, mode=mode,
                          num_groups=fcfg.num_groups, top_k=fcfg.top_k, edge_top_n=edge_top_n)
    try:
        check_memory(est, limit, what=f"{max_windows} windows x {T} tokens, {L} layers x {H} heads")
    except RecordMemoryError as e:
        _fail(str(e))


def _app_command(runs: Path, host: str, port: int) -> list[str]:
    """The command line that serves the dashboard: Streamlit runs ``main.py`` of the installed
    package ``focus_lab.app`` (the repository's ``app/`` folder) over the runs root ``runs``."""
    import importlib.util
    main = Path(importlib.util.find_spec("focus_lab.app").origin).parent / "main.py"
    return [sys.executable, "-m", "streamlit", "run", str(main),
            "--server.address", host, "--server.port", str(port), "--server.headless", "true",
            "--browser.gatherUsageStats", "false", "--", "--runs", str(runs.resolve())]


@app.command("app")
def app_cmd(runs: Path = typer.Option(Path("runs"), help="runs root folder"),
            host: str = typer.Option("127.0.0.1"), port: int = typer.Option(8501)):
    """Start the Streamlit dashboard over a runs folder (bound to 127.0.0.1 by default)."""
    if not runs.is_dir():
        _fail(f"runs folder {runs} does not exist; record a run with 'focus-lab record'")
    typer.echo(f"dashboard: http://{host}:{port}  (runs: {runs.resolve()}; Ctrl-C stops it)")
    os.execv(sys.executable, _app_command(runs, host, port))


def _invoke(*args: str) -> int:
    """Run one of this CLI's commands in a fresh Python process, exactly as from a shell
    (``python -m focus_lab ARGS``): each step of the main job holds only its own memory, so the
    job's peak RSS is its largest step's, not that step plus the heap an earlier step left behind
    (measured at 4096 tokens: eval then record in one process 5.61 GiB, record alone 4.87 GiB).
    Returns the step's peak resident set size in bytes (``ru_maxrss`` of the child, from
    ``os.wait4``). Raises typer.Exit with the step's exit code when it fails."""
    proc = subprocess.Popen([sys.executable, "-m", "focus_lab", *args])
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except KeyboardInterrupt:
        proc.kill()
        raise
    proc.returncode = rc = os.waitstatus_to_exitcode(status)
    if rc != 0:
        raise typer.Exit(rc)
    return usage.ru_maxrss * 1024  # Linux reports KiB


QUICKSTART_PATTERNS = "dense,window,default_top1,default,random_default"


def _report_recorded_perplexity(run_dir: Path) -> None:
    """Print dense and hard perplexity over every recorded window, from the run's ``loss_delta``
    table (``exp`` of the mean next-token NLL in nats; docs/run_schema.md), at no extra forward."""
    import math
    from focus_lab.runs import Run
    run = Run.open(run_dir)
    if not run.has("loss_delta"):
        return
    ld = run.loss_delta
    k = run.config.get("top_k")
    typer.echo(f"recorded run, {run.manifest['windows']} windows ({len(ld)} predicted tokens): perplexity "
               f"dense {math.exp(ld.nll_dense.mean()):.3f}, hard top-{k} {math.exp(ld.nll_hard.mean()):.3f} "
               f"({100 * (math.exp(ld.nll_hard.mean() - ld.nll_dense.mean()) - 1):+.1f}%)")


def _parse_stage_times(specs: list[str]) -> list[tuple[str, float, float | None]]:
    """``--stage-time NAME=SECONDS[/PEAK_GIB]`` values as [(name, seconds, peak bytes or None)] in
    the given order; one error line (exit 2) for a malformed one."""
    out = []
    for spec in specs:
        name, _, value = spec.partition("=")
        secs, _, peak = value.partition("/")
        try:
            seconds, peak_gib = float(secs), (float(peak) if peak else None)
        except ValueError:
            seconds, peak_gib = -1.0, None
        if not name.strip() or not seconds >= 0 or (peak_gib is not None and not peak_gib >= 0):
            _fail(f"--stage-time {spec!r}: write NAME=SECONDS or NAME=SECONDS/PEAK_GIB, e.g. setup=12.5/0.4")
        out.append((name.strip(), seconds, None if peak_gib is None else peak_gib * 2**30))
    return out


def stage_times_table(stages: list[tuple[str, float, float | None]], total: float) -> str:
    """The stage lines the main job prints at its end: one line per (stage, seconds, peak RSS in
    bytes or None), then the total (seconds; also in minutes from 60 s on) with the job's peak, the
    largest stage's, and which stage it is; aligned. GiB = 2^30 bytes."""
    def fmt(x: float) -> str:
        return f"{x:6.0f} s" + (f"  ({int(x // 60)} min {x % 60:02.0f} s)" if x >= 60 else "").ljust(16)

    def mem(b: float | None) -> str:
        return "" if b is None else f"  peak {b / 2**30:5.2f} GiB"
    width = max(len(n) for n, *_ in [*stages, ("total", 0)])
    lines = [f"  {n:<{width}} {fmt(x)}{mem(b)}".rstrip() for n, x, b in stages]
    known = [(b, n) for n, _, b in stages if b is not None]
    top = f"{mem(max(known)[0])} ({max(known)[1]})" if known else ""
    return "\n".join(lines + [f"  {'total':<{width}} {fmt(total)}{top}".rstrip()])


@app.command()
def quickstart(
    train_routers: bool = typer.Option(False, "--train", help="train new routers first (the shipped ones "
                                       "are used otherwise)"),
    steps: int = typer.Option(_T.steps), full: bool = typer.Option(False, help="full training schedule"),
    seq_len: int = typer.Option(4096, help="tokens per recorded and evaluated window"),
    record_windows: int = typer.Option(4, help="held-out windows recorded for the dashboard"),
    eval_windows: int = typer.Option(1, help="the perplexity table is of the first N recorded windows "
                                     "(one forward per window and pattern)"),
    eval_patterns: str = typer.Option(QUICKSTART_PATTERNS, help="attention patterns of the perplexity table "
                                      "(as focus-lab eval --patterns)"),
    serve: bool = typer.Option(True, help="start the dashboard at the end"),
    port: int = typer.Option(8501),
    model: Optional[str] = typer.Option(None, help="gemma3-270m: the main job on Gemma-3-270M with its shipped routers "
                                        "(runs/gemma3-austen; --train runs its chain, focus-lab routers build "
                                        "--model gemma3-270m); default: the embedded SmolLM2-135M"),
    stage_time: Optional[list[str]] = typer.Option(None, hidden=True, help="NAME=SECONDS[/PEAK_GIB] of a stage run before "
                                                   "this command (scripts/quickstart.sh: setup, prepare), "
                                                   "listed first in the stage times"),
):
    """The main job on the embedded defaults: (train ->) record -> eval of the recorded windows -> dashboard."""
    stages = _parse_stage_times(stage_time or [])
    before = sum(x for _, x, _ in stages)  # the stages run before this command
    if eval_windows < 1:
        _fail(f"--eval-windows {eval_windows}: at least one window")
    from focus_lab.hf.models import EMBEDDED, GEMMA3, GEMMA3_ALIASES
    gemma = model in GEMMA3_ALIASES
    if model not in (None, EMBEDDED) and not gemma:
        _fail(f"--model {model!r}: the main job runs on the embedded SmolLM2-135M or on {GEMMA3}; for another "
              "model train routers with 'focus-lab train --model ...' and run record / eval yourself")
    t0 = time.perf_counter()
    name = "gemma3-austen" if gemma else DEFAULT_NAME
    run_dir = Path("runs") / name
    model_args = ["--model", GEMMA3] if gemma else []

    def step(name: str, *args: str) -> None:
        t = time.perf_counter()
        peak = _invoke(*args)
        stages.append((name, time.perf_counter() - t, peak))

    routers: list[str] = []
    if train_routers and gemma:
        chain_dir = Path("checkpoints") / "gemma3_chain"
        typer.secho(f"[1/4] train routers (Gemma-3-270M's chain into {chain_dir}: Austen, Persuasion held out)", bold=True)
        step("train", "routers", "build", "--model", GEMMA3, "--out", str(chain_dir))
        routers = ["--routers", str(chain_dir / "routers.safetensors")]
    elif train_routers:
        ckpt = str(Path("checkpoints") / DEFAULT_NAME / "routers.safetensors")
        typer.secho("[1/4] train routers (SmolLM2-135M, Austen: 5 novels train, Persuasion held out)", bold=True)
        step("train", "train", "--steps", str(steps), *(["--full"] if full else []))
        routers = ["--routers", ckpt]
    else:
        typer.secho("[1/4] routers: the ones shipped with focus-lab (--train trains new ones)", bold=True)
    typer.secho(f"[2/4] record {record_windows} x {seq_len} tokens into {run_dir}", bold=True)
    step("record", "record", *model_args, *routers, "--seq-len", str(seq_len), "--max-windows", str(record_windows),
         "--out", str(run_dir))
    _report_recorded_perplexity(run_dir)
    n_eval = min(record_windows, eval_windows)
    typer.secho(f"[3/4] held-out perplexity of {n_eval} of the recorded windows ({seq_len} tokens each), "
                f"written into the run", bold=True)
    step("eval", "eval", "--run", str(run_dir), "--patterns", eval_patterns, "--max-windows", str(eval_windows))
    main_job = time.perf_counter() - t0
    typer.secho(f"main job done in {main_job:.0f} s; stage times and peak memory (RSS of the stage's "
                "largest process) on this machine:", bold=True)
    typer.echo(stage_times_table(stages, before + main_job))
    if serve:
        typer.secho("[4/4] dashboard", bold=True)
        app_cmd(runs=Path("runs"), host="127.0.0.1", port=port)


@app.command(hidden=True, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def figures(ctx: typer.Context):
    """Not a command of the library: the figures are the analyses package's ``focus-lab-figures``."""
    _fail("the figures are made by the analyses package's own command: "
          f"focus-lab-figures {' '.join(ctx.args)}".rstrip() + " (focus-lab-figures --help lists its options)")


# ------------------------------------------------------------------------------------------
routers_app = typer.Typer(add_completion=False, no_args_is_help=True,
                          help="The router files focus-lab knows by name (focus_lab/routers/MANIFEST.json).")
app.add_typer(routers_app, name="routers")


@routers_app.command("list")
def routers_list():
    """Every router file the manifest names: model, sha256, whether the package ships it, default pattern."""
    from focus_lab.hf.shipped import registry
    reg = registry()
    shipped = {v: k for k, v in reg.get("shipped", {}).items()}
    for name, f in sorted(reg.get("files", {}).items()):
        where = f"shipped for {shipped[name]}" if name in shipped else ("in the package" if f.get("file") else "not tracked")
        typer.echo(f"{name:<40} {f['sha256'][:12]}  {where:<36} default: {f.get('default_pattern', '?')}")


@routers_app.command("show")
def routers_show(target: str = typer.Argument("shipped", help="a manifest name, 'shipped' or a router file's path")):
    """What a router file holds: layers, groups, the rules of its default and named patterns, its provenance."""
    def run():
        from focus_lab.hf.shipped import lineage, named_file, read_header, registry, router_path
        from focus_lab.io import file_sha256
        from focus_lab.method.config import format_int_list
        from focus_lab.patterns import Pattern
        files = registry().get("files", {})
        if target in files and not files[target].get("file"):
            f, path, sha, name = files[target], None, files[target]["sha256"], target
        else:
            path = router_path(target)
            sha = file_sha256(path)
            name = named_file(sha)
            f = files.get(name, {})
        typer.echo(f"name: {name or '(not in the manifest)'}")
        typer.echo(f"sha256: {sha}")
        typer.echo(f"file: {path or 'not tracked in the package'}")
        if path is not None:
            h = read_header(path)
            cfg, base = h["config"], h["base_model"]
            typer.echo(f"base model: {base.get('name')} ({base.get('model_type')}), config sha256 "
                       f"{base.get('config_sha256', '')[:12]}, embedding sha256 {base.get('embedding_sha256', '')[:12]}")
            typer.echo(f"shape: {len(h['layers'])} routed layers ({format_int_list(h['layers'])}), num_groups "
                       f"{cfg.num_groups}, router_dim {cfg.router_dim}, key_router {'yes' if cfg.key_router else 'no'}")
            typer.echo(f"routing: tau {cfg.tau:g}, sinkhorn_iters {cfg.sinkhorn_iters}, window {cfg.window} tokens, "
                       f"sinks {cfg.sink_tokens} tokens")
            typer.echo("named patterns (the file's rules; a bare name such as hard_top2 is the paper's rule):")
            named = [("default", Pattern.parse("default", cfg))]
            named += [(f"default_top{k}", Pattern.parse(f"default_top{k}", cfg)) for k in range(1, cfg.num_groups + 1)]
            named += [(n, Pattern.parse(n, cfg)) for n in ("random_default", "shuffled_default")]
            for n, p in named:
                typer.echo(f"  {n:<18} {p}")
            extra = h["extra"]
            if extra:
                typer.echo(f"metadata: {', '.join(f'{k}={v}' for k, v in sorted(extra.items()) if not isinstance(v, (dict, list)))}")
        elif f:
            typer.echo(f"default pattern: {f.get('default_pattern')}")
        if f:
            typer.echo(f"what: {f.get('what', '')}")
            typer.echo(f"recipe: {f.get('recipe', '')}")
            if f.get("command"):
                typer.echo(f"command: {f['command']}")
            if f.get("ingredients"):
                typer.echo(f"ingredients: {', '.join(f['ingredients'])}")
            typer.echo(f"lineage: {' <- '.join(lineage(name))}")
    guard(run)


@routers_app.command("set-rules")
def routers_set_rules(
    src: str = typer.Argument(..., help="a router file: path, manifest name or 'shipped'"),
    pattern: str = typer.Option(..., "--pattern", help="the file's rules for hard top-k, e.g. "
                                "'hard_top2+layer_top_k(1=[0],3=[1])+capacity(0.5,layers=[13],evict)'"),
    out: Path = typer.Option(..., "--out", help="the router file to write (atomically)"),
):
    """Write a router file again, same tensors, with a pattern's rules as its own: its 'default_topK'
    becomes that pattern (how the shipped chain gives a file its budget and capacity)."""
    def run():
        from focus_lab.hf.router_files import write_rules
        from focus_lab.hf.shipped import router_path
        from focus_lab.patterns import Pattern
        path = router_path(src)
        cfg, layers = _pattern_context(path)
        p = Pattern.parse(pattern, cfg).check(cfg.num_groups, layers)
        if Path(out).resolve() == Path(path).resolve():
            _fail(f"--out {out} is the input file; choose another path")
        write_rules(path, out, p)
        typer.echo(f"wrote {out}: default_top{p.top_k} = {p}")
    guard(run)


@routers_app.command("build")
def routers_build(
    out: Optional[Path] = typer.Option(None, "--out", help="folder of the chain (default: checkpoints/smollm2_chain; "
                                       "gemma3-270m: checkpoints/gemma3_chain)"),
    data: Path = typer.Option(Path("data"), help="the prepared corpora's folder"),
    mix: str = typer.Option("austen-shakespeare", help="the training mix (austen-shakespeare: the shipped "
                            "file; broad: the broad mix, docs/studies/broad-mix.md)"),
    base: Optional[Path] = typer.Option(None, help="a router file standing for stages 1-4 (e.g. smollm2-135m/soup)"),
    runs: int = typer.Option(2, help="distill runs of 30 steps on a mix other than the default"),
    model: str = typer.Option("smollm2-135m-instruct", help="whose router file: smollm2-135m-instruct or gemma3-270m "
                              "(its global layers 5, 11, 17; focus_lab.train.chain.gemma_stages)"),
    steps: int = typer.Option(30, help="gemma3-270m: optimizer steps of its two distill stages at 4096 "
                       "tokens (its last stage, at 8192 tokens, takes 20)"),
):
    """Train a shipped router file (SmolLM2's, or Gemma-3-270M's with --model gemma3-270m) from scratch
    as one resumable chain, timing every stage (docs/recipes.md, 'The recipe, and what it costs';
    focus_lab.train.chain)."""
    from focus_lab.train.chain import CHAINS, main as chain
    if model not in CHAINS:
        _fail(f"--model {model!r}: a chain exists for {' and '.join(CHAINS)}; for another model train with "
              f"'focus-lab train --model {model} --recipe distill64 --seq-len 4096'")
    out = out or Path("checkpoints") / ("gemma3_chain" if model == "gemma3-270m" else "smollm2_chain")
    args = ["--out", str(out), "--data", str(data), "--mix", mix, "--runs", str(runs), "--model", model,
            "--steps", str(steps)]
    code = chain(args + (["--base", str(base)] if base else []))
    if code:
        raise typer.Exit(code)


# ------------------------------------------------------------------------------------------
probe_app = typer.Typer(add_completion=False, no_args_is_help=True,
                        help="Probes of a Focus model: passkey retrieval (docs/passkey.md) and the retrieval suite "
                        "(docs/retrieval.md).")
app.add_typer(probe_app, name="probe")

# literal copies of focus_lab.eval.passkey's defaults (importing it here would load torch for --help;
# tests/test_passkey.py checks that they agree)
PASSKEY_LENGTHS = "1024,2048,4096"
PASSKEY_DEPTHS = "0,25,50,75,100"
PASSKEY_PATTERNS = "dense,window,random_default,default_top1,default"
PASSKEY_FORMAT = "chat"


def _number_list(spec: str, option: str, cast=int) -> list:
    """A comma list of numbers such as '1024,2048'; one error line naming the option otherwise."""
    try:
        out = [cast(x) for x in spec.replace(" ", "").split(",") if x]
    except ValueError:
        out = []
    if not out:
        _fail(f"{option} {spec!r}: write a comma list of numbers, e.g. {option} "
              f"{'1024,2048' if cast is int else '0,50,100'}")
    return out


# the options the probes share
PROBE_ROUTERS_OPTION = typer.Option(None, "--routers", help="router file; default: the routers shipped with "
                                    "focus-lab for the model (focus_lab/routers/)")
PROBE_MODEL_OPTION = typer.Option(None, "--model", help="gemma3-270m, an HF id or a local path; default: embedded "
                                  "SmolLM2-135M")
HAYSTACK_CORPUS_OPTION = typer.Option("austen", "--corpus", help="corpus whose held-out text is the haystack "
                                      "(austen: Persuasion)")


@probe_app.command("passkey")
def probe_passkey(
    routers_opt: Optional[Path] = PROBE_ROUTERS_OPTION,
    model: Optional[str] = PROBE_MODEL_OPTION,
    corpus: str = HAYSTACK_CORPUS_OPTION,
    lengths: str = typer.Option(PASSKEY_LENGTHS, help="prompt lengths in tokens (comma list); prompt + answer "
                                "must fit the model's positions"),
    depths: str = typer.Option(PASSKEY_DEPTHS, help="needle depths in percent of the haystack (comma list)"),
    patterns: str = typer.Option(PASSKEY_PATTERNS, help="comma list of patterns (dense, window, soft, hard_topK, "
                                 "random_topK, shuffled_topK, rules added with '+'; 'default' and its controls: "
                                 "the router file's own rules), or 'all'"),
    pattern_file: Optional[Path] = PATTERN_FILE_OPTION,
    keys: int = typer.Option(3, help="keys (case seeds --seed .. --seed + keys - 1) per length x depth cell"),
    seed: int = typer.Option(0, help="first case seed (fixes the keys and the haystack starts)"),
    formats: str = typer.Option(PASSKEY_FORMAT, "--formats", "--format", help="prompt format(s), comma list: chat (the "
                                "default: the highest dense key log-prob measured), plain, bare"),
    max_new_tokens: int = typer.Option(8, help="greedy decoding budget after the prompt (tokens)"),
    out: Path = typer.Option(Path("runs") / "passkey", help="output folder (resumable: finished cells are kept)"),
    png: bool = typer.Option(False, help="also write passkey.png (kaleido + Chromium)"),
    threads: int = typer.Option(1, help="torch threads (1 is polite on a shared CPU)"),
    random_layers: Optional[str] = RANDOM_LAYERS_OPTION,
    layer_top_k: Optional[str] = LAYER_TOP_K_OPTION,
):
    """Passkey retrieval: a 5-digit key hidden at several depths of held-out text, per pattern."""
    lens = _number_list(lengths, "--lengths")
    deps = _number_list(depths, "--depths", float)
    fmts = [f.strip() for f in formats.split(",") if f.strip()]

    def run():
        import torch
        from focus_lab.eval.evaluate import parse_patterns
        from focus_lab.eval.passkey import FORMATS, load_haystack, run_passkey, summary
        from focus_lab.method.config import format_layer_top_k
        from focus_lab.io import file_sha256
        from focus_lab.hf.retrofit import load_routers, model_identity
        bad = [f for f in fmts if f not in FORMATS] or ([] if fmts else [formats])
        if bad:
            _fail(f"unknown prompt format {bad[0]!r}; choose from {', '.join(FORMATS)}")
        if keys < 1:
            _fail(f"--keys {keys}: at least one key per cell")
        routers = _routers(routers_opt, model)
        overrides = _config_overrides(random_layers, layer_top_k)
        cfg0, layers = _pattern_context(routers, **overrides)
        pats = parse_patterns(patterns, cfg0, pattern_file, layers)  # fail before loading
        torch.set_num_threads(max(1, threads))
        m, tok, corp, _ = _load(model, corpus, 0)  # 0: no cap note; run_passkey checks the lengths
        cfg = load_routers(m, routers, config_overrides=overrides or None)
        if note := _budget_note(cfg, pats):
            typer.echo(note)
        hay = load_haystack(corp.heldout, tok, name=f"{corp.name} held-out ({', '.join(d.name for d in corp.heldout)})")
        settings = {"model": model_identity(m), "routers": {"path": str(routers), "sha256": file_sha256(routers)},
                    "corpus": corp.name, "heldout": [d.name for d in corp.heldout]}
        if overrides:  # part of the cells' fingerprint: a changed spec never reuses a cell
            settings["config_overrides"] = overrides
        typer.echo(f"passkey: {len(fmts)} format(s) x {len(lens)} lengths x {len(deps)} depths x {keys} keys x "
                   f"{len(pats)} patterns; haystack {hay.name}, {len(hay.ids)} tokens; out {out}"
                   + "".join(f"; {k} {format_layer_top_k(v) if k == 'layer_top_k' else v}"
                             for k, v in overrides.items()))
        res = run_passkey(m, tok, hay, out, lengths=lens, depths=deps, patterns=pats, keys=keys, seed=seed,
                          formats=fmts, max_new_tokens=max_new_tokens, settings=settings, png=png,
                          log=typer.echo)
        typer.echo(summary(res["cases"]).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        typer.echo(f"{len(res['cases'])} cases ({res['computed_cells']} cells computed) in {res['seconds']:.0f} s; "
                   f"wrote {', '.join(str(out / f) for f in res['files'])}")
        if res["png_note"]:
            typer.secho(f"note: {res['png_note']}", fg=typer.colors.YELLOW, err=True)
        return res
    return guard(run)


# literal copies of focus_lab.eval.retrieval's defaults (importing it here would load torch for --help;
# tests/test_retrieval.py checks that they agree)
RETRIEVAL_PATTERNS = ("dense,window,default_top1,default,default+match,random_default,random_default+match,"
                      "shuffled_default,moba_matched")
RETRIEVAL_TASKS = ("passkey,niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multikey_2,"
                   "niah_multikey_3,niah_multivalue,niah_multiquery,vt,cwe")


@probe_app.command("retrieval")
def probe_retrieval(
    routers_opt: Optional[Path] = PROBE_ROUTERS_OPTION,
    model: Optional[str] = PROBE_MODEL_OPTION,
    corpus: str = HAYSTACK_CORPUS_OPTION,
    tasks: str = typer.Option("all", help=f"comma list of {RETRIEVAL_TASKS}, or 'all' (RULER's families and passkey: "
                              "docs/retrieval.md)"),
    lengths: str = typer.Option("4096", help="RULER's max_seq_length per case in tokens (prompt + greedy budget; comma "
                                "list); at most the model's positions"),
    cases: int = typer.Option(4, help="cases (case seeds --seed .. --seed + cases - 1) per task and length"),
    patterns: str = typer.Option(RETRIEVAL_PATTERNS, help="comma list of eval patterns (dense, window, hard_topK, "
                                 "random_topK, shuffled_topK, rules added with '+', 'default' and its controls: the router file's "
                                 "rules) and moba_matched; "
                                 "name:N runs a pattern on the first N cases only; dense always runs"),
    seed: int = typer.Option(0, help="first case seed (fixes keys, values, depths and haystack starts)"),
    fmt: str = typer.Option("chat", "--format", help="chat (the question as the chat template's user turn, the "
                            "answer prefix as the assistant's) or plain"),
    out: Path = typer.Option(Path("runs") / "retrieval", help="output folder (resumable: finished cases are kept)"),
    threads: int = typer.Option(1, help="torch threads (1 is polite on a shared CPU)"),
    device: str = typer.Option("cpu", help="cpu | cuda | cuda:N (under torchrun: cuda:$LOCAL_RANK, one shard each)"),
    random_layers: Optional[str] = RANDOM_LAYERS_OPTION,
    layer_top_k: Optional[str] = LAYER_TOP_K_OPTION,
    match_shifts: Optional[str] = MATCH_SHIFTS_OPTION,
    reuse: Optional[str] = typer.Option(None, help="comma list of earlier --out folders of this probe: a case's "
                                        "dense forward is taken from the first that ran the same case (same "
                                        "model, task and token ids) instead of run again; its row's reused_from "
                                        "names that run. Runs made before dense attention was kept give none"),
):
    """RULER's retrieval families (and passkey) per pattern: score, answer log-prob, and each failure
    traced to the layers and heads whose needle pairs the mask dropped. Shards under torchrun."""
    lens = _number_list(lengths, "--lengths")
    if cases < 1:
        _fail(f"--cases {cases}: at least one case per task")
    reuse_dirs = [Path(x) for x in (reuse or "").split(",") if x]
    for d in reuse_dirs:
        if not (d / "cases").is_dir():
            _fail(f"--reuse {d}: not a folder this probe wrote (no {d / 'cases'}); give an earlier --out folder")

    def run():
        import torch
        from focus_lab.eval import retrieval as rt
        from focus_lab.eval.passkey import load_haystack
        from focus_lab.io import file_sha256
        from focus_lab.hf.retrofit import detach, is_attached, load_routers, model_identity
        task_list = rt.parse_tasks(tasks)
        routers = _routers(routers_opt, model)
        cfg0, layers = _pattern_context(routers)
        pats = rt.parse_retrieval_patterns(patterns, cfg0, cases, layers)
        if fmt not in ("chat", "plain"):
            _fail(f"--format {fmt!r}: choose chat or plain")
        torch.set_num_threads(max(1, threads))
        dev = _device(device)
        overrides = _config_overrides(random_layers, layer_top_k, match_shifts)
        m, tok, corp, _ = _load(model, corpus, 0)
        n_pos = getattr(m.config, "max_position_embeddings", None)
        for L in lens:  # before the haystack is tokenized
            if n_pos and L > n_pos:
                _fail(f"--lengths {L}: the model has {n_pos} positions (max_position_embeddings); the longest is {n_pos}")
        cfg = load_routers(m, routers, config_overrides=overrides or None)
        m.to(dev)
        if note := _budget_note(cfg, [(lab, ch) for lab, ch, _ in pats if lab != rt.MOBA]):
            typer.echo(note)

        def restore():
            if is_attached(m):
                detach(m)
            load_routers(m, routers, config_overrides=overrides or None)
            m.to(dev)

        hay = load_haystack(corp.heldout, tok, name=f"{corp.name} held-out ({', '.join(d.name for d in corp.heldout)})")
        settings = {"model": model_identity(m), "routers": {"path": str(routers), "sha256": file_sha256(routers)},
                    "corpus": corp.name, "heldout": [d.name for d in corp.heldout]}
        if overrides:
            settings["config_overrides"] = overrides
        rank, world = rt.shard()
        typer.echo(f"retrieval: {len(task_list)} tasks x {len(lens)} lengths x {cases} cases x {len(pats)} patterns "
                   f"({', '.join(f'{lab}:{k}' if k < cases else lab for lab, _, k in pats)}); haystack {hay.name}, "
                   f"{len(hay.ids)} tokens; device {dev}" + (f"; process {rank} of {world}" if world > 1 else "")
                   + f"; out {out}")
        res = rt.run_retrieval(m, tok, hay, out, task_list, lens, cases, pats, seed, fmt, settings,
                               moba=rt.moba_patcher(m, restore), log=typer.echo, reuse=reuse_dirs)
        if reuse_dirs:
            typer.echo(f"--reuse: the dense forward of {res['reused_dense']} of the {res['computed']} cases computed "
                       f"came from {', '.join(map(str, reuse_dirs))}")
        if res["cases"] is None:
            typer.echo(f"process {rank}: {res['computed']} cases in {res['seconds']:.0f} s; process 0 writes the tables")
            return res
        typer.echo(_retrieval_report(res, rt))
        typer.echo(f"{res['cases'][['task', 'length', 'seed']].drop_duplicates().shape[0]} cases "
                   f"({res['computed']} computed) in {res['seconds']:.0f} s; wrote {out / 'cases.parquet'}, "
                   f"{out / 'trace.parquet'}, {out / 'retrieval.json'}")
        return res
    return guard(run)


def _retrieval_report(res: dict, rt) -> str:
    """The suite's printed summary: per task and length, each pattern's score relative to dense
    (paired interval), the change of the answers' log-prob, pairs kept and cost per case in
    bare forwards; the router against random groups; the retrieval heads; the failures' heads."""
    s = rt.summary(res["cases"])
    lines = []
    for (task, L), g in s.groupby(["task", "length"], sort=False):
        d = g["dense_score"].iloc[0]
        lines.append(f"{task} @ {L}: dense {d:.2f}" + ("  (dense below 50%: the scores rank little here)"
                                                        if d < 0.5 else ""))
        for r in g.itertuples():
            lines.append(f"  {r.pattern:<20} n={r.cases:<3} score {r.score:.2f}  vs dense {r.relative:.2f} "
                         f"[{r.relative_lo:.2f}, {r.relative_hi:.2f}]  logprob {r.logprob_change:+.2f} nats "
                         f"[{r.logprob_change_lo:+.2f}, {r.logprob_change_hi:+.2f}]  pairs kept "
                         f"{r.distant_pairs_kept:.2f}  needle pairs {r.needle_pairs_kept:.2f}  "
                         f"cost {r.cost_ratio:.2f}x bare forward")
    pats = set(res["cases"]["pattern"])
    for router_label, random_label in (("default", "random_default"), ("hard_top2", "random_top2")):
        if not {router_label, random_label} <= pats:
            continue
        for col in ("score", "answer_logprob"):
            pdiff = rt.paired_difference(res["cases"], router_label, random_label, col)
            for r in pdiff.itertuples():
                lines.append(f"router vs random groups, {r.task} @ {r.length} ({col}): {r.difference:+.3f} "
                             f"[{r.lo:+.3f}, {r.hi:+.3f}] over {r.cases} cases: {r.verdict}")
    cost = rt.cost_summary(res["cases"])
    if len(cost):
        a = cost.iloc[-1]
        lines.append(f"cost per case: median {a['median']:.2f}x one bare forward [quartiles {a['q25']:.2f}, {a['q75']:.2f}] "
                     f"over {a['cases']} case-patterns, {a['within_goal']:.0%} within {rt.COST_GOAL}x; "
                     + ", ".join(f"{r.pattern} {r.median:.2f}x" for r in cost.iloc[:-1].itertuples()))
    heads = rt.retrieval_heads(res["trace"])
    for (task, L), g in heads.groupby(["task", "length"], sort=False):
        top = g[g["retrieval_head"]].head(5)
        lines.append(f"retrieval heads, {task} @ {L}: " + (", ".join(
            f"L{r.layer_idx}H{r.head} {r.retrieval_score:.2f}" for r in top.itertuples()) or "none >= 0.1"))
    return "\n".join(lines)


def main() -> None:
    app()


if __name__ == "__main__":
    main()

"""Train the shipped router file from scratch, end to end, and time every stage.

The recipe of ``focus_lab/routers/MANIFEST.json`` as one resumable chain of ``focus-lab``
commands (docs/recipes.md, "The recipe, and what it costs"):

1. ``sinks64``: 60 steps x 2 windows x 512 tokens on Austen (Persuasion held out).
2. ``distill64`` at 4096 tokens from (1): a 40-step schedule stopped after 30 steps, random
   groups in layers 1-9 (their routers are not trained; the other layers' tensors are those
   of a run that trains every layer, because the distill objective is per layer).
3. ``distill64`` at 4096 tokens on Austen + Shakespeare (Persuasion and Hamlet held out):
   3 runs of 30 steps from (2), seeds 0, 1, 2, each from the last.
4. ``focus-lab soup`` of (2) and (3) with equal weights: the two-domain file.
5. the top-2 budget: ``focus-lab routers set-rules`` writes ``BUDGET`` (the per-layer k chosen by
   docs/studies/layer-top-k.md) into (4) as its rules for top-2 (same tensors).
6. the needle corpus (``focus_lab.train.needle_corpus``, ``<out>/needle_mix``): 64 windows of
   4096 tokens of Austen's training novels with 12 facts each, restated far back.
7. ``distill64`` at 4096 tokens on (6), 30 steps from (5), seed 0.
8. the top-2 budget again, written into (7).
9. the group capacity for top-2 (``focus-lab routers set-rules`` with ``CAPACITY`` added, same
   tensors and budget; docs/method.md §2.9): the shipped file, ``<out>/routers.safetensors``.

With ``--mix broad`` stages 5-8 are replaced by the broad mix (not shipped,
docs/studies/broad-mix.md): ``distill64`` at 4096 tokens on a mix of domains, each without its
held-out documents (Austen, Shakespeare, kernel docs, Python source, the King James Bible),
``--runs`` runs of 30 steps from (4), seeds 0, 1, ..., each from the last, then ``focus-lab soup``
of (4) and that with equal weights.

``--base FILE`` stands a finished file in for stages 1-4 (e.g. ``smollm2-135m/soup``).

``--model gemma3-270m`` runs Gemma-3-270M's chain instead (``gemma_stages``; issue 73,
docs/recipes.md): only its global layers 5, 11 and 17 are routed (its other layers keep their own
512-token sliding window), so of the chain above the distillation at 4096 tokens (stage 2, from
fresh routers) and the needle corpus's distillation (stages 6-7, the corpus in Gemma's tokens)
carry over, and a last distillation at 8192 tokens follows (docs/studies/gemma-length-gap.md); the
512-token LM stage, the random layers 1-9, the top-2 budget and the group capacity are SmolLM2's
per-layer findings and are not applied. Its last stage writes the key shift (``KEY_SHIFT``, docs/method.md
§1.7) into the file as its rules for top-2 (same tensors; docs/studies/gemma-key-shift.md).

Writes ``<out>/chain.json`` (per stage: command, seconds, peak RSS in GiB, sha256; the total)
after every stage, so a stopped chain resumes where it was (a stage whose file exists is not
re-run). With ``--reference`` (default: the shipped file) it says how far the result's tensors
are from the reference's on the layers that route (random layers' routers are not used).

    focus-lab routers build --out checkpoints/smollm2_chain        # the shipped file
    focus-lab routers build --out checkpoints/needle_chain --base <smollm2-135m/soup>  # stages 5-9
    focus-lab routers build --out checkpoints/broad_chain --mix broad --base <smollm2-135m/soup> --runs 1
    focus-lab routers build --model gemma3-270m --out checkpoints/gemma3_chain   # Gemma's file
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from focus_lab.io import file_sha256, write_json
from focus_lab.model_names import GEMMA3

ROOT = Path(__file__).resolve().parents[2]
# the shipped file's rules for top-2 (docs/studies/layer-top-k.md, docs/studies/group-capacity.md)
BUDGET = "layer_top_k(1=[0,5-6,9,12-16,25,27-28],3=[1-4,7-8,10-11,18-19,21,24])"
RANDOM_LAYERS = "random_layers([1-9])"
CAPACITY = "capacity(0.5,layers=[13,15-16,21,25,28-29],evict)"

# the training mixes: corpus names, each without its held-out documents (data/README.md);
# stage 3 trains on "austen-shakespeare"; "broad" (five domains of different kinds) is the mix of
# stages 5-6 (docs/studies/broad-mix.md)
MIXES = {"austen-shakespeare": ("austen", "shakespeare"),
         "broad": ("austen", "shakespeare", "kernel-docs", "python-source", "bible-kjv")}
MIX = "austen-shakespeare"  # stage 3's mix; another mix adds stages 5-6


def _held_out(corpus: str, stem: str) -> bool:
    """Whether the prepared file ``stem`` of the named ``corpus`` is one of its held-out documents
    (the rules of ``focus_lab.data``: a named file or a file-name prefix)."""
    from focus_lab.data import _DEFAULT_HELDOUT, _HELDOUT_PREFIX
    prefix = _HELDOUT_PREFIX.get(corpus)
    return stem == _DEFAULT_HELDOUT.get(corpus) or (prefix is not None and stem.startswith(prefix))


def mix_folder(data: Path, mix: str = MIX) -> Path:
    """``data/mix_<mix>``: links to the prepared files of the mix's corpora except their held-out
    documents, named ``<corpus>_<file>``, then Persuasion as the folder's last (held-out) file.
    Raises FileNotFoundError naming ``focus-lab prepare`` when a corpus is not prepared, KeyError
    for an unknown mix."""
    if mix not in MIXES:
        raise KeyError(f"unknown mix {mix!r}; choose one of: {', '.join(MIXES)}")
    out = data / f"mix_{mix.replace('-', '_')}"
    for corpus in MIXES[mix]:
        if not (data / corpus).is_dir() or not any((data / corpus).glob("*.txt")):
            raise FileNotFoundError(f"{data / corpus} is not prepared: run `focus-lab prepare {corpus}` first")
    if not (data / "austen" / "persuasion.txt").is_file():
        raise FileNotFoundError(f"{data / 'austen'} is not prepared: run `focus-lab prepare austen` first")
    out.mkdir(parents=True, exist_ok=True)
    for corpus in MIXES[mix]:
        for f in sorted((data / corpus).glob("*.txt")):
            link = out / f"{corpus.replace('-', '_')}_{f.name}"
            if not _held_out(corpus, f.stem) and not link.exists():
                link.symlink_to(Path("..") / corpus / f.name)
    last = out / "zz_persuasion.txt"
    if not last.exists():
        last.symlink_to(Path("..") / "austen" / "persuasion.txt")
    return out


def distill64(steps: int, *extra: str, seq_len: int = 4096) -> list[str]:
    """``focus-lab train`` arguments of every distill stage of both chains: recipe ``distill64`` at
    ``seq_len`` tokens (4096 but for Gemma's last stage), one window a step, ``steps`` steps at
    learning rate 1e-3, then ``extra``."""
    return ["train", "--recipe", "distill64", "--seq-len", str(seq_len), "--batch-size", "1", "--steps", str(steps),
            "--lr", "1e-3", *extra]


def stages(out: Path, data: Path, mix: str = MIX, base: Path | None = None,
           runs: int = 2) -> list[tuple[str, list[str], Path]]:
    """(name, arguments, output file) of every stage, in order: arguments of ``focus-lab``, or of
    ``python`` when they start with ``-m``.

    Stages 1-4 make the two-domain file (Austen, then Austen + Shakespeare),
    ``<out>/s4_two_domains.safetensors``. With the default ``mix`` stages 5-9 give it the top-2
    budget, distill it 30 steps on the needle corpus, give the result the budget again and the
    group capacity for top-2: the shipped file, ``<out>/routers.safetensors``. With another ``mix``, stages 5-6 continue the
    two-domain file on that mix (``runs`` distill runs of 30 steps, seeds 0, 1, ..., each from the
    last) and average the result with it. ``base``: an existing file standing for stage 4 (e.g.
    the earlier shipped file): stages 1-4 are not run."""
    s1, s2 = out / "s1_sinks64_512", out / "s2_distill64_4096"
    todo = [("s1_sinks64_512", ["train", "--out", str(s1), "--steps", "60"], s1 / "routers.safetensors"),
            ("s2_distill64_4096", distill64(40, "--stop-after", "30", "--checkpoint-every", "10",
                                            "--random-layers", "1-9", "--init-routers", str(s1 / "routers.safetensors"),
                                            "--out", str(s2)), s2 / "routers.safetensors")]

    def distill_runs(prefix: str, corpus: Path, n: int, prev: Path) -> Path:
        for i in range(n):
            folder = out / f"{prefix}_seed{i}"
            todo.append((f"{prefix}_seed{i}", distill64(30, "--corpus", str(corpus), "--seed", str(i),
                                                         "--init-routers", str(prev), "--out", str(folder)),
                         folder / "routers.safetensors"))
            prev = folder / "routers.safetensors"
        return prev

    def rules(name: str, src: Path, dst: Path, *rule: str) -> None:
        todo.append((name, ["routers", "set-rules", str(src), "--pattern", "+".join(("hard_top2",) + rule),
                            "--out", str(dst)], dst))

    final, two = out / "routers.safetensors", out / "s4_two_domains.safetensors"
    last = distill_runs("s3_mix", data / "mix_austen_shakespeare", 3, s2 / "routers.safetensors")
    todo.append(("s4_soup", ["soup", str(s2 / "routers.safetensors"), str(last), "--out", str(two)], two))
    if base is not None:
        todo, two = [], base
    if mix == "austen-shakespeare":
        needles = out / "needle_mix"
        rules("s5_budget", two, out / "s5_budget.safetensors", BUDGET, RANDOM_LAYERS)
        todo.append(("s6_needle_corpus", ["-m", "focus_lab.train.needle_corpus", "--out", str(needles),
                                          "--docs", "64"], needles / "MANIFEST.json"))
        last = distill_runs("s7_needle_mix", needles, 1, out / "s5_budget.safetensors")
        rules("s8_budget", last, out / "s8_budget.safetensors", BUDGET, RANDOM_LAYERS)
        rules("s9_capacity", out / "s8_budget.safetensors", final, BUDGET, RANDOM_LAYERS, CAPACITY)
        return todo
    last = distill_runs(f"s5_{mix.replace('-', '_')}", data / f"mix_{mix.replace('-', '_')}", runs, two)
    todo.append(("s6_soup", ["soup", str(two), str(last), "--out", str(final)], final))
    return todo


CHAINS = ("smollm2-135m-instruct", GEMMA3)  # the models whose router file a chain makes


GEMMA_LONG_STEPS = 20  # g5's distill steps at 8192 tokens (docs/studies/gemma-length-gap.md)
#: g6: the rules written into g5's tensors, Gemma's shipped default (docs/studies/gemma-key-shift.md)
KEY_SHIFT = "hard_top2+key_shift"


def gemma_stages(out: Path, steps: int = 30) -> list[tuple[str, list[str], Path]]:
    """Gemma-3-270M's chain, (name, arguments, output file) as ``stages``: g1 ``distill64`` at 4096
    tokens on Austen's training novels (Persuasion held out) from fresh routers, ``steps`` steps;
    g2 the needle corpus (64 windows of 4096 Gemma tokens); g3 ``distill64`` on it from g1,
    ``steps`` steps, seed 0; g4 ``routers set-rules`` with ``hard_top2``
    (``<out>/g4_needle_mix.safetensors``, ``gemma3-270m/needle-mix``); g5 ``distill64`` at 8192
    tokens on Austen's training novels from g4, ``GEMMA_LONG_STEPS`` steps, seed 0
    (``<out>/g5_distill64_8192/routers.safetensors``, ``gemma3-270m/distill64-8k``; it keeps
    g4's default pattern, ``hard_top2``); g6 ``routers set-rules`` with ``KEY_SHIFT``: the
    chain's file, ``<out>/g6_keyshift.safetensors`` (``gemma3-270m/distill64-8k-keyshift``, g5's
    tensors with each key in the group of the token before it)."""
    g1, g3, needles = out / "g1_distill64_4096", out / "g3_needle_mix_seed0", out / "needle_mix"
    g4, g5, g6 = out / "g4_needle_mix.safetensors", out / "g5_distill64_8192", out / "g6_keyshift.safetensors"
    distill = distill64(steps, "--model", GEMMA3, "--checkpoint-every", "10", "--seed", "0")
    return [("g1_distill64_4096", distill + ["--out", str(g1)], g1 / "routers.safetensors"),
            ("g2_needle_corpus", ["-m", "focus_lab.train.needle_corpus", "--model", GEMMA3, "--out", str(needles),
                                  "--docs", "64"], needles / "MANIFEST.json"),
            ("g3_needle_mix_seed0", distill + ["--corpus", str(needles), "--init-routers", str(g1 / "routers.safetensors"),
                                               "--out", str(g3)], g3 / "routers.safetensors"),
            ("g4_rules", ["routers", "set-rules", str(g3 / "routers.safetensors"), "--pattern", "hard_top2",
                          "--out", str(g4)], g4),
            ("g5_distill64_8192", distill64(GEMMA_LONG_STEPS, "--model", GEMMA3, "--checkpoint-every", "5", "--seed", "0",
                                            "--init-routers", str(g4),
                                            "--out", str(g5), seq_len=8192), g5 / "routers.safetensors"),
            ("g6_rules", ["routers", "set-rules", str(g5 / "routers.safetensors"), "--pattern", KEY_SHIFT,
                          "--out", str(g6)], g6)]


def run_stage(args: list[str], log: Path, poll: float = 2.0) -> tuple[float, float, int, float]:
    """Run ``focus-lab <args>`` (``python <args>`` when ``args`` starts with ``-m``) with output to
    ``log``; (seconds, peak RSS in GiB, exit code, highest 1-minute load average seen while it ran,
    sampled every ``poll`` seconds: about 2 on a quiet 2-core machine, higher when others share it)."""
    t0 = time.perf_counter()
    cmd = [sys.executable, *args] if args[0] == "-m" else [sys.executable, "-m", "focus_lab", *args]
    load = os.getloadavg()[0]
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            load = max(load, os.getloadavg()[0])
            time.sleep(poll)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - t0, usage.ru_maxrss / 2**20, proc.returncode, load


def compare(path: Path, reference: Path) -> dict:
    """Largest absolute difference of ``path``'s router tensors from ``reference``'s on the
    layers that route in both (proj, centroids, group_bias), and whether they are equal."""
    from focus_lab.hf.retrofit import read_router_file
    cfg_a, _, a, _ = read_router_file(path)
    cfg_b, _, b, _ = read_router_file(reference)
    random = set(cfg_a.random_layers or []) | set(cfg_b.random_layers or [])
    diffs = {}
    for key in sorted(b):
        layer = int(key.split(".")[1]) if key.startswith("layers.") else None
        if layer is None or layer in random or key not in a:
            continue
        diffs[key] = float((a[key].float() - b[key].float()).abs().max())
    return {"reference": str(reference), "reference_sha256": file_sha256(reference),
            "routed_tensors": len(diffs), "equal": all(d == 0.0 for d in diffs.values()),
            "max_abs_diff": max(diffs.values(), default=float("nan")),
            "same_random_layers": (cfg_a.random_layers or []) == (cfg_b.random_layers or [])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("checkpoints") / "smollm2_chain",
                    help="folder of the chain (relative paths: to the repository root)")
    ap.add_argument("--data", type=Path, default=Path("data"), help="the prepared corpora's folder")
    ap.add_argument("--mix", choices=sorted(MIXES), default=MIX,
                    help="the training mix of stage 3 (default: %(default)s)")
    ap.add_argument("--base", type=Path, default=None,
                    help="a router file standing for stage 4 (e.g. the earlier shipped file): only stages 5-6 run")
    ap.add_argument("--runs", type=int, default=2, help="distill runs of 30 steps on the mix in stage 5")
    ap.add_argument("--model", choices=CHAINS, default=CHAINS[0],
                    help="whose router file the chain makes (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=30, help="gemma3-270m: optimizer steps of its distill stages at 4096 tokens (g1, g3; g5 takes GEMMA_LONG_STEPS)")
    ap.add_argument("--reference", type=Path, default=None,
                    help="a router file to compare the result with (default: the file shipped for the model)")
    a = ap.parse_args(argv)
    if a.reference is None:
        from focus_lab.hf.shipped import manifest
        entry = manifest().get(a.model)
        a.reference = ROOT / "focus_lab" / "routers" / entry["file"] if entry else None
    os.chdir(ROOT)  # the commands run from the repository root, with the paths as given
    out = a.out
    out.mkdir(parents=True, exist_ok=True)
    try:
        if a.model == GEMMA3:
            if not (a.data / "austen" / "persuasion.txt").is_file():
                raise FileNotFoundError(f"{a.data / 'austen'} is not prepared: run `focus-lab prepare austen` first")
        else:
            mix_folder(a.data, a.mix)
        if a.model != GEMMA3 and a.mix != "austen-shakespeare":
            mix_folder(a.data, "austen-shakespeare")
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    record_path = out / "chain.json"
    record = json.loads(record_path.read_text()) if record_path.is_file() else {"stages": {}}
    todo = gemma_stages(out, a.steps) if a.model == GEMMA3 else stages(out, a.data, a.mix, a.base, a.runs)
    record.setdefault("model", a.model if not record["stages"] else CHAINS[0])  # older chains: SmolLM2's
    if record["model"] != a.model:
        print(f"error: {out} holds the chain of {record['model']}; give another --out", file=sys.stderr)
        return 2
    for name, args, routers_file in todo:
        done = record["stages"].get(name)
        if done and routers_file.is_file() and done.get("sha256") == file_sha256(routers_file):
            print(f"{name}: done before ({done['seconds']:.0f} s)")
            continue
        print(f"{name}: {'python' if args[0] == '-m' else 'focus-lab'} {' '.join(args)}", flush=True)
        seconds, rss, code, load = run_stage(args, out / f"{name}.log")
        if code != 0 or not routers_file.is_file():
            print(f"error: {name} failed (exit {code}); see {out / (name + '.log')}", file=sys.stderr)
            return 1
        record["stages"][name] = {"command": ("python " if args[0] == "-m" else "focus-lab ") + " ".join(args), "seconds": round(seconds, 1),
                                  "peak_rss_gb": round(rss, 2), "max_load_1min": round(load, 2),
                                  "sha256": file_sha256(routers_file)}
        record["total_seconds"] = round(sum(s["seconds"] for s in record["stages"].values()), 1)
        write_json(record_path, record)
        print(f"{name}: {seconds:.0f} s, peak RSS {rss:.2f} GiB", flush=True)
    from focus_lab.hf.shipped import code_commit
    from focus_lab.io import machine
    record["machine"], record["commit"] = machine(), code_commit()  # where and at which commit it ran
    write_json(record_path, record)
    final = todo[-1][2] if todo else out / "routers.safetensors"  # the last stage's file
    if a.reference and a.reference.is_file():
        record["against_reference"] = compare(final, a.reference)
        write_json(record_path, record)
        print(f"against {a.reference.name}: {record['against_reference']}")
    print(f"total {record['total_seconds']:.0f} s ({record['total_seconds'] / 60:.1f} min); {record_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Shipped router files (focus_lab/routers/) and the eval --patterns option."""

import hashlib
import json
import shutil

import pytest
import torch
from typer.testing import CliRunner

from conftest import tiny_llama
from focus_lab.hf import shipped
from focus_lab.method.config import ConfigError
from focus_lab.eval.evaluate import parse_patterns, pattern_changes, pattern_names
from focus_lab.io import ArtifactError
from focus_lab.hf.retrofit import RouterMismatchError, load_routers, read_router_file


def test_manifest_matches_the_shipped_file():
    entry = shipped.manifest()["smollm2-135m-instruct"]
    path = shipped.shipped_router_file()
    assert path.name == entry["file"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"]
    assert path.stat().st_size < 4 * 2**20  # a few MB at most
    cfg, base, tensors, _ = read_router_file(path)
    assert base["name"] == "smollm2-135m-instruct"
    assert len([k for k in tensors if k.endswith(".proj")]) == 30  # one router per layer
    for key in ("command", "data", "seconds", "recipe"):
        assert key in entry  # provenance
    # the top-2 budget: the committed layer_budget choice, as the manifest records it, top-1 uniform
    from analyses.studies.layer_budget import BUDGET_JSON
    from focus_lab.method.config import parse_layer_top_k
    spec = json.loads(BUDGET_JSON.read_text())["top2"]["spec"]
    assert cfg.top_k_budgets == {2: parse_layer_top_k(spec)} == {2: parse_layer_top_k(entry["top_k_budgets"]["spec"]["2"])}
    assert sum(cfg.top_k_at(i) for i in range(30)) == 60  # the same mean k as uniform top-2
    assert {cfg.replace(top_k=1).top_k_at(i) for i in range(30)} == {1}



def test_the_manifest_cites_files_by_name_never_as_previous():
    """Every router file the manifest cites has its name: no key or wording "previous"; the
    provenance records stand under the names of the files they describe (same sha256); every
    ``<name>`` placeholder names a listed file, and in a file's command one of its lineage or
    ingredients; ``routers show`` prints the named command."""
    import re
    from typer.testing import CliRunner
    from focus_lab.cli import app
    text = shipped.MANIFEST.read_text()
    assert "previous" not in text.lower()
    reg = shipped.registry()
    files = reg["files"]
    for name, rec in reg["provenance"].items():
        assert name in files and rec.get("sha256", files[name]["sha256"]) == files[name]["sha256"], name
    placeholder = re.compile(r"<([a-z0-9.-]+/[a-z0-9.-]+)[,>| ]")
    assert {m for m in placeholder.findall(text)} <= set(files)
    for name, f in files.items():
        cited = set(placeholder.findall(f.get("command", "")))
        assert cited <= set(shipped.lineage(name)[1:]) | set(f.get("ingredients", [])), name
    r = CliRunner().invoke(app, ["routers", "show", "smollm2-135m/distill64-4k"])
    assert r.exit_code == 0, r.output
    assert "--init-routers <smollm2-135m/sinks64-512>;" in r.output
    assert "lineage: smollm2-135m/distill64-4k <- smollm2-135m/sinks64-512" in r.output

def test_shipped_file_is_refused_on_another_model():
    with pytest.raises(RouterMismatchError, match="trained on base model 'smollm2-135m-instruct'"):
        load_routers(tiny_llama(), shipped.shipped_router_file())


@pytest.mark.slow
def test_shipped_file_loads_on_the_embedded_model():
    from focus_lab.hf.models import load_model
    from focus_lab.hf.retrofit import routers
    model, _ = load_model(verbose=False)
    cfg = load_routers(model, shipped.shipped_router_file())
    assert len(routers(model)) == 30 and cfg.sink_tokens == 64
    _, _, tensors, _ = read_router_file(shipped.shipped_router_file())
    assert torch.equal(routers(model)[7].centroids.detach(), tensors["layers.7.centroids"])


def _copy_shipped(tmp_path, monkeypatch):
    d = tmp_path / "routers"
    shutil.copytree(shipped.ROUTER_DIR, d)
    monkeypatch.setattr(shipped, "ROUTER_DIR", d)
    monkeypatch.setattr(shipped, "MANIFEST", d / "MANIFEST.json")
    return d / shipped.manifest()["smollm2-135m-instruct"]["file"]


def test_corrupted_or_missing_shipped_file_names_the_file_and_the_fix(tmp_path, monkeypatch):
    f = _copy_shipped(tmp_path, monkeypatch)
    data = bytearray(f.read_bytes())
    data[-10] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"corrupted.*focus-lab train") as e:
        shipped.shipped_router_file()
    assert str(f) in str(e.value)
    f.unlink()
    with pytest.raises(ArtifactError, match=r"missing.*focus-lab train"):
        shipped.shipped_router_file()
    with pytest.raises(ArtifactError, match="no router file ships .* 'gpt2'"):
        shipped.shipped_router_file("gpt2")


def test_pattern_names_and_changes():
    """A bare name is the paper's rule: its changes switch off every rule a router file could add."""
    off = {"layer_top_k": {}, "random_layers": [], "key_shift": 0, "match_shifts": None, "match_latest": 0,
           "group_capacity": 0.0, "capacity_layers": None, "capacity_overflow": "second", "capacity_top_k": None,
           "rules": ()}
    assert pattern_changes("random_top2", 4) == {"mode": "hard", "top_k": 2, "assignment": "random", **off}
    assert pattern_changes("shuffled_top1", 4) == {"mode": "hard", "top_k": 1, "assignment": "shuffled", **off}
    assert pattern_changes("hard_top4", 4)["assignment"] == "router"
    assert [n for n, _ in parse_patterns("dense, window,hard_top1", 4)] == ["dense", "window", "hard_top1"]
    assert len(pattern_names(4)) == 3 + 3 * 4
    for bad in ("magic", "random_topx", "dense_uniform"):
        with pytest.raises(ConfigError, match="hard_topK"):
            pattern_changes(bad, 4)
    for bad in ("hard_top5", "hard_top0", "hard_top5_uniform"):
        with pytest.raises(ConfigError, match=r"outside 1\.\.num_groups = 4|K in 1\.\.4"):
            pattern_changes(bad, 4)
    with pytest.warns(FutureWarning, match="random_top2_uniform"):
        assert pattern_changes("random_top2_uniform", 4) == pattern_changes("random_top2", 4)


def test_bare_names_ignore_the_files_budget_and_default_takes_it():
    """Under a file with a top-2 budget, hard_top2 (the paper's rule) and the deprecated
    hard_top2_uniform give the perplexity of the file without the budget; 'default' that of the
    explicit per-layer k; distant pairs follow (evaluate on a tiny model)."""
    from types import SimpleNamespace
    from focus_lab.method.config import FocusConfig
    from focus_lab.eval.evaluate import evaluate
    from focus_lab.hf.retrofit import attach
    g = torch.Generator().manual_seed(1)
    windows = [SimpleNamespace(input_ids=torch.randint(0, 97, (48,), generator=g))]
    budget = {0: 1, 1: 4}

    def ppl(patterns, **cfg):
        model = tiny_llama()
        cfg = FocusConfig(window=4, num_groups=4, seed=3, **cfg)
        attach(model, cfg)
        return evaluate(model, windows, parse_patterns(patterns, cfg), progress=False).set_index("label")

    with pytest.warns(FutureWarning):
        with_budget = ppl("hard_top2,hard_top2_uniform,random_top2_uniform,default,random_default",
                          top_k_budgets={2: budget})
    plain = ppl("hard_top2,random_top2")
    explicit = ppl("hard_top2+layer_top_k(1=[0],4=[1]),random_top2+layer_top_k(1=[0],4=[1])")
    for label in ("hard_top2", "hard_top2_uniform"):
        assert with_budget.perplexity[label] == pytest.approx(plain.perplexity["hard_top2"], rel=1e-6)
    assert with_budget.perplexity["random_top2_uniform"] == pytest.approx(plain.perplexity["random_top2"], rel=1e-6)
    assert with_budget.perplexity["default"] == pytest.approx(explicit.perplexity.iloc[0], rel=1e-6)
    assert with_budget.perplexity["random_default"] == pytest.approx(explicit.perplexity.iloc[1], rel=1e-6)
    assert with_budget.perplexity["default"] != pytest.approx(plain.perplexity["hard_top2"], rel=1e-6)
    assert with_budget.distant_pairs_kept["default"] > with_budget.distant_pairs_kept["hard_top2"]
    # each row records the rules that ran, the same whichever spelling asked for them
    assert with_budget.canonical_pattern["default"] == "hard_top2+layer_top_k(1=[0],4=[1])"
    assert with_budget.canonical_pattern["hard_top2_uniform"] == "hard_top2"


def test_eval_cli_unknown_pattern_is_one_line_exit_2():
    from focus_lab.cli import app
    res = CliRunner().invoke(app, ["eval", "--patterns", "dense,hard_top9"])
    assert res.exit_code == 2
    out = res.output.strip().splitlines()
    assert len(out) == 1 or all("using the routers" in x for x in out[:-1])
    assert "'hard_top9'" in out[-1] and "outside 1..num_groups = 4" in out[-1]


def test_eval_cli_bad_random_layers_is_one_line_exit_2():
    from focus_lab.cli import app
    res = CliRunner().invoke(app, ["eval", "--random-layers", "1-x", "--patterns", "dense"])
    assert res.exit_code == 2
    assert "--random-layers" in res.output.strip().splitlines()[-1] and "0,3,5-7" in res.output


def test_patterns_of_one_run_do_not_leak_into_each_other():
    from types import SimpleNamespace
    from focus_lab.method.config import FocusConfig
    from focus_lab.eval.evaluate import evaluate
    from focus_lab.hf.retrofit import attach, focus_config
    model = tiny_llama()
    attach(model, FocusConfig(window=4, num_groups=4))
    g = torch.Generator().manual_seed(0)
    windows = [SimpleNamespace(input_ids=torch.randint(0, model.config.vocab_size, (48,), generator=g))
               for _ in range(2)]
    df = evaluate(model, windows, parse_patterns("hard_top1,random_top1,shuffled_top1,hard_top1,dense", 4),
                  progress=False)
    ppl = df["perplexity"].tolist()
    assert ppl[0] == ppl[3] and ppl[1] != ppl[0] and ppl[2] != ppl[0]
    assert focus_config(model).assignment == "router" and focus_config(model).mode == "soft"


def test_eval_cli_bad_layer_top_k_is_one_line_exit_2():
    from focus_lab.cli import app
    res = CliRunner().invoke(app, ["eval", "--layer-top-k", "1-9", "--patterns", "dense"])
    assert res.exit_code == 2
    assert "--layer-top-k" in res.output.strip().splitlines()[-1] and "LAYERS:K" in res.output


def test_soup_averages_router_files_tensor_by_tensor_and_refuses_mixed_files(tmp_path):
    """retrofit.soup_router_files / `focus-lab soup`: every tensor (proj, centroids, group_bias of
    every layer) is sum_i w_i t_i with the weights normalized, the file keeps the common config and
    base model and lists its inputs; files of another config or base model, bad weights and an
    output that is an input are refused in one line (exit 2)."""
    from focus_lab import FocusConfig, attach, save_routers
    from focus_lab.cli import app
    from focus_lab.io import file_sha256
    from focus_lab.hf.retrofit import routers, soup_router_files

    def make(seed, model_seed=0, **cfg):
        m = tiny_llama(seed=model_seed)
        attach(m, FocusConfig(num_groups=3, **cfg))
        g = torch.Generator().manual_seed(seed)  # the same config, other tensors
        with torch.no_grad():
            for r in routers(m).values():
                for t in (r.proj, r.centroids, r.group_bias):
                    t.copy_(torch.randn(t.shape, generator=g))
        return save_routers(m, tmp_path / f"r{seed}_{model_seed}_{len(cfg)}.safetensors")

    a, b = make(1), make(2)
    out = soup_router_files([a, b], tmp_path / "soup.safetensors", [1.0, 3.0])
    config, _, got, extra = read_router_file(out)
    ta, tb = read_router_file(a)[2], read_router_file(b)[2]
    assert sorted(got) == sorted(ta) and any(k.endswith("group_bias") for k in got)
    for k in ta:
        assert torch.allclose(got[k], 0.25 * ta[k] + 0.75 * tb[k], atol=1e-7), k
    assert config == read_router_file(a)[0]
    assert [(s["sha256"], s["weight"]) for s in extra["soup"]] == [(file_sha256(a), 0.25), (file_sha256(b), 0.75)]
    load_routers(tiny_llama(seed=0), out)  # loads on the base model of its inputs
    # equal weights by default, through the CLI
    res = CliRunner().invoke(app, ["soup", str(a), str(b), "--out", str(tmp_path / "eq.safetensors")])
    assert res.exit_code == 0, res.output
    eq = read_router_file(tmp_path / "eq.safetensors")[2]
    assert all(torch.allclose(eq[k], (ta[k] + tb[k]) / 2, atol=1e-7) for k in ta)
    with pytest.raises(RouterMismatchError, match="FocusConfig.*window"):
        soup_router_files([a, make(3, window=8)], tmp_path / "x.safetensors")
    with pytest.raises(RouterMismatchError, match="base model"):
        soup_router_files([a, make(4, model_seed=1)], tmp_path / "x.safetensors")
    for bad in (["--weights", "1,2,3"], ["--weights", "1,-1"], ["--weights", "1,x"]):
        res = CliRunner().invoke(app, ["soup", str(a), str(b), "--out", str(tmp_path / "x.safetensors"), *bad])
        assert res.exit_code == 2 and "--weights" in res.output and "Traceback" not in res.output, res.output
    res = CliRunner().invoke(app, ["soup", str(a), str(b), "--out", str(a)])
    assert res.exit_code == 2 and "input" in res.output
    assert not (tmp_path / "x.safetensors").exists()


def test_gemma_chain_distills_then_continues_on_its_needle_corpus_in_its_own_tokens(tmp_path):
    """focus_lab.train.chain.gemma_stages: g1 distills Gemma's routers from fresh ones (no
    --init-routers), g2 writes the needle corpus with Gemma's tokenizer, g3 continues g1's file on
    it, g4 saves it with hard_top2, g5 distills g4's file 20 steps at 8192 tokens on Austen (no
    --corpus), g6 saves g5's tensors with the key shift: the chain's file; every training stage
    names the model, seed 0."""
    from focus_lab.train.chain import GEMMA3, gemma_stages
    out = tmp_path / "g"
    todo = gemma_stages(out, steps=7)
    assert [n for n, _, _ in todo] == ["g1_distill64_4096", "g2_needle_corpus", "g3_needle_mix_seed0", "g4_rules",
                                       "g5_distill64_8192", "g6_rules"]
    g1, g2, g3, g4, g5, g6 = (args for _, args, _ in todo)
    for args, steps, seq_len in ((g1, "7", "4096"), (g3, "7", "4096"), (g5, "20", "8192")):
        assert args[args.index("--model") + 1] == GEMMA3 and args[args.index("--steps") + 1] == steps
        assert args[args.index("--recipe") + 1] == "distill64" and args[args.index("--seq-len") + 1] == seq_len
        assert args.count("--seq-len") == 1 and args[args.index("--seed") + 1] == "0"
    assert "--init-routers" not in g1 and "--corpus" not in g5
    assert g2[:2] == ["-m", "focus_lab.train.needle_corpus"] and g2[g2.index("--model") + 1] == GEMMA3
    assert g3[g3.index("--corpus") + 1] == str(todo[1][2].parent)
    assert g3[g3.index("--init-routers") + 1] == str(todo[0][2])
    assert g4[:3] == ["routers", "set-rules", str(todo[2][2])] and g4[g4.index("--pattern") + 1] == "hard_top2"
    assert g5[g5.index("--init-routers") + 1] == str(todo[3][2])
    assert todo[4][2] == out / "g5_distill64_8192" / "routers.safetensors"
    assert g5[g5.index("--out") + 1] == str(todo[4][2].parent)
    assert g6[:3] == ["routers", "set-rules", str(todo[4][2])]
    assert g6[g6.index("--pattern") + 1] == "hard_top2+key_shift" and g6[g6.index("--out") + 1] == str(todo[5][2])


def test_chain_refuses_a_folder_of_another_models_chain(tmp_path, capsys):
    """A chain folder holds one model's chain: --model gemma3-270m on a SmolLM2 chain's folder is
    one error line, before any stage runs."""
    from focus_lab.train.chain import main
    data = tmp_path / "data"
    (data / "austen").mkdir(parents=True)
    (data / "austen" / "persuasion.txt").write_text("x")
    out = tmp_path / "chain"
    out.mkdir()
    (out / "chain.json").write_text('{"stages": {"s1_sinks64_512": {"seconds": 1}}}')
    assert main(["--model", "gemma3-270m", "--out", str(out), "--data", str(data), "--reference", str(out / "none")]) == 2
    assert "holds the chain of smollm2-135m-instruct" in capsys.readouterr().err


def test_train_shipped_chain_builds_the_mix_folder_and_chains_each_stage_to_the_last(tmp_path):
    """focus_lab/train/chain.py (focus-lab routers build): a mix folder links every prepared file of its corpora but the
    held-out ones (named files and prefixes) and ends with Persuasion (its held-out file); each training stage starts from the last
    stage's file and the soup averages stage 2 and the last two-domain run; an unprepared corpus
    is one error naming `focus-lab prepare`."""
    from focus_lab.train.chain import BUDGET, CAPACITY, RANDOM_LAYERS, mix_folder, stages
    data = tmp_path / "data"
    with pytest.raises(FileNotFoundError, match="focus-lab prepare austen"):
        mix_folder(data, "austen-shakespeare")
    files = {"austen": ["emma", "persuasion"], "shakespeare": ["hamlet", "lear", "macbeth"],
             "kernel-docs": ["filesystems__ext4", "admin__init"], "python-source": ["asyncio__tasks", "stdlib__os"]}
    for corpus, names in files.items():
        (data / corpus).mkdir(parents=True)
        for n in names:
            (data / corpus / f"{n}.txt").write_text(n)
    folder = mix_folder(data, "austen-shakespeare")
    assert sorted(p.name for p in folder.iterdir()) == [
        "austen_emma.txt", "shakespeare_lear.txt", "shakespeare_macbeth.txt", "zz_persuasion.txt"]
    assert (folder / "zz_persuasion.txt").read_text() == "persuasion"
    mix_folder(data, "austen-shakespeare")  # idempotent
    with pytest.raises(FileNotFoundError, match="focus-lab prepare bible-kjv"):
        mix_folder(data, "broad")
    (data / "bible-kjv").mkdir()
    for n in ["01_genesis", "43_john"]:
        (data / "bible-kjv" / f"{n}.txt").write_text(n)
    broad = mix_folder(data, "broad")
    assert sorted(p.name for p in broad.iterdir()) == [
        "austen_emma.txt", "bible_kjv_01_genesis.txt", "kernel_docs_admin__init.txt", "python_source_stdlib__os.txt",
        "shakespeare_lear.txt", "shakespeare_macbeth.txt", "zz_persuasion.txt"]
    out = tmp_path / "out"
    shipped = stages(out, data)  # the default: stages 1-9 make the shipped file
    assert [n for n, _, _ in shipped] == ["s1_sinks64_512", "s2_distill64_4096", "s3_mix_seed0", "s3_mix_seed1",
                                          "s3_mix_seed2", "s4_soup", "s5_budget", "s6_needle_corpus",
                                          "s7_needle_mix_seed0", "s8_budget", "s9_capacity"]
    assert shipped[-1][2] == out / "routers.safetensors" and shipped[5][2] == out / "s4_two_domains.safetensors"
    # the budget is written into the two-domain file, the needle run starts from that and is budgeted again
    budget = f"hard_top2+{BUDGET}+{RANDOM_LAYERS}"
    assert shipped[6][1] == ["routers", "set-rules", str(shipped[5][2]), "--pattern", budget, "--out", str(shipped[6][2])]
    needle = shipped[8][1]
    assert needle[needle.index("--init-routers") + 1] == str(shipped[6][2])
    assert needle[needle.index("--corpus") + 1] == str(shipped[7][2].parent) == str(out / "needle_mix")
    assert shipped[7][1][:2] == ["-m", "focus_lab.train.needle_corpus"]
    assert shipped[9][1] == ["routers", "set-rules", str(shipped[8][2]), "--pattern", budget, "--out",
                             str(out / "s8_budget.safetensors")]
    # the capacity is written last, into the budgeted needle-mix file
    assert shipped[10][1] == ["routers", "set-rules", str(shipped[9][2]), "--pattern", f"{budget}+{CAPACITY}",
                              "--out", str(out / "routers.safetensors")]
    from_base = stages(out, data, base=tmp_path / "old.safetensors")
    assert [n for n, _, _ in from_base] == ["s5_budget", "s6_needle_corpus", "s7_needle_mix_seed0", "s8_budget",
                                            "s9_capacity"]
    assert from_base[0][1][2] == str(tmp_path / "old.safetensors")
    todo = stages(tmp_path / "out", data, "broad", runs=2)
    assert [n for n, _, _ in todo] == ["s1_sinks64_512", "s2_distill64_4096", "s3_mix_seed0", "s3_mix_seed1",
                                       "s3_mix_seed2", "s4_soup", "s5_broad_seed0", "s5_broad_seed1", "s6_soup"]
    for (_, args, _), (_, _, prev) in list(zip(todo[1:5], todo[:4])) + list(zip(todo[6:8], todo[5:7])):
        assert args[args.index("--init-routers") + 1] == str(prev)
    corpus = {n: a[a.index("--corpus") + 1] for n, a, _ in todo if "--corpus" in a}
    assert corpus["s3_mix_seed2"] == str(data / "mix_austen_shakespeare")
    assert corpus["s5_broad_seed0"] == str(data / "mix_broad")
    s2 = todo[1][1]
    assert s2[s2.index("--stop-after") + 1] == "30" and s2[s2.index("--random-layers") + 1] == "1-9"
    assert todo[5][1][:3] == ["soup", str(todo[1][2]), str(todo[4][2])]
    assert todo[8][1][:3] == ["soup", str(todo[5][2]), str(todo[7][2])]
    base = tmp_path / "shipped.safetensors"
    short = stages(tmp_path / "out", data, "broad", base=base, runs=1)
    assert [n for n, _, _ in short] == ["s5_broad_seed0", "s6_soup"]
    assert short[0][1][short[0][1].index("--init-routers") + 1] == str(base)


@pytest.mark.parametrize("args, needle", [(["--steps", "10", "--stop-after", "11"], "stop_after=11"),
                                          (["--random-layers", "1-x"], "--random-layers")])
def test_train_cli_bad_stop_after_or_random_layers_is_one_line_exit_2(args, needle):
    """Checked before any model or corpus is loaded: one line, exit 2."""
    from focus_lab.cli import app
    res = CliRunner().invoke(app, ["train", *args])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], res.output


def test_eval_names_the_patterns_that_run_under_the_files_budget():
    """focus-lab eval / probe passkey say which hard patterns take a per-layer k (the shipped
    file's top-2 budget), with the spec and how to turn it off; nothing for uniform patterns."""
    from focus_lab.cli import _budget_note
    cfg = read_router_file(shipped.shipped_router_file())[0]
    pats = parse_patterns("dense,default_top1,default,random_default,shuffled_default", cfg)
    note = _budget_note(cfg, pats)
    assert note.startswith("per-layer k for default, random_default, shuffled_default: 0,5-6,9,12-16,25,27-28:1;")
    assert "hard_top2" in note and "default_top1" not in note and note.count("\n") == 0
    assert _budget_note(cfg, parse_patterns("dense,hard_top1,hard_top2,random_top2", cfg)) == ""


def test_split_groups_at_noise_zero_keeps_the_hard_mask_at_twice_the_top_k(tmp_path):
    """analyses/studies/split_groups: K groups split into 2K exact copies (noise 0) give the same
    hard-mode logits at top-2k as the original file at top-k (a key takes the first copy, a query
    both copies of each of its groups), budgets included (every per-layer k doubled); with noise
    the copies differ, so the logits change."""
    from analyses.studies.split_groups import split_groups
    from focus_lab import FocusConfig, attach, save_routers
    from focus_lab.hf.retrofit import load_routers, read_router_file, routers, set_config
    from conftest import random_ids

    m = tiny_llama(seed=0)
    attach(m, FocusConfig(num_groups=3, window=4, top_k=1, mode="hard", top_k_budgets={2: {0: 1, 1: 3}}))
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():  # logits S / tau of order 1, so that the group bias matters
        for r in routers(m).values():
            for t, scale in ((r.proj, 0.02), (r.centroids, 1.0), (r.group_bias, 1.0)):
                t.copy_(scale * torch.randn(t.shape, generator=g))
    src = save_routers(m, tmp_path / "k3.safetensors")
    ids = random_ids(seed=1, batch=1, T=48)
    want = {}
    for k in (1, 2):  # top-1, then top-2 under the file's budget
        set_config(m, top_k=k)
        want[k] = m(ids).logits

    out = split_groups(src, tmp_path / "k6.safetensors", factor=2, noise=0.0)
    cfg, _, tensors, extra = read_router_file(out)
    assert cfg.num_groups == 6 and cfg.top_k == 2 and cfg.top_k_budgets == {4: {0: 2, 1: 6}}
    assert tensors["layers.0.centroids"].shape[0] == 6 and extra["split_groups"]["factor"] == 2
    m6 = tiny_llama(seed=0)
    load_routers(m6, out)
    set_config(m6, mode="hard")
    for k in (1, 2):
        set_config(m6, top_k=2 * k)
        got = m6(ids).logits
        assert torch.allclose(got, want[k], atol=1e-5), k
    # with noise the copies separate: top-2 of 6 is no longer top-1 of 3
    noisy = split_groups(src, tmp_path / "k6n.safetensors", factor=2, noise=1.0)
    mn = tiny_llama(seed=0)
    load_routers(mn, noisy)
    set_config(mn, mode="hard", top_k=2)
    assert not torch.allclose(mn(ids).logits, want[1], atol=1e-3)
    with pytest.raises(ValueError, match="factor"):
        split_groups(src, tmp_path / "x.safetensors", factor=0)


def test_set_rules_writes_the_shipped_files_rules_and_reads_them_back(tmp_path):
    """``write_rules`` of the shipped file's own 'default' gives its config and tensors back (the
    file's bytes differ only in the metadata order of the safetensors writer it was made with);
    without the capacity, the config of the file before it (capacity fields off); the chain's
    constants are the committed study choices; a pattern a file cannot carry is refused."""
    from focus_lab.hf.router_files import write_rules
    from focus_lab.patterns import Pattern, PatternError
    from focus_lab.train.chain import BUDGET, CAPACITY, RANDOM_LAYERS
    src = shipped.shipped_router_file()
    cfg, base, tensors, extra = read_router_file(src)
    p = Pattern.parse("default", cfg)
    assert p == Pattern.parse(f"hard_top2+{BUDGET}+{RANDOM_LAYERS}+{CAPACITY}")
    spec = json.loads((shipped.ROUTER_DIR.parents[1] / "figures" / "results" / "layer_budget.json").read_text())["top2"]["spec"]
    from focus_lab.method.config import parse_layer_top_k
    assert Pattern.parse(f"hard_top2+{BUDGET}").rule("layer_top_k").mapping() == parse_layer_top_k(spec)
    same = write_rules(src, tmp_path / "same.safetensors", p)
    c2, b2, t2, e2 = read_router_file(same)
    assert c2 == cfg and b2 == base and e2 == extra and all(torch.equal(t2[k], tensors[k]) for k in tensors)
    nocap = write_rules(src, tmp_path / "nocap.safetensors", Pattern.parse(f"hard_top2+{BUDGET}+{RANDOM_LAYERS}"))
    c3 = read_router_file(nocap)[0]
    assert c3 == cfg.replace(group_capacity=0.0, capacity_layers=None, capacity_overflow="second", capacity_top_k=None)
    assert str(Pattern.parse("default", c3)) == f"hard_top2+{BUDGET}+{RANDOM_LAYERS}"
    # one process or another, the same content gives the same bytes
    again = write_rules(nocap, tmp_path / "again.safetensors", p)
    assert hashlib.sha256(again.read_bytes()).digest() == hashlib.sha256(same.read_bytes()).digest()
    with pytest.raises(PatternError, match="hard pattern on its routers' groups"):
        write_rules(src, tmp_path / "x.safetensors", Pattern.parse("random_top2"))
    assert not (tmp_path / "x.safetensors").exists()


def test_router_files_are_the_same_bytes_in_every_process(tmp_path):
    """safetensors writes its metadata in an order that changes per process; focus-lab sorts the
    header, so two processes writing the same routers write the same file."""
    import subprocess
    import sys
    code = ("import sys; from focus_lab.hf.router_files import write_rules; from focus_lab.hf.shipped import "
            "shipped_router_file; from focus_lab.patterns import Pattern; "
            "write_rules(shipped_router_file(), sys.argv[1], Pattern.parse('hard_top2+random_layers([1-9])'))")
    shas = set()
    for i in range(3):
        out = tmp_path / f"{i}.safetensors"
        subprocess.run([sys.executable, "-c", code, str(out)], check=True)
        shas.add(hashlib.sha256(out.read_bytes()).hexdigest())
    assert len(shas) == 1


def test_eval_cli_runs_group_free_patterns_without_a_router_file(tmp_path):
    """A model for which no router file ships (a local tiny Llama): dense and window, which use no
    groups, run without one; dense equals the plain model's full-logits cross-entropy on the same
    windows, the window keeps fewer pairs (FocusConfig's 128 tokens < 256). A pattern that uses
    groups ('all' among them) is refused in one line naming 'focus-lab train'."""
    import pandas as pd
    import torch.nn.functional as F
    from run_fixtures import TEXT, make_tokenizer
    from focus_lab.cli import app
    from focus_lab.data import load_corpus, make_windows
    from focus_lab.hf.models import load_model
    model_dir, corpus, out = tmp_path / "model", tmp_path / "corpus.txt", tmp_path / "eval.parquet"
    tiny_llama().save_pretrained(model_dir)
    make_tokenizer().save_pretrained(model_dir)
    corpus.write_text("\n\n".join([TEXT] * 30))
    common = ["eval", "--model", str(model_dir), "--corpus", str(corpus), "--seq-len", "256", "--max-windows", "2"]
    res = CliRunner().invoke(app, [*common, "--patterns", "dense,window", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "run without one" in res.output
    df = pd.read_parquet(out).set_index("label")
    assert list(df.index) == ["dense", "window"] and set(df.router_name) == {"none"}
    assert df.window_tokens["window"] == 128 and df.perplexity["window"] != df.perplexity["dense"]
    model, tok = load_model(str(model_dir), verbose=False)
    windows = make_windows(load_corpus(str(corpus)).heldout, tok, 256, max_windows=2)
    assert len(windows) == 2
    with torch.no_grad():
        nll = torch.stack([F.cross_entropy(model(w.input_ids[None]).logits[0, :-1].double(), w.input_ids[1:])
                           for w in windows]).mean().item()
    assert df.nll["dense"] == pytest.approx(nll, abs=1e-5)
    for patterns in ("dense,hard_top2", "window,default", "all"):
        res = CliRunner().invoke(app, [*common, "--patterns", patterns, "--out", str(out)])
        assert res.exit_code == 2, res.output
        line, = res.output.strip().splitlines()
        assert "no router file ships" in line and "focus-lab train" in line


def test_run_stage_times_a_command_and_records_its_exit_code_memory_and_load(tmp_path):
    """focus_lab.train.chain.run_stage: a `python -m` stage's output goes to its log, its exit code
    comes back (a failing one too), and the load sampled while it ran is a load average (>= 0)."""
    from focus_lab.train.chain import run_stage
    seconds, rss, code, load = run_stage(["-m", "platform"], tmp_path / "ok.log", poll=0.05)
    assert code == 0 and seconds > 0 and 0.005 < rss < 4 and load >= 0
    assert (tmp_path / "ok.log").read_text().strip()  # platform's one line
    _, _, code, _ = run_stage(["-m", "focus_lab_no_such_module"], tmp_path / "bad.log", poll=0.05)
    assert code == 1 and "No module named" in (tmp_path / "bad.log").read_text()


def test_machine_line_names_cpu_cores_memory_and_gpu():
    from focus_lab.io import machine, machine_line
    env = machine()
    assert env["nproc"] >= 1 and env["cpu_model"]
    assert machine_line({"cpu_model": "AMD EPYC", "nproc": 2, "mem_gib": 23.5}) == "AMD EPYC, 2 cores, 23.5 GiB, no GPU"
    assert machine_line({"cpu_model": "x", "nproc": 16, "gpu": "NVIDIA H200"}) == "x, 16 cores, NVIDIA H200"

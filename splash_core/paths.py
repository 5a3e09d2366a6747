"""Where the project's data lives: the checkout ``splash_core`` runs from (the README installs
it editable), which holds ``profiles/`` and ``bench/`` (results, the paper's reference data)."""

from __future__ import annotations

from pathlib import Path

SOURCE_ROOT = Path(__file__).resolve().parents[1]


def project_path(relative: str) -> Path:
    """``relative`` as given when it exists from the current directory (the project root, as the
    committed report names its folders), else the same folder of the checkout: commands find
    the project's data from any directory."""
    here = Path(relative)
    return here if here.exists() else SOURCE_ROOT / relative

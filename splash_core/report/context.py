"""What a section renderer sees: where to write images, and the other results of its platform."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from ..results import Result

SOURCE_ORDER = {"paper": 0, "measured": 1, "model": 2}


def block_order(r: Result) -> tuple:
    """Blocks within a section: the paper's first, then measured, then the model's; by folder and file."""
    return (SOURCE_ORDER.get(r.data["source"], 9), r.platform, r.path)


@dataclasses.dataclass
class Context:
    """Rendering state of one platform. ``images`` collects the file names written so far,
    in order, so the report (and its tests) know every image it links."""

    out: Path
    platform: str
    results: list[Result]
    images: list[str] = dataclasses.field(default_factory=list)

    def image_path(self, result: Result, what: str) -> tuple[Path, str]:
        """A unique, stable PNG name for one plot of ``result``: folder-source-what.png (a second
        result of the same kind in one folder gets -2, -3 ...)."""
        stem = re.sub(r"[^A-Za-z0-9]+", "-", f"{result.platform}-{result.data['source']}-{what}")
        name = f"{stem.strip('-').lower()}.png"
        n = 2
        while name in self.images:
            name = f"{stem.strip('-').lower()}-{n}.png"
            n += 1
        self.images.append(name)
        return self.out / name, name

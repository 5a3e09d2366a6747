"""The report's chapters: one per platform, the paper's three and the CPU we measure on first,
and the results folders that belong to each ('h200x8' and 'h200' both to H200)."""

from __future__ import annotations

import re

# Platforms always shown, in this order; result folders of other platforms follow alphabetically.
PLATFORMS = {"b200": "B200", "h200": "H200", "dcu": "DCU (BW1000)", "cpu": "CPU (reference backend)"}


def family(platform: str) -> str:
    """Results folder -> chapter: 'h200x8' and 'h200' both belong to H200."""
    match = re.fullmatch(r"(.+?)x\d+", platform)
    return match[1] if match else platform


def title(key: str) -> str:
    """A chapter's heading: the platform's name ('H200'), or its key in capitals."""
    return PLATFORMS.get(key, key.upper())


def chapter_order(keys) -> list[str]:
    """The always-shown platforms, then any other chapter keys alphabetically."""
    return list(PLATFORMS) + sorted(k for k in set(keys) if k not in PLATFORMS)

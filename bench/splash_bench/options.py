"""The benchmarks' ``--transfer KEY=VALUE`` flag: A/B variants of the deployment's transfer
options (:class:`~splash_core.profiles.transfer.TransferConfig`), validated as a profile is."""

from __future__ import annotations

import argparse

import yaml

from splash_core.profiles import schema
from splash_core.profiles.transfer import TransferConfig


def add_transfer_option(parser: argparse.ArgumentParser) -> None:
    keys = ", ".join(f.name for f in TransferConfig.__dataclass_fields__.values())
    parser.add_argument("--transfer", action="append", default=[], metavar="KEY=VALUE",
                        help=f"a transfer option for this run (repeatable; keys: {keys}), e.g. peer_pulls=true")


def transfer_overrides(items: list[str], parser: argparse.ArgumentParser) -> dict:
    """``--transfer`` items as a mapping (YAML values), checked against :class:`TransferConfig`."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            parser.error(f"--transfer {item!r}: expected KEY=VALUE")
        out[key.strip()] = yaml.safe_load(value)
    try:
        transfer_config(out)
    except schema.ProfileError as exc:
        parser.error(str(exc))
    return out


def transfer_config(overrides: dict | None) -> TransferConfig:
    """The default transfer options with ``overrides`` (a mapping as :func:`transfer_overrides` gives)."""
    return schema.build(TransferConfig, dict(overrides or {}), file="--transfer")

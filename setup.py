"""What pyproject.toml cannot state: the packages are every ``splash_core`` package, found, plus
``splash_profiles``, the checkout's ``profiles/`` folder and its kinds' folders, which a wheel ships
as data (pyproject's package-dir maps the folder; a found package list cannot hold a mapped one)."""

from setuptools import find_namespace_packages, find_packages, setup

PROFILES = ["splash_profiles", *(f"splash_profiles.{kind}" for kind in find_namespace_packages(where="profiles"))]

setup(packages=[*find_packages(include=["splash_core", "splash_core.*"]), *PROFILES])

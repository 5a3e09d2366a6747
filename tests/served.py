"""A ``splash serve`` process as a user starts one (the console script, on 127.0.0.1, a port the
OS picks), for the server tests: wait until it says it is ready, read its metrics, stop it."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
import time

import pytest
import requests
from processes import alive, cmdline, descendants
from prometheus_client.parser import text_string_to_metric_families

READY = re.compile(r"ready on (http://127\.0\.0\.1:\d+)")


class Served:
    """One server process; ``url`` once ready, ``log`` its stderr so far."""

    def __init__(self, *args: str, api_key: str | None = None, timeout_s: float = 120.0):
        exe = shutil.which("splash") or pytest.skip("console script `splash` not installed")
        self.api_key = api_key
        key = ["--api-key", api_key] if api_key else []
        self.proc = subprocess.Popen([exe, "serve", "--port", "0", "--log-level", "info", *key, *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.ranks: list[int] = []  # known once ready (kill() may run before: a server that never got ready)
        self.reader = threading.Thread(target=lambda: self.lines.extend(iter(self.proc.stderr.readline, "")),
                                       daemon=True)
        self.reader.start()
        deadline = time.monotonic() + timeout_s
        while not (found := READY.search(self.log)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"splash serve did not get ready (exit {self.proc.poll()}):\n{self.log}")
            time.sleep(0.1)
        self.url = found[1]
        self.ranks = [p for p in descendants(self.proc.pid) if "spawn_main" in cmdline(p)]

    @property
    def log(self) -> str:
        return "".join(self.lines)

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def post(self, path: str, body, headers: dict | None = None, **kw) -> requests.Response:
        return requests.post(self.url + path, json=body, headers={**self.headers, **(headers or {})}, timeout=120, **kw)

    def get(self, path: str) -> requests.Response:
        return requests.get(self.url + path, headers=self.headers, timeout=60)

    def metrics(self) -> dict:
        """{(name, labels as sorted tuple): value} of every sample in /metrics."""
        text = requests.get(self.url + "/metrics", timeout=60).text
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def wait(self, timeout_s: float = 60.0) -> int:
        """Wait for the server to exit by itself (a signal sent earlier, a fault); its exit code."""
        try:
            return self.proc.wait(timeout=timeout_s)
        finally:
            self.reader.join(timeout=10)

    def orphans(self) -> list[int]:
        deadline = time.monotonic() + 10
        while any(alive(p) for p in self.ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        return [p for p in self.ranks if alive(p)]

    def kill(self) -> None:
        """Leave nothing behind, whatever happened."""
        for pid in [self.proc.pid] * (self.proc.poll() is None) + [p for p in self.ranks if alive(p)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


def metric(samples: dict, name: str, **labels) -> float:
    """The samples of ``name`` whose labels include ``labels``, summed (every metric has ``model_name`` too)."""
    want = set(labels.items())
    return sum(v for (n, have), v in samples.items() if n == name and want <= set(have))


def wait_for(condition, timeout_s: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")

"""Two machines, as ``torchrun --nnodes 2`` starts them (docs/multinode.md): two torchrun agents on
loopback, one process each (static rendezvous at node 0's address, gloo), form the group of
deployment cpu-tiny (T = 2). ``splash run`` serves the main job and passes its reference check,
node 0 reporting; ``splash serve`` answers a completion request on node 0's port."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import requests

READY = re.compile(r"ready on (http://127\.0\.0\.1:\d+)")
# a short rollout (both nodes read the file: on machines of their own it must be on each), served
# through forced switches, so KV pages cross between the nodes
WORKLOAD = """kind: workload
seed: 3
rollout: {requests: 4, prompt_tokens: [16, 48], output_tokens: [4, 8],
          long_tail_requests: 1, long_tail_tokens: [12, 16]}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_nodes(*argv: str) -> list[subprocess.Popen]:
    """Node 0 and node 1: a torchrun agent each, as one would start them on two machines."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}  # gloo's interface: loopback
    return [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                              "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port),
                              "-m", "splash_core.cli.main", *argv],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for node in (0, 1)]


def stop(nodes: list[subprocess.Popen]) -> None:
    for node in nodes:
        if node.poll() is None:
            node.send_signal(signal.SIGTERM)  # torchrun stops its worker
    for node in nodes:
        try:
            node.wait(timeout=30)
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait()


def test_splash_run_on_two_nodes_passes_its_reference_check(tmp_path):
    workload = tmp_path / "short.yaml"
    workload.write_text(WORKLOAD)
    nodes = start_nodes("run", "--workload", str(workload), "--policy", "script:TP,CP,DP:2", "--json")
    try:
        (out0, err0), (out1, err1) = (node.communicate(timeout=240) for node in nodes)
    finally:
        stop(nodes)
    assert [node.returncode for node in nodes] == [0, 0], err0 + err1
    summary = json.loads(out0)
    assert summary["T"] == 2 and summary["served"] == summary["requests"] == 4
    assert len(summary["switches"]) >= 2, summary["switches"]
    assert summary["check"]["passed"] is True and summary["check"]["of"] == summary["requests"]
    assert out1 == ""  # node 1's rank computes; rank 0 reports


def test_splash_serve_on_two_nodes_answers_a_request():
    nodes = start_nodes("serve", "--host", "127.0.0.1", "--port", "0")
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(nodes[0].stderr.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 240
        while not (found := READY.search("".join(lines))):
            assert all(node.poll() is None for node in nodes) and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.2)
        url = found[1]
        model = requests.get(f"{url}/v1/models", timeout=60).json()["data"][0]["id"]
        reply = requests.post(f"{url}/v1/completions", timeout=120,
                              json={"model": model, "prompt": "hello", "max_tokens": 4, "temperature": 0})
        assert reply.status_code == 200, reply.text
        choice = reply.json()["choices"][0]
        assert reply.json()["usage"]["completion_tokens"] == 4 and choice["finish_reason"] == "length"
    finally:
        stop(nodes)
        reader.join(timeout=10)

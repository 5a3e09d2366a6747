"""Collectives of the backend on ``--splash-ranks`` spawned ranks."""

from __future__ import annotations

import pytest

from . import cases


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_all_gather_into(conformance_pool, dtype_name):
    import torch

    conformance_pool().run(cases.all_gather, getattr(torch, dtype_name))


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_uneven_all_to_all_with_zero_rows(conformance_pool, dtype_name):
    import torch

    conformance_pool().run(cases.uneven_all_to_all, getattr(torch, dtype_name))


@pytest.mark.parametrize("async_op", [False, True])
def test_idle_rank_takes_part_in_all_to_all(conformance_pool, async_op):
    received = conformance_pool().run(cases.idle_rank_all_to_all, async_op)
    assert sum(received[0]) == 0


def test_all_reduce_broadcast_and_objects(conformance_pool):
    conformance_pool().run(cases.reduce_broadcast_objects)


def test_side_communicator(conformance_pool):
    conformance_pool().run(cases.side_communicator)


def test_peer_memory_pulls_exact_bytes(conformance_pool):
    """Only for a backend that answers ``splash_peer_memory`` on this device."""
    outcome = conformance_pool().run(cases.peer_memory)
    if outcome[0] == "none":
        pytest.skip("the backend has no peer memory on this device (switches move pages by collectives)")
    assert len(set(outcome)) == 1 and outcome[0] in ("pulled", "pulled, barrier"), outcome

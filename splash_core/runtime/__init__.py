"""The distributed runtime: a group of T ranks serving MLA layers in TP, DP, DOP and CP.

Modules, one concept each:

- ``group``, ``spawn``: a rank's process group, device, collectives and streams (torchrun or
  :class:`~splash_core.runtime.spawn.RankPool`).
- ``step_batch``: :class:`StepBatch`, a step's requests (id, owner, start, rows) in owner-major
  row order, computed identically on every rank; ``step_context`` its device-side view.
- ``kv_pool``: the paged latent KV (+ indexer keys) of each MLA layer on one rank, with the
  placement rule :func:`held_pages`.
- ``weights``: seeded or safetensors weights in DeepSeek's naming; ``mla``: the layout-free MLA
  math and :class:`MLAWeights` (all heads or a head shard).
- ``mla_layer``: :class:`MLALayer`, one layer in its own layout; ``exchange``: the activation
  collectives of the layouts.
- ``model``: embedding, MLA + tensor-parallel dense MLP blocks, vocabulary-parallel LM head;
  ``reference_model``: the single-process oracle; ``driver``: chunked prefill + greedy decode.
- ``step_bench``: rank-side work of ``bench/runtime_step.py``.

Per-layer state for live switching (the layout is a property of each layer)::

    layer = model.layers[i]                  # MLALayer
    layer.layout, layer.weights, layer.kv    # current layout, MLAWeights, LayerKV
    layer.weights.shard(rank, T)             # cut this rank's head shard out of full weights
    MLAWeights.from_shards([...])            # full weights from gathered shards (rank order)
    layer.set_layout(dst, weights)           # checks the weights fit dst's placement
    layer.kv.pages_of(rid)                   # (logical pages, physical pages) held here
    layer.kv.alloc(rid, logical) / free(rid, logical=None)
    layer.kv.pack(kernels, rid, logical)     # -> (logical, kv [n, page, d_c+d_r], indexer)
    layer.kv.unpack(kernels, rid, logical, kv, indexer)   # allocate + write, all-or-nothing
    held_pages(layout, rid, owner, pages, rank, T)        # what a layout assigns a rank
    model.check_placement(batch)             # every layer holds exactly its layout's pages
    model.nbytes(), layer.nbytes()           # bytes per state: weights, kv, indexer, recurrent

A KDA layer would follow the same contract as :class:`MLALayer` (``forward(x, step)`` from and
to all rows on every rank, ``layout``, ``set_layout``, ``nbytes``), keeping per-request recurrent
state on the owner in DP/DOP/CP and split by head shard in TP; the model builds MLA layers only
today and says so for a model with KDA layers.
"""

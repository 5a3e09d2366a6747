"""The distributed runtime: a group of T ranks serving MLA and KDA layers in TP, DP, DOP and CP.

Modules, one concept each:

- ``group``, ``spawn``: a rank's process group, device, collectives and streams (torchrun or
  :class:`~splash_core.runtime.spawn.RankPool`).
- ``step_batch``: :class:`StepBatch`, a step's requests (id, owner, start, rows) in owner-major
  row order, computed identically on every rank; ``step_context`` its device-side view.
- ``kv_pool``: the paged latent KV (+ indexer keys) of each MLA layer on one rank, with the
  placement rule :func:`held_pages`; ``block_tables``: its block tables and free pages, with
  array operations over many requests' pages (:class:`PageKeys`) for live switches; ``page_placement``: where new pages go (each
  history in long runs, so switches pull it in few copies); ``page_keys``: those key sets and
  the error a full pool raises. The cache formats, the weights, and the layout-free MLA/KDA math
  the layers run are :mod:`splash_core.model`'s.
- ``feed_forward``: the dense MLP (tensor parallel) and DeepSeek's MoE (expert parallel) of each
  block, fixed while attention switches.
- ``mla_layer``: :class:`MLALayer`, one layer in its own layout; ``exchange``: the activation
  collectives of the layouts.
- ``model``: embedding, MLA + dense MLP or MoE blocks, vocabulary-parallel LM head, built from a
  ``model_config`` (:class:`ModelConfig`: what to build; :class:`RankOps`: the rank and what its
  backend hands it); ``reference_model``: the single-process oracle; ``sampling``: each request's
  next token chosen on the device, greedy or from the plan's draws.
- ``decode_graphs``: decode steps replayed from captured graphs, one per (layouts, padded batch
  bucket); ``static_step``: the padded step over persistent buffers they record;
  ``device_tables``: every layer's block tables on the device, updated entry by entry;
  ``step_tokens``: greedy tokens reaching the host behind an event instead of a sync.
- ``switch``: live layout switching: :class:`~splash_core.runtime.switch.SwitchExecutor` runs one
  step during which every layer moves to a destination layout, overlapping layer i's transfer
  with layer i−1's computation (``Model.step``'s ``layouts`` and ``before_layer`` keywords).

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

KDA layers (hybrid models such as GLM-5.3-Flash) follow the same contract:

- :mod:`splash_core.model.kda`: the layout-free Kimi delta attention math and :class:`KDAWeights`
  (all heads or a head shard; Kimi-Linear naming); ``kda_recurrence``: the short conv over cached inputs and the
  gated delta rule through the backend's ``KDAKernels``; ``kda_layer``: :class:`KDALayer`, one
  layer in its own layout; ``recurrent_pool``: per-request recurrent state and conv caches per
  KDA layer, with the placement rule :func:`held_heads`; ``switch.recurrent``: the
  :class:`RecurrentMover` that moves it during a live switch::

    layer = model.layers[i]                  # KDALayer
    layer.layout, layer.weights, layer.state # current layout, KDAWeights, LayerRecurrent
    layer.state.heads_of(rid)                # head range of the request's state held here
    layer.state.get(rid, heads) / put(rid, part)              # copies out / install (or remove)
    layer.state.pack_shards(rid, shards, T) / assemble(...)   # the manifest's (request, shard) keys
    SwitchExecutor(model, ctx)               # its default movers include the RecurrentMover
"""

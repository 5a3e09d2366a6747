"""The model's math, layout-free: what one device computes for MLA and KDA blocks, rotary
embeddings, routed experts, the KV cache formats and the torch reference of the fused small ops,
and the weights as a checkpoint names and shapes them. It knows nothing of ranks or layouts
beyond the head shard a caller asks for; the runtime places it on a group."""

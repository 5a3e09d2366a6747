"""Which :class:`~splash_core.profiles.checkpoint_family.CheckpointFamily` reads a checkpoint,
by the ``architectures`` name in its config.json. A new family is one module defining its
CheckpointFamily and one line in :data:`FAMILIES`."""

from __future__ import annotations

from .checkpoint_deepseek import DEEPSEEK_V2, DEEPSEEK_V3
from .checkpoint_deepseek_v32 import DEEPSEEK_V32
from .checkpoint_family import CheckpointFamily
from .checkpoint_glm4_moe_lite import GLM4_MOE_LITE
from .checkpoint_glm_moe_dsa import GLM_MOE_DSA
from .checkpoint_kimi_linear import KIMI_LINEAR

FAMILIES: dict[str, CheckpointFamily] = {
    "DeepseekV2ForCausalLM": DEEPSEEK_V2,
    "DeepseekV3ForCausalLM": DEEPSEEK_V3,
    "DeepseekV32ForCausalLM": DEEPSEEK_V32,
    "Glm4MoeLiteForCausalLM": GLM4_MOE_LITE,
    "GlmMoeDsaForCausalLM": GLM_MOE_DSA,
    "KimiLinearForCausalLM": KIMI_LINEAR,
}

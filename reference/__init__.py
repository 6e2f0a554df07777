"""The float64 pure-PyTorch reference: plain, slow, obvious. Imports only the spec from rope/."""

from reference.fused import CacheWrite, mla_rope_kv_cache, qk_norm_rope, rope_kv_cache
from reference.position_ids import Audio, Image, Prompt, Text, Video, decode_positions, prompt_positions
from reference.rotation import rotate
from reference.rotation_grad import cos_sin_cache_grad, rotate_grad
from reference.runner_positions import prepare_positions
from reference.table import attention_factor, cos_sin_table, inv_freq

__rope_harness__ = True   # the harness checks this marker: another package named `reference` lacks it

__all__ = ["Audio", "CacheWrite", "Image", "Prompt", "Text", "Video", "attention_factor", "cos_sin_cache_grad",
           "cos_sin_table", "decode_positions", "inv_freq", "mla_rope_kv_cache", "prepare_positions", "prompt_positions",
           "qk_norm_rope", "rope_kv_cache", "rotate", "rotate_grad"]

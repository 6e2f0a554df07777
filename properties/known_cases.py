"""Inputs that triggered real bugs (docs/spec.md §7), as rotation cases every implementation must pass.

Each entry names the bug it reproduces; the spec is the model's, the positions are chosen to
expose the bug (distinct rows, the last cache row, the last token).  The regression corpus
(properties/regressions/*.json: rotation case files that once exposed a real bug) is listed here too.
"""

from __future__ import annotations

from pathlib import Path

from properties.strategies import RotationCase
from rope.spec import RopeSpec

GLM_41V = RopeSpec(head_size=128, rotary_dim=64, is_neox_style=False, sections=(8, 12, 12),
                   layout="chunked", base=10000.0, max_position=4 * 65536)
GLM_OCR = RopeSpec(head_size=128, rotary_dim=128, is_neox_style=False, sections=(16, 24, 24),
                   layout="chunked", base=10000.0, max_position=4 * 131072)
QWEN35 = RopeSpec(head_size=256, rotary_dim=64, is_neox_style=True, sections=(11, 11, 10),
                  layout="interleaved", base=10000000.0, max_position=4 * 262144)
QWEN3_VL = RopeSpec(head_size=128, rotary_dim=128, is_neox_style=True, sections=(24, 20, 20),
                    layout="interleaved", base=5000000.0, max_position=4 * 262144)
HUNYUAN_OCR = RopeSpec(head_size=128, rotary_dim=128, is_neox_style=True, sections=(16, 16, 16, 16),
                       layout="chunked", base=10000.0, max_position=32768, ntk_alpha=1000.0)
# rotary_dim/2 = 40 is not a power of two: the kernel has padding lanes 40..63 (the shape our
# kernel needs for bug 2; no catalogued model has it).
PADDING_LANES = RopeSpec(head_size=80, rotary_dim=80, is_neox_style=True, sections=(10, 15, 15),
                         layout="interleaved", base=10000.0, max_position=4096)
SMALL_INTERLEAVED = RopeSpec(head_size=128, rotary_dim=64, is_neox_style=True, sections=(8, 12, 12),
                             layout="interleaved", base=10000.0, max_position=4096)
# The maps read from the kernel's table (rope/row_maps.py): SGLang's GLM round-robin over [8, 12, 12]
# (past 24 frequencies only H and W), Ernie-4.5-VL's H/W alternation with a T tail (GPT-J pairs),
# HunyuanImage-3.0's two-row y/x map.
GLM_ROUND_ROBIN = RopeSpec.glm_round_robin(128, 64, (8, 12, 12), is_neox_style=True, base=10000.0,
                                           max_position=4 * 65536)
ERNIE_45_VL = RopeSpec.ernie45(128, 128, (22, 22, 20), is_neox_style=False, base=500000.0, max_position=4 * 131072)
HUNYUAN_IMAGE = RopeSpec.two_row_interleaved(128, 128, is_neox_style=True, base=10000.0, max_position=32768)

KNOWN_BUG_CASES = {
    # 1. Triton M-RoPE paired NeoX for GPT-J models (vllm#42016, #49290, fixed by #49906).
    "gptj-paired-neox-glm41v": RotationCase(GLM_41V, 11, 32, 2, "bfloat16", "uniform", False, 1),
    "gptj-paired-neox-glmocr": RotationCase(GLM_OCR, 11, 16, 8, "bfloat16", "grid", False, 2),
    # 2. Interleaved masks covering padding lanes: cos/sin loads past rotary_dim/2 (sglang#30123);
    #    positions at the last cache row and on the last token.
    "interleaved-padding-lanes-qwen35": RotationCase(QWEN35, 7, 16, 2, "bfloat16", "last_row", False, 3),
    "interleaved-padding-lanes-head80": RotationCase(PADDING_LANES, 7, 4, 2, "bfloat16", "last_row", False, 10),
    # 3. Partial rotary with head_size/2 strides (vllm#22593).
    "partial-rotary-strides-glm41v": RotationCase(GLM_41V, 8, 4, 2, "float32", "uniform", True, 4),
    # 9. Interleaved map pinned exactly, including 3*s_h > rotary_dim/2 ([8,12,12] over 32 freqs).
    "interleaved-map-qwen3vl": RotationCase(QWEN3_VL, 9, 8, 2, "float32", "uniform", False, 5),
    "interleaved-map-short-sections": RotationCase(SMALL_INTERLEAVED, 9, 4, 1, "float32", "uniform", False, 6),
    # GLM round-robin: a row with its section's count is skipped (the map without the skip is i % 3).
    "glm-round-robin-short-sections": RotationCase(GLM_ROUND_ROBIN, 9, 4, 1, "float32", "uniform", False, 12),
    # Ernie-4.5-VL: H on even, W on odd frequencies of the first 44, T on the last 20; GPT-J pairs.
    "ernie45-map-gptj": RotationCase(ERNIE_45_VL, 9, 4, 1, "bfloat16", "grid", False, 13),
    # HunyuanImage-3.0's y/x rows alternate by frequency; vLLM's chunked map gave half of them the wrong
    # row (vllm-omni#1784).
    "two-row-map-hunyuan-image": RotationCase(HUNYUAN_IMAGE, 9, 4, 2, "float32", "uniform", False, 14),
    # XD-RoPE 4 rows with NTK alpha (HunyuanOCR), image grid positions.
    "xdrope-4rows-hunyuanocr": RotationCase(HUNYUAN_OCR, 12, 16, 8, "bfloat16", "grid", False, 7),
    # Early Triton stride review (vllm#22375): h/w row offsets use num_tokens strides.
    "row-strides-many-tokens": RotationCase(QWEN3_VL, 97, 2, 1, "float16", "uniform", True, 8),
    # MQA, key absent, a single token: the query alone is rotated, the key comes back None.
    "single-token-no-key": RotationCase(GLM_41V, 1, 3, 0, "float16", "uniform", False, 9),
    # 0 tokens (a step with no token of this batch): empty outputs, no error. Peers that view q as
    # (num_tokens, -1, head_size) raise there (vLLM's and SGLang's forward paths, FlashInfer: their
    # adapters declare it, rope/backends/known_faults.py).
    "empty-batch-glm41v": RotationCase(GLM_41V, 0, 32, 2, "bfloat16", "uniform", False, 11),
}

# The regression corpus: promoting a mismatch is copying its case file from reports/cases/ here.
CORPUS = Path(__file__).parent / "regressions"
REGRESSION_FILES = sorted(CORPUS.glob("*.json"))

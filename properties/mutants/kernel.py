"""The known Triton-kernel bugs (docs/spec.md §7 and §8.1) as mutants of OUR kernels, each a small
textual substitution of the kernel's source (the machinery: rope.harness.mutation.kernel_mutant).
Every substitution must match the current sources exactly once, or building the mutant raises
(tests/suite/test_kernel_mutants.py builds them all).

A mutant is callable with the implementation's signature and resolves through the registry:
``--rope-impl properties.mutants.kernel:neox_for_gptj``.  Below the mutants: where each one's bug is
searched for (ROTARY_CELLS), for the dedicated searches of properties/rotation/test_mutant_searches.py
and the project's tests.
"""

from __future__ import annotations

from rope.harness.mutation.kernel_mutant import positions_mutant, rotary_mutant

# --------------------------------------------------------------------------- rotary kernel
@rotary_mutant(("IS_NEOX=spec.is_neox_style,", "IS_NEOX=True,"))
def neox_for_gptj():
    """(a) GPT-J pairing ignored: always pairs (i, i + rotary_dim/2) (docs/spec.md §7.1).

    vLLM's Triton M-RoPE kernel ignored is_neox_style until vllm#49906 (issues vllm#42016 GLM-OCR,
    vllm#49290; vllm-ascend#12765 the same in npu_mrope).  GLM-4.1V, GLM-OCR, Ernie-4.5-VL.
    """


@rotary_mutant((
    "    cos = tl.load(cache_ptr + offs, mask=lane_ok, other=0.0)\n"
    "    sin = tl.load(cache_ptr + half + offs, mask=lane_ok, other=0.0)\n",
    "    cos = tl.load(cache_ptr + offs)\n"
    "    sin = tl.load(cache_ptr + half + offs)\n"))
def cos_sin_unmasked():
    """(b) cos/sin loads cover the padding lanes [rotary_dim/2, BLOCK_F) (docs/spec.md §7.2).

    sgl-project/sglang#30123; vLLM's interleaved t_mask = NOT(h|w) covered the padding lanes
    until valid_mask (055e47c).  Here BLOCK_F = next_pow2(rotary_dim/2), at least 32, so padding lanes
    exist when rotary_dim/2 is not a power of two (head 80, rotary 80: lanes 40..63) or is below 32.  Lane i >= rd/2
    reads cos at row element i (inside the row: the sin half) and sin at rd/2 + i, past the row's
    end.  The values never reach the output (q/k loads and stores stay masked): only the tracer in
    rope/harness/guards.py sees the sin reads, as reads of the cache's NaN row padding.
    """


@rotary_mutant(
    ("    cos = tl.load(cache_ptr + offs, mask=lane_ok, other=0.0)\n"
     "    sin = tl.load(cache_ptr + half + offs, mask=lane_ok, other=0.0)\n",
     "    cos = tl.load(cache_ptr + offs)\n"
     "    sin = tl.load(cache_ptr + half + offs)\n"),
    ("return max(MIN_BLOCK_F, next_power_of_2(spec.num_freqs))", "return next_power_of_2(spec.head_size) // 2"))
def cos_sin_unmasked_head_padded():
    """(b') The upstream shape of docs/spec.md §7.2: lanes padded to next_pow2(head_size)/2 AND cos/sin
    loads unmasked, as in vLLM's kernel before 055e47c (pad_hd) and sglang before #30123.

    Qwen3.5 (head 256, rotary 64, [11,11,10]): lanes 32..127 read up to 3 rotary_dim past each
    row start, and past the last cache row for positions at max_position - 1.  Two substitutions
    (both asserted), because our kernel sizes its lanes from rotary_dim.  Output unaffected; only
    the tracer sees it.
    """


@rotary_mutant(("spec.head_size, spec.num_freqs,\n            *_sections_constexprs(spec)",
          "spec.head_size, spec.head_size // 2,\n            *_sections_constexprs(spec)"))
def partial_rotary_head_half():
    """(c) Partial rotary with head_size/2 where rotary_dim/2 belongs (docs/spec.md §7.3).

    vllm#22593 (GLM-4.1V: head 128, rotary 64): the first Triton M-RoPE kernel used hd//2 for the
    cos/sin strides and the offset of the q/k second half.  Here ``half`` drives the sin offset,
    the NeoX partner channel and the lane mask: sin is read from rotary_dim/2 + ... past the row
    (NaN padding under guards), NeoX pairs (i, i + head_size/2).
    """


@rotary_mutant(("axis = tl.where((freq % 3 == 1) & (freq < 3 * sec1), 1, axis)",
          "axis = tl.where((freq % 3 == 1) & (freq // 3 <= sec1), 1, axis)"))
def interleaved_h_bound_off_by_one():
    """(d) Interleaved axis map off by one (docs/spec.md §7.9): H lanes bounded by ``i // 3 <= s_h``.

    vLLM's kernel wrote ``j <= 3*s_h`` (harmless: j = 3*s_h has j%3 == 0, the same set as ``<``);
    counting groups instead (``i // 3 <= s_h``, i.e. i < 3*s_h + 3) gives frequency 3*s_h + 1 to
    H instead of T whenever 3*s_h + 1 < rotary_dim/2: Qwen3-VL [24, 20, 20] moves frequency 61.
    """


@rotary_mutant(("        axis = tl.where((freq % 3 == 1) & (freq < 3 * sec1), 1, axis)\n"
          "        axis = tl.where((freq % 3 == 2) & (freq < 3 * sec2), 2, axis)\n",
          "        axis = tl.where((freq % 3 == 1) & (freq < 3 * sec1), 2, axis)\n"
          "        axis = tl.where((freq % 3 == 2) & (freq < 3 * sec2), 1, axis)\n"))
def interleaved_thw_order_swapped():
    """(d') Interleaved T/H/W order swapped: T W H T W H ... (docs/spec.md §7.9).

    The "THTHWHTHW" docstring confusion (transformers#42097; the right order is T H W T H W): the
    lanes i % 3 == 1 take the W row and i % 3 == 2 the H row.
    """


@rotary_mutant(("pos_ptr + d * pos_row_stride + token", "pos_ptr + d * num_tokens + token"))
def positions_rows_packed():
    """(e) Position rows assumed packed: row d read at d * num_tokens (docs/spec.md §7.6).

    vllm#22375 review: the h/w rows sit num_tokens apart only in a packed [3, T] tensor; vLLM's
    runner slices positions from a persistent [3, max_num_tokens + 1] buffer, whose rows are
    further apart.  Identical to the right kernel on contiguous positions; caught only with the
    guarded (row-strided) positions, where row 1 starts reading row 0's sentinel padding.
    """


@rotary_mutant(("pos_ptr + d * pos_row_stride + token", "pos_ptr + d + token"))
def positions_rows_at_token_offsets():
    """(e') h/w rows read at token offsets: positions[0, token + d] instead of positions[d, token]
    (docs/spec.md §7.6, the vllm#22375 row-offset review; sglang#15983 read [3, 1, T] with the wrong
    stride).  The last token reads past row 0: the sentinel under guards.
    """


@rotary_mutant(("axis = tl.load(map_ptr + freq, mask=freq < half, other=0)",
          "axis = tl.load(map_ptr + (freq + 1) % half, mask=freq < half, other=0)"))
def row_map_table_shifted():
    """(d'') A map read from a table one frequency off: lane i takes the row of frequency i + 1
    (the last lane that of 0), the table indexed from 1.

    Every map the kernel reads from its table (GLM round-robin, Ernie-4.5-VL, two-row interleaved,
    custom) rotates frequency i by the wrong row wherever rows i and i + 1 differ; the two-row map
    has its rows swapped outright (vllm-omni#1784's symptom: half of the frequencies on the wrong axis).
    """


# --------------------------------------------------------------------------- positions kernel
@positions_mutant(("tl.store(out_ptr + d * out_row_stride + qs + i, pos, mask=valid)",
             "tl.store(out_ptr + d * out_row_stride + qs + i, pos, mask=dims_ok)"))
def positions_store_unmasked():
    """(f) The position step writes past the step's tokens: the query_len mask dropped from
    the store, so every program with work writes whole BLOCKs of columns from query_start_loc[b] (docs/spec.md §5;
    vLLM Model Runner V2 prepare_mrope_positions writes with ``mask=block < query_len``).

    Later requests overwrite the spill on the interpreter (programs run in order), so what remains
    is the last request's spill past num_tokens: the output's sentinel columns and guard padding,
    or memory past ``out`` (wild writes: suppressed and reported by the tracer).  On a GPU the
    programs race, and the spill can also clobber other requests' columns.
    """


@rotary_mutant(("IS_NEOX=spec.is_neox_style,", "IS_NEOX=spec.is_neox_style or num_tokens >= 4096,"))
def neox_pairs_from_4096_tokens():
    """(g) A path chosen by token count is wrong on one side: from 4,096 tokens GPT-J specs are
    paired NeoX-style (docs/spec.md §7.10; the shape of flashinfer#609 -> #619).

    Decode and every property drawing up to 48 (or 640) tokens see the right path; only a batch of
    prefill size shows it (properties/rotation/test_prefill.py: the boundaries 4,095 / 4,096 / 4,097).
    """


ROTARY_MUTANTS = {m.name: m for m in (
    neox_for_gptj, cos_sin_unmasked, cos_sin_unmasked_head_padded, partial_rotary_head_half,
    interleaved_h_bound_off_by_one, interleaved_thw_order_swapped, row_map_table_shifted, positions_rows_packed,
    positions_rows_at_token_offsets, neox_pairs_from_4096_tokens)}
@rotary_mutant(("        token = token_block.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)\n",
           "        token = token_block * BLOCK_T + tl.arange(0, BLOCK_T)\n"),
          ("            x_stride = tl.where(is_k, k_row_stride, q_row_stride).to(tl.int64)\n",
           "            x_stride = tl.where(is_k, k_row_stride, q_row_stride)\n"),
          ("(group * R + slot // q_blocks).to(tl.int64) * BLOCK_T", "(group * R + slot // q_blocks) * BLOCK_T"),
          ("group.to(tl.int64) * (R * BLOCK_T)", "group * (R * BLOCK_T)"))
def offsets_32bit():
    """(h) Row offsets computed in 32 bits: token * row_stride wraps past 2^31 elements of q
    (docs/spec.md §7.10; Liger#804, and the 32-bit program-id offsets of Liger's and vLLM's M-RoPE
    kernels).

    Right on everything smaller; only a q of more than 2^31 elements shows it, which takes a GPU
    (properties/rotation/test_prefill.py's huge cases, deep profile): the interpreter would take hours.
    """


@rotary_mutant(("    if asked is None:\n        return needs_64\n", "    if asked is None:\n        return False\n"))
def cache_offsets_32bit():
    """(h') Cache offsets always in 32 bits: position * row_stride wraps once the cos/sin cache passes
    2^31 elements (docs/spec.md §7.10, the cache side of Liger#804's 32-bit offsets).

    The kernel indexes the cache in 32 bits only where no offset can pass 2^31 - 1; this mutant
    does so everywhere.  Right on every cache of fewer elements: only properties/rotation/test_prefill.py's
    4 GiB cache (GPU, deep profile) shows it.
    """


# Mutants whose bug only a prefill-size batch shows, with the token count their wrong path starts
# at: they are searched with the prefill boundaries (tests/suite/test_kernel_mutants.py) instead of the
# small-case search (searches.py).
PREFILL_ONLY = {"neox_pairs_from_4096_tokens": 4096}
# Mutants only a GPU shows, in the deep profile (q past 2^31 elements): outside ROTARY_MUTANTS, so the
# CPU mutation run does not count them; `rope-harness mutants` runs them where a GPU is (needs: gpu-deep).
GPU_DEEP_MUTANTS = {m.name: m for m in (offsets_32bit, cache_offsets_32bit)}
POSITIONS_MUTANTS = {m.name: m for m in (positions_store_unmasked,)}


# --------------------------------------------------------------------------- where each bug is searched for
# Small shapes: the interpreter costs ~0.4 ms per program instance.
HEAD_SIZES = (64, 80, 96, 128, 32, 16)
MAX_POSITIONS = (64, 1, 7, 300)
MAX_TOKENS = 6

# Mutant -> (dtype, kind, is_neox_style): the test_rotation.py cell that holds its bug; the
# known-bug trigger cases that apply; detectors of which one must fire; detectors that must not.
#   plain:        test_rotation.py's comparison on plain tensors (wild-read/-write: the tracer saw
#                 an access past an argument's storage, suppressed it and reported it)
#   guarded:      the comparison on guarded inputs;   nan: NaN in the output under guards
#   traced-read:  the tracer saw a read of a guard element (the value need not reach the output)
# A value bug may first show on a case where the plain run is blind (one token, position 0, a
# one-row cache): those accept either comparison.
VALUE_BUG = ("plain", "guarded")
ROTARY_CELLS = {
    "neox_for_gptj": (("bfloat16", "chunked3", False), ["gptj-paired-neox-glm41v"], VALUE_BUG, ()),
    # No known case applies: every known spec has a power-of-two rotary_dim/2, so our kernel has no
    # padding lanes there.  The values never reach the output: only the tracer sees the reads.
    "cos_sin_unmasked": (("bfloat16", "interleaved", True), [], ("traced-read",), ("plain", "guarded", "nan")),
    "cos_sin_unmasked_head_padded": (("bfloat16", "interleaved", True), ["interleaved-padding-lanes-qwen35"],
                                     ("traced-read",), ("plain", "guarded", "nan")),
    "partial_rotary_head_half": (("float32", "chunked3", True), ["partial-rotary-strides-glm41v"], VALUE_BUG, ()),
    "interleaved_h_bound_off_by_one": (("float32", "interleaved", True), ["interleaved-map-qwen3vl"], VALUE_BUG,
                                       ()),
    "interleaved_thw_order_swapped": (("float32", "interleaved", True), ["interleaved-map-short-sections"],
                                      VALUE_BUG, ()),
    "row_map_table_shifted": (("float32", "mapped", True), ["two-row-map-hunyuan-image"], VALUE_BUG, ()),
    # Identical to the right kernel on contiguous positions: only the row-strided guarded positions see it
    # (the sentinel it reads as a position is clamped to a cache row: a wrong value, and a traced read).
    "positions_rows_packed": (("float16", "chunked3", True), ["row-strides-many-tokens"], ("guarded", "traced-read"),
                              ("plain",)),
    # With one token, positions[0, 0 + d] IS positions[d, 0] in a packed [3, 1] tensor.
    "positions_rows_at_token_offsets": (("float16", "chunked3", True), ["row-strides-many-tokens"], VALUE_BUG, ()),
}
KNOWN_PAIRS = [(m, k) for m, (_, known, _, _) in ROTARY_CELLS.items() for k in known]

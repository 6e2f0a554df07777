"""Where a fused implementation departs from the reference, and what the departure looks like: named
rules over what the check found (rope.harness.fused.check.FusedCheck), first hit wins.  Each label is
one way the field has shipped a fused op wrong (docs/spec.md §10):

==============================  ===========================================================================
label                           what the implementation left
==============================  ===========================================================================
value_touched                   v changed (it is read only: copied into the cache, never rewritten)
padding_slot_written            a cache row no slot names written, no more rows than padding tokens: a
                                slot -1 taken as an index (flashinfer#2792)
stale_slot_overwritten          cache rows no slot names changed (stale contents must survive)
live_key_unrotated              the cache right, the live k returned as it came in (sglang#19636)
live_key_wrong                  the cache right, the live k wrong some other way
fp8_scale_multiplied            an FP8 cache holding value * scale instead of value / scale
norm_after_rotation             q and k normalized after the rotation, not before (the weights then
                                meet the wrong channels)
eps_dropped                     q and k normalized without eps
weights_swapped                 q normalized with k's weight and k with q's
partner_lost_past_10240         partial rotary wrong only at token x head indices past 10240 (a warp
                                handling several heads loses a pair's partner there, vllm#51049)
rotated_by_slots                q and k rotated by each token's cache slot instead of its position (an
                                op taking both arrays, as FlashInfer's pos_ids and positions, handed
                                them swapped)
q_wrong, k_wrong, qk_wrong      the rotated heads wrong some other way
key_cache_wrong                 the key cache's written rows wrong (the live k right)
value_cache_wrong               the value cache's written rows wrong
q_nope_touched                  MLA: q's channels outside q_pe changed
kv_c_touched                    MLA: kv_c changed (it is read only)
heads_read_packed               MLA: q_pe wrong at heads >= 1 only, of a heads-major q: its heads read as if
                                packed in the token's row (aiter#3841)
cache_k_pe_unrotated            MLA: q_pe and k_pe right, the latent cache holding the unrotated k_pe
kv_cache_wrong                  MLA: the latent cache's written rows wrong some other way
==============================  ===========================================================================
"""

from __future__ import annotations

import torch

import reference.fused as fused_reference
from reference.rotation import rotate
from rope.fused import is_fp8, scale_float
from rope.harness.fused.bound import UNIT_ROUNDOFF, fp8_bound, rotation_within_bound
from rope.harness.fused.compare import bad_elements, bits, changed_rows, rows_mask

__all__ = ["LABELS", "PARTNER_SWITCH", "diagnose"]

PARTNER_SWITCH = 10240           # token x head products (vllm#51049)

LABELS = {
    "value_touched": "v changed: it must be left as it is",
    "padding_slot_written": "a cache row no slot names was written, as a padding slot (-1) taken as an index would",
    "stale_slot_overwritten": "cache rows no slot names changed: stale contents must survive",
    "live_key_unrotated": "the cache holds the rotated k but the live k was returned unrotated",
    "live_key_wrong": "the cache holds the right k but the live k is wrong",
    "fp8_scale_multiplied": "the FP8 cache holds value * scale, not value / scale",
    "norm_after_rotation": "q and k match the norm applied after the rotation",
    "eps_dropped": "q and k match the norm without eps",
    "weights_swapped": "q and k match the norm with q's and k's weights swapped",
    "partner_lost_past_10240": "partial rotary wrong only past 10240 token x head products",
    "rotated_by_slots": "q and k match the rotation at each token's cache slot instead of its position "
                        "(the positions and the slots swapped)",
    "q_wrong": "the rotated q is wrong",
    "k_wrong": "the rotated k is wrong",
    "qk_wrong": "the rotated q and k are wrong",
    "key_cache_wrong": "the key cache's written rows are wrong",
    "value_cache_wrong": "the value cache's written rows are wrong",
    "q_nope_touched": "q's channels outside q_pe (q_nope) changed: only q_pe is rotated",
    "kv_c_touched": "kv_c changed: it must be read only",
    "heads_read_packed": "q_pe is wrong at heads >= 1 only, of a heads-major q: its heads were read as if "
                         "packed in the token's row (aiter#3841)",
    "cache_k_pe_unrotated": "the latent cache holds the unrotated k_pe (q_pe and the live k_pe are right)",
    "kv_cache_wrong": "the latent cache's written rows are wrong",
}


def _within(got, expected, bound) -> bool:
    return not bool(bad_elements(got, expected, bound).any())


def _first_token_head(bad: torch.Tensor, num_tokens: int, heads_before: int, heads_total: int, d: int) -> int | None:
    """The least token x head index (t * heads_total + heads_before + h) of a bad element of [T, H * D]."""
    per_head = bad.reshape(num_tokens, -1, d).any(dim=-1)
    if not bool(per_head.any()):
        return None
    t, h = per_head.nonzero().T
    return int((t * heads_total + heads_before + h).min())


def _partner_lost(spec, bads: list[tuple[torch.Tensor, int]], num_tokens: int, heads_total: int) -> bool:
    """Partial rotary, and every bad head at a token x head index past the switch."""
    if spec.rotary_dim == spec.head_size or num_tokens * heads_total <= PARTNER_SWITCH:
        return False
    firsts = [_first_token_head(bad, num_tokens, before, heads_total, spec.head_size) for bad, before in bads]
    firsts = [f for f in firsts if f is not None]
    return bool(firsts) and min(firsts) >= PARTNER_SWITCH


def _qk_norm_alternatives(check):
    """(label, qkv of the alternative, float64) of each way contract A is known to go wrong."""
    case, ev = check.case, check.evidence
    inputs, before, d = ev["inputs"], ev["before"], case.spec.head_size
    q_end, k_end = case.num_heads_q * d, (case.num_heads_q + case.num_heads_k) * d
    q, k = rotate(case.spec, inputs.positions.cpu(), before[:, :q_end].cpu(), before[:, q_end:k_end].cpu(),
                  inputs.cos_sin_cache.cpu())
    norm_after = torch.cat((fused_reference.rms_norm_heads(q, inputs.q_weight.cpu(), case.eps, d),
                            fused_reference.rms_norm_heads(k, inputs.k_weight.cpu(), case.eps, d)), dim=1)
    yield "norm_after_rotation", norm_after
    ref = fused_reference.qk_norm_rope
    args = (case.spec, inputs.positions.cpu(), before.cpu(), case.num_heads_q, case.num_heads_k, case.num_heads_v)
    table = inputs.cos_sin_cache.cpu()
    if case.eps > 0:
        yield "eps_dropped", ref(*args, inputs.q_weight.cpu(), inputs.k_weight.cpu(), 0.0, table)[:, :k_end]
    yield "weights_swapped", ref(*args, inputs.k_weight.cpu(), inputs.q_weight.cpu(), case.eps, table)[:, :k_end]


def _diagnose_qk_norm(check) -> str:
    case, ev = check.case, check.evidence
    if ev["value_touched"]:
        return "value_touched"
    d = case.spec.head_size
    k_end = (case.num_heads_q + case.num_heads_k) * d
    out = ev["out"][:, :k_end]
    bound = torch.cat((ev["bounds"]["q"], ev["bounds"]["k"]), dim=1)
    # An alternative computed as the bug would (its own roundings in the activation dtype included).
    u_o = UNIT_ROUNDOFF[ev["before"].dtype]
    for label, alternative in _qk_norm_alternatives(check):
        if _within(out, alternative, 4 * bound + 4 * u_o * alternative.abs()):
            return label
    total = case.num_heads_q + case.num_heads_k
    if _partner_lost(case.spec, [(ev["bad"]["q"], 0), (ev["bad"]["k"], case.num_heads_q)], case.num_tokens, total):
        return "partner_lost_past_10240"
    q_bad, k_bad = bool(ev["bad"]["q"].any()), bool(ev["bad"]["k"].any())
    return "qk_wrong" if q_bad and k_bad else "q_wrong" if q_bad else "k_wrong"


def _kept_changed(check) -> tuple[int, int]:
    """(rows no slot names that changed, over both caches; padding tokens of the call)."""
    case, ev = check.case, check.evidence
    inputs, before = ev["inputs"], ev["before"]
    written = ev["ref"].written.cpu()
    changed = 0
    for name in ("key_cache", "value_cache"):
        changed += int((changed_rows(before[name], getattr(inputs, name), case.layout) & ~written).sum())
    slots = inputs.slot_mapping.cpu()
    padding = int((slots == -1).sum()) + case.num_tokens - slots.shape[0]
    return changed, padding


def _scale_multiplied(check) -> bool:
    """An FP8 cache whose written rows hold value * scale (within a bf16 value's rounding)."""
    case, ev = check.case, check.evidence
    inputs, ref = ev["inputs"], ev["ref"]
    bad = [n for n, b in ev["cache_bad"].items() if b]
    if not bad or not is_fp8(inputs.key_cache.dtype):
        return False
    tokens, slots = fused_reference.slot_rows(inputs.slot_mapping, case.num_tokens)
    heads = (-1, case.num_kv_heads, case.spec.head_size)
    for name in bad:
        values = ref.key if name == "key_cache" else ev["before"]["value"].cpu().to(torch.float64)
        scale = inputs.k_scale if name == "key_cache" else inputs.v_scale
        scale = scale_float(scale)
        cache = getattr(inputs, name)
        expected = torch.zeros(cache.shape, dtype=torch.float64)
        rows = fused_reference.quantized(values.cpu()[tokens], 1.0 / scale, cache.dtype)
        fused_reference.scatter_rows(expected, rows.reshape(heads), slots, case.block_size, case.layout)
        mask = rows_mask(ev["ref"].written.cpu(), expected, case.layout)
        exp = expected[mask]
        if not _within(cache.cpu().to(torch.float64)[mask], exp, fp8_bound(exp, exp.abs() * 2.0 ** -7, cache.dtype)):
            return False
    return True


def _key_cache_near_reference(check) -> bool:
    """The key cache's written rows hold the rotated k (within a bf16 value's rounding, in stored
    units): the cache is right whatever the live k returned."""
    ev = check.evidence
    cache, expected = ev["inputs"].key_cache, ev["ref"].caches["key_cache"].cpu()
    mask = rows_mask(ev["ref"].written.cpu(), expected, check.case.layout)
    exp = expected[mask]
    bound = exp.abs() * 2.0 ** -7 + 2.0 ** -20
    if is_fp8(cache.dtype):
        bound = fp8_bound(exp, exp.abs() * 2.0 ** -7, cache.dtype)
    return _within(cache.cpu().to(torch.float64)[mask], exp, bound)


def _bad_q_k(ev: dict, ref_q: torch.Tensor, ref_k: torch.Tensor) -> tuple:
    """(q's, k's elements past their bounds; None where that tensor was not compared): the check's
    own masks where the implementation declares other results (an FP8 q, no live k), else from the
    rotation's comparison."""
    if "q_bad" in ev:
        return ev["q_bad"], ev["k_bad"]
    rotation = ev["rotation"]
    q_bad = bad_elements(ev["q_out"], ref_q, rotation.bounds["query"]) if "query" in rotation.bounds else None
    k_bad = bad_elements(ev["k_out"], ref_k, rotation.bounds["key"]) if "key" in rotation.bounds else None
    return q_bad, k_bad


def _rotated_by_slots(check, q_bad, k_bad) -> bool:
    """q and k (where compared) within their bounds of the rotation at each slotted token's cache
    slot (within the table) in place of its position."""
    case, ev = check.case, check.evidence
    rotation, inputs, before = ev["rotation"], ev["inputs"], ev["before"]
    if rotation is None or "query" not in rotation.bounds:
        return False
    positions = inputs.positions.cpu()
    slots = inputs.slot_mapping.cpu().to(positions.dtype)
    n = slots.shape[0]
    if not n or bool((slots[slots >= 0] == positions[..., :n][..., slots >= 0]).all()):
        return False
    swapped = positions.clone()
    swapped[..., :n] = torch.where(slots >= 0, slots % inputs.cos_sin_cache.shape[0], swapped[..., :n])
    key = before["key"].cpu() if k_bad is not None else None
    table = inputs.cos_sin_cache.cpu()
    alt_q, alt_k = rotate(case.spec, swapped, before["query"].cpu(), key, table)
    k_out = ev["k_out"].cpu() if key is not None else None
    # Held to the bound of the rotation at the slots (a bound follows the values it bounds).
    return rotation_within_bound(case.spec, swapped, before["query"].cpu(), key, table, ev["q_out"].cpu(), k_out,
                                 alt_q, alt_k)


def _diagnose_cache(check) -> str:
    case, ev = check.case, check.evidence
    if "rotation" not in ev:
        return "qk_wrong"
    if ev["value_touched"]:
        return "value_touched"
    changed, padding = _kept_changed(check)
    if changed:
        return "padding_slot_written" if changed <= padding else "stale_slot_overwritten"
    before, k_out = ev["before"], ev["k_out"]
    q_bad, k_bad = _bad_q_k(ev, ev["ref"].query, ev["ref"].key)
    k_wrong = k_bad is None or bool(k_bad.any())
    q_wrong = q_bad is None or bool(q_bad.any())
    if k_wrong and not q_wrong and _key_cache_near_reference(check):
        same = k_out.shape == before["key"].shape and torch.equal(bits(k_out.detach().cpu()), bits(before["key"].cpu()))
        return "live_key_unrotated" if same else "live_key_wrong"
    if not q_wrong and not k_wrong and _scale_multiplied(check):
        return "fp8_scale_multiplied"
    total = case.num_q_heads + case.num_kv_heads
    if q_bad is not None and k_bad is not None and _partner_lost(case.spec, [(q_bad, 0), (k_bad, case.num_q_heads)],
                                                                  case.num_tokens, total):
        return "partner_lost_past_10240"
    if q_wrong and _rotated_by_slots(check, q_bad, k_bad):
        return "rotated_by_slots"
    if q_wrong or k_wrong:
        return "qk_wrong" if q_wrong and k_wrong else "q_wrong" if q_wrong else "k_wrong"
    return "key_cache_wrong" if ev["cache_bad"].get("key_cache") else "value_cache_wrong"


def _latent_holds(check, rows: torch.Tensor, scale) -> bool:
    """The latent cache's written rows hold ``rows`` [T, L + R] (float64, quantized with ``scale``),
    within a bf16 value's rounding in stored units."""
    case, ev = check.case, check.evidence
    cache = ev["inputs"].kv_cache
    tokens, slots = fused_reference.slot_rows(ev["inputs"].slot_mapping, case.num_tokens)
    expected = torch.zeros(cache.shape, dtype=torch.float64)
    fused_reference.scatter_rows(expected, fused_reference.quantized(rows[tokens], scale, cache.dtype), slots,
                                 case.block_size)
    mask = rows_mask(ev["ref"].written.cpu(), expected, "NHD")
    exp = expected[mask]
    bound = exp.abs() * 2.0 ** -7 + 2.0 ** -20
    if is_fp8(cache.dtype):
        bound = fp8_bound(exp, exp.abs() * 2.0 ** -7, cache.dtype)
    return _within(cache.cpu().to(torch.float64)[mask], exp, bound)


def _heads_read_packed(check, q_bad: torch.Tensor) -> bool:
    """A heads-major q whose q_pe is right at head 0 of every token and wrong at some later head."""
    case = check.case
    if case.q_layout != "heads_major" or case.num_heads < 2:
        return False
    per_head = q_bad.reshape(case.num_tokens, case.num_heads, -1).any(dim=-1)
    return not bool(per_head[:, 0].any()) and bool(per_head[:, 1:].any())


def _diagnose_mla(check) -> str:
    case, ev = check.case, check.evidence
    if "rotation" not in ev:
        return "qk_wrong"
    for label in ("q_nope_touched", "kv_c_touched"):
        if ev[label]:
            return label
    inputs, before, ref = ev["inputs"], ev["before"], ev["ref"]
    changed = int((changed_rows(before["kv_cache"], inputs.kv_cache, "NHD") & ~ref.written.cpu()).sum())
    if changed:
        slots = inputs.slot_mapping.cpu()
        padding = int((slots == -1).sum()) + case.num_tokens - slots.shape[0]
        return "padding_slot_written" if changed <= padding else "stale_slot_overwritten"
    q_bad, k_bad = _bad_q_k(ev, ref.query.reshape(case.num_tokens, -1), ref.key)
    q_wrong, k_wrong = q_bad is None or bool(q_bad.any()), k_bad is None or bool(k_bad.any())
    kv_c = before["kv_c"].cpu().to(torch.float64)
    if q_wrong and not k_wrong and _heads_read_packed(check, q_bad):
        return "heads_read_packed"
    if k_wrong and not q_wrong and _latent_holds(check, torch.cat((kv_c, ref.key.cpu()), dim=1), inputs.scale):
        same = ev["k_out"].shape == before["k_pe"].shape and torch.equal(bits(ev["k_out"].detach().cpu()),
                                                                          bits(before["k_pe"].cpu()))
        return "live_key_unrotated" if same else "live_key_wrong"
    if q_wrong or k_wrong:
        return "qk_wrong" if q_wrong and k_wrong else "q_wrong" if q_wrong else "k_wrong"
    unrotated = torch.cat((kv_c, before["k_pe"].cpu().to(torch.float64)), dim=1)
    if _latent_holds(check, unrotated, inputs.scale):
        return "cache_k_pe_unrotated"
    scale = scale_float(inputs.scale)
    if is_fp8(inputs.kv_cache.dtype) and _latent_holds(check, torch.cat((kv_c, ref.key.cpu()), dim=1), 1.0 / scale):
        return "fp8_scale_multiplied"
    return "kv_cache_wrong"


def diagnose(check) -> tuple[str, str]:
    """(label, sentence) of a failed check (rope.harness.fused.check.FusedCheck)."""
    if not check.evidence:
        return "qk_wrong", check.problems[0] if check.problems else LABELS["qk_wrong"]
    label = {"qk_norm_rope": _diagnose_qk_norm, "rope_kv_cache": _diagnose_cache,
             "mla_rope_kv_cache": _diagnose_mla}[check.op](check)
    return label, LABELS[label]

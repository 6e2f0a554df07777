"""A scheduler as a Hypothesis state machine: requests with multimodal prompts arrive, are
prefilled in chunks under a token budget, decode, finish, get preempted and re-added, and
reuse slots.  After every step, for every position implementation on every device:

* each scheduled request's prepared positions equal its whole-sequence positions (prompt
  positions from reference.position_ids, then n + delta), whatever the batching;
* rotating q/k with the step's positions gives, bit for bit, the same rows as rotating each
  request's whole sequence at once.

The runner's buffers (position table, delta, prompt lengths) persist across steps as in vLLM,
so a bug that corrupts them in one step (delta recomputed per chunk) shows up in a later one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import settings, strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from reference.position_ids import decode_positions, prompt_positions
from rope.prompts import Image, Prompt, Text, Video, family_num_dims
from rope.devices import synchronize, torch_device, triton_runs_on
from rope.registry import get_implementation, get_positions_implementation, positions_unsupported_reason
from rope.spec import RopeSpec

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v", "hunyuan_ocr", "hunyuan_ocr_3d")
MAX_SLOTS, MAX_MODEL_LEN, CACHE_LEN, HEADS, HEAD_SIZE = 4, 80, 2048, 2, 32


def family_spec(family: str) -> RopeSpec:
    if family == "hunyuan_ocr":
        return RopeSpec(HEAD_SIZE, HEAD_SIZE, True, (4, 4, 4, 4), "chunked", 10000.0, CACHE_LEN, ntk_alpha=1000.0)
    layout = "interleaved" if family == "qwen3_vl" else "chunked"
    return RopeSpec(HEAD_SIZE, HEAD_SIZE, family != "glm4v", (6, 5, 5), layout, 10000.0, CACHE_LEN)


def prompts(family: str):
    """Short multimodal prompts (text, images, videos where the family has them)."""
    grid = st.tuples(st.integers(1, 3), st.integers(1, 3)).map(lambda hw: (2 * hw[0], 2 * hw[1]))
    segment = st.one_of(
        st.integers(1, 6).map(Text),
        grid.map(lambda hw: Image((1, *hw))),
        *([] if family.startswith("hunyuan") else [st.builds(
            lambda t, hw, spg: Video((t, *hw), second_per_grid=spg),
            st.integers(1, 3), grid, st.sampled_from([1.0, 0.5, 2.0]))]))
    return st.lists(segment, min_size=1, max_size=3).map(lambda segs: Prompt(tuple(segs)))


@dataclass
class Request:
    rid: int
    prompt: Prompt
    max_new: int
    seed: int
    slot: int | None = None
    computed: int = 0               # tokens whose positions were prepared (host truth)
    generated: int = 0              # decode tokens prepared so far
    prefill_len: int = 0
    delta: int = 0
    whole: torch.Tensor | None = field(default=None, repr=False)   # positions of all MAX_MODEL_LEN tokens


def make_machine(positions_impl: str, device: str, family: str):
    prepare = get_positions_implementation(positions_impl)
    # The compiled kernel on GPUs; the (bitwise row-independent) native path on the CPU, where the
    # interpreter would make every step cost seconds.
    rotate_name = "triton" if device != "cpu" and triton_runs_on(device) else "native"
    rotate = get_implementation(rotate_name)
    spec = family_spec(family)
    dims = family_num_dims(family)
    dev = torch_device(device)
    cache = __import__("rope").cos_sin_cache(spec, torch.float32, dev)

    class Scheduler(RuleBasedStateMachine):
        waiting = Bundle("waiting")

        def __init__(self):
            super().__init__()
            i32 = dict(dtype=torch.int32, device=dev)
            self.table = torch.full((MAX_SLOTS * dims, MAX_MODEL_LEN), -1, **i32)   # stale rows stay
            self.delta = torch.zeros(MAX_SLOTS, **i32)
            self.prefill_lens = torch.zeros(MAX_SLOTS, **i32)
            self.running: dict[int, Request] = {}
            self.preempted: list[Request] = []
            self.free = list(range(MAX_SLOTS))
            self.next_id = 0
            self.steps = 0

        # ---------------------------------------------------------------- lifecycle
        def _admit(self, req: Request, slot: int, prompt: Prompt) -> None:
            pp = prompt_positions(family, prompt)
            req.slot, req.computed, req.prefill_len, req.delta = slot, 0, pp.length, pp.delta
            tail = decode_positions(pp.length, MAX_MODEL_LEN - pp.length, pp.delta, dims)
            whole = torch.cat([pp.positions, tail], dim=1)
            if req.whole is not None:   # re-added after preemption: same positions as before
                assert torch.equal(whole, req.whole), "re-prefilled prompt + outputs changed the positions"
            req.whole = whole
            self.table[dims * slot:dims * (slot + 1), :pp.length] = pp.positions.to(self.table)
            self.delta[slot], self.prefill_lens[slot] = pp.delta, pp.length
            self.free.remove(slot)
            self.running[req.rid] = req

        @precondition(lambda self: self.free)
        @rule(data=st.data(), prompt=st.deferred(lambda: prompts(family)), max_new=st.integers(1, 6),
              seed=st.integers(0, 2 ** 16))
        def add_request(self, data, prompt, max_new, seed):
            if prompt_positions(family, prompt).length + max_new > MAX_MODEL_LEN:
                return
            slot = data.draw(st.sampled_from(self.free), label="slot")
            req = Request(self.next_id, prompt, max_new, seed)
            self.next_id += 1
            self._admit(req, slot, prompt)

        @precondition(lambda self: self.running)
        @rule(data=st.data(), budget=st.integers(1, 24))
        def step(self, data, budget):
            order = data.draw(st.permutations(sorted(self.running)), label="order")
            scheduled = []
            for rid in order:
                req = self.running[rid]
                total = req.prefill_len + req.max_new
                if req.computed >= total or budget == 0:
                    continue
                if req.computed < req.prefill_len:     # (chunked) prefill never crosses into decode
                    n = min(budget, req.prefill_len - req.computed, data.draw(st.integers(1, 16), label="chunk"))
                else:
                    n = 1
                scheduled.append((req, n))
                budget -= n
            if not scheduled:
                return
            slots = [r.slot for r, _ in scheduled]
            starts = [0]
            for _, n in scheduled:
                starts.append(starts[-1] + n)
            computed = torch.zeros(MAX_SLOTS, dtype=torch.int32)
            for r, _ in scheduled:
                computed[r.slot] = r.computed
            num_tokens = starts[-1]
            out = torch.full((dims, num_tokens + 2), -9, dtype=torch.int64, device=dev)
            prepare(self.table, self.delta, torch.tensor(slots, dtype=torch.int32, device=dev),
                    torch.tensor(starts, dtype=torch.int32, device=dev), self.prefill_lens, computed.to(dev), dims, out)
            synchronize(device)
            got = out.cpu()
            expected = torch.cat([r.whole[:, r.computed:r.computed + n] for r, n in scheduled], dim=1)
            assert torch.equal(got[:, :num_tokens], expected), (
                f"step {self.steps}: prepared positions {got[:, :num_tokens].tolist()} != whole-sequence "
                f"positions {expected.tolist()} for (request, slot, computed, tokens) "
                f"{[(r.rid, r.slot, r.computed, n) for r, n in scheduled]}")
            assert torch.all(got[:, num_tokens:] == -9), f"step {self.steps}: wrote past the step's tokens"
            self._check_rotation(scheduled, got[:, :num_tokens])
            for r, n in scheduled:
                r.computed += n
                r.generated = max(0, r.computed - r.prefill_len)
            self.steps += 1

        def _check_rotation(self, scheduled, positions):
            qs = [self._q(r)[r.computed:r.computed + n] for r, n in scheduled]
            step_pos = positions.to(dev) if dims > 1 else positions[0].to(dev)
            q_step, _ = rotate(spec, step_pos.contiguous(), torch.cat(qs).to(dev), None, cache)
            offset = 0
            for (r, n), q in zip(scheduled, qs):
                whole_pos = r.whole[:, :r.computed + n].to(dev)
                q_whole, _ = rotate(spec, whole_pos.contiguous(), self._q(r)[:r.computed + n].to(dev), None, cache)
                assert torch.equal(q_step[offset:offset + n].cpu(), q_whole[r.computed:].cpu()), (
                    f"{rotate_name}: rotating request {r.rid}'s tokens in a batch differs from rotating its "
                    f"whole sequence")
                offset += n

        @staticmethod
        def _q(r: Request) -> torch.Tensor:
            g = torch.Generator().manual_seed(r.seed)
            return torch.randn(MAX_MODEL_LEN, HEADS * HEAD_SIZE, generator=g)

        @precondition(lambda self: any(r.computed >= r.prefill_len + r.max_new for r in self.running.values()))
        @rule(data=st.data())
        def finish(self, data):
            done = [rid for rid, r in self.running.items() if r.computed >= r.prefill_len + r.max_new]
            req = self.running.pop(data.draw(st.sampled_from(done), label="finished"))
            self.free.append(req.slot)

        @precondition(lambda self: self.running)
        @rule(data=st.data())
        def preempt(self, data):
            # Recompute-style preemption: the request drops its slot and will prefill its prompt
            # plus the tokens it already generated (as text) again.
            req = self.running.pop(data.draw(st.sampled_from(sorted(self.running)), label="preempted"))
            self.free.append(req.slot)
            self.preempted.append(req)

        @precondition(lambda self: self.preempted and self.free)
        @rule(data=st.data())
        def readd(self, data):
            req = self.preempted.pop(data.draw(st.integers(0, len(self.preempted) - 1), label="which"))
            produced = max(0, req.computed - req.prefill_len)
            segments = req.prompt.segments + ((Text(produced),) if produced else ())
            req.prompt, req.max_new = Prompt(segments), req.max_new - produced
            self._admit(req, data.draw(st.sampled_from(self.free), label="slot"), req.prompt)

        @invariant()
        def slots_are_exclusive(self):
            used = [r.slot for r in self.running.values()]
            assert len(used) == len(set(used)) and not set(used) & set(self.free)

    return Scheduler


@pytest.mark.parametrize("family", FAMILIES)
def test_scheduler_positions_match_whole_sequence(positions_impl_name, device, family):
    fn = get_positions_implementation(positions_impl_name)
    reason = positions_unsupported_reason(positions_impl_name, fn, device)
    if reason:
        pytest.skip(reason)
    machine = make_machine(positions_impl_name, device, family)
    run_state_machine_as_test(machine, settings=settings(stateful_step_count=25))


@pytest.mark.fixed_cases
def test_known_bug_triggers_chunked_prefill_keeps_the_prompt_delta(positions_impl_name, device):
    # A prompt prefilled in two chunks whose last chunk is text only, then one decode step: the
    # decode position must carry the whole prompt's delta (vLLM computes it once per prompt), not
    # a delta worked out from the last chunk alone.  The state machine above finds this too, after
    # a search; this fixed case finds it at once.  Qwen2-VL: Text(2), a 2x2-merged image between
    # its vision start/end tokens, Text(3): t = 0 1 | 2 3 3 3 3 5 | 6 7 8, 11 tokens, delta -2; the
    # text-only chunk alone would give +6.
    fn = get_positions_implementation(positions_impl_name)
    reason = positions_unsupported_reason(positions_impl_name, fn, device)
    if reason:
        pytest.skip(reason)
    family, dims = "qwen2_vl", 3
    pp = prompt_positions(family, Prompt((Text(2), Image((1, 4, 4)), Text(3))))
    assert pp.length == 11 and pp.delta == -2      # the case is what it says
    dev = torch_device(device)
    i32 = dict(dtype=torch.int32, device=dev)
    table = torch.full((dims, MAX_MODEL_LEN), -1, **i32)
    table[:, :pp.length] = pp.positions.to(table)
    delta, lens = torch.tensor([pp.delta], **i32), torch.tensor([pp.length], **i32)
    expected = torch.cat([pp.positions, decode_positions(pp.length, 1, pp.delta, dims)], dim=1)
    computed = 0
    for n in (8, 3, 1):                                  # image chunk, text-only chunk, decode
        out = torch.full((dims, n), -9, dtype=torch.int64, device=dev)
        fn(table, delta, torch.tensor([0], **i32), torch.tensor([0, n], **i32), lens,
           torch.tensor([computed], **i32), dims, out)
        synchronize(device)
        assert torch.equal(out.cpu(), expected[:, computed:computed + n]), (
            f"tokens {computed}..{computed + n - 1}: prepared {out.cpu().tolist()}, "
            f"whole-sequence {expected[:, computed:computed + n].tolist()}")
        computed += n

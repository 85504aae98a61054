"""flashattn.plan: the analytic cost of a problem from its shapes alone (no arrays)."""
import re
from fractions import Fraction

import numpy as np

from . import _native
from ._problem import (combined_bias_dims, empty_dims, flag, library_bias_scale, make_options, make_problem,
                       public_dtype)
from .masks import Mask, build_for_call

_UNITS = "KMGTPE"  # powers of 1024, as the CLI's --memory-budget (tools/cli_args.c, cli_parse_bytes)
# digits, a fraction, then a unit letter (either case) with "iB" or "B" after it, or "B" alone
_BYTES = re.compile(r"([0-9]*)(?:\.([0-9]*))?(?:([KMGTPEkmgtpe])(?:iB|B)?|B)?")  # ASCII digits only, as the CLI


def parse_bytes(budget):
    """A byte count >= 0: an int, or a string of digits with an optional fraction and a K, M,
    G, T, P or E suffix (powers of 1024; "iB" or "B" after it allowed), taken exactly as the
    CLI takes it: a whole number of bytes from 0 to 2**63 - 1 (1.5K is 1536; 1.3K, a fraction
    of a byte, and anything past 2**63 - 1 are refused)."""
    if isinstance(budget, str):
        m = _BYTES.fullmatch(budget)
        if not m or not (m.group(1) or m.group(2)):
            raise ValueError(f"memory budget {budget!r} is not a number with an optional K/M/G/T/P/E suffix")
        value = Fraction(f"{m.group(1) or 0}.{m.group(2) or 0}") * (1 << 10 * (_UNITS.index(m.group(3).upper()) + 1)
                                                                    if m.group(3) else 1)
        if value.denominator != 1:  # as the CLI's --memory-budget: 1.5K is 1536, 1.3K no whole number
            raise ValueError(f"memory budget {budget!r} is not a whole number of bytes (1.5K is 1536; 1.3K is refused)")
        if value >= 2**63:
            raise ValueError(f"memory budget {budget!r} must be a byte count from 0 to 2**63 - 1")
        return int(value)
    if isinstance(budget, bool) or not hasattr(budget, "__index__"):
        raise ValueError(f"memory budget must be bytes (int) or a string like '24G', got {budget!r}")
    if not 0 <= int(budget) < 2**63:
        raise ValueError(f"memory budget {budget!r} must be a byte count from 0 to 2**63 - 1")
    return int(budget)


class Plan:
    """A validated problem and what each pass costs (docs/semantics.md, "The plan and what
    its figures mean").

    forward, backward: dicts of every fa_cost field (flops, flops_useful, transcendentals,
    bytes_accessed, min_bytes, workspace_bytes, peak_bytes, naive_peak_bytes); backward is
    None for a plan the library runs no backward of (kv-cache decoding, lengths per call:
    docs/semantics.md, "A plan with no backward"), and so is blocks["backward"].
    exact: whether the figures are exact (False with segment ids: an upper bound; False with
    a mask: its hidden keys are data, so flops_useful counts them, an upper bound, while
    flops, bytes and memory stay exact). A problem with a zero batch, heads, seq_q or seq_k
    plans as computing nothing (flops 0; bytes: the outputs filled).
    backend: "cpu" or "cuda". blocks: {"forward": (block_q, block_k), "backward": (...)}.
    """

    def __init__(self, handle, masked=False, mask=None):
        self._handle = handle
        self.mask = mask  # the flashattn.masks mask's library object (the plan holds its own reference too)
        self.forward = handle.cost(_native.FORWARD)
        backward_blocks = handle.blocks(_native.BACKWARD)
        none = backward_blocks == (0, 0)  # the library's sign of a plan with no backward
        self.backward = None if none else handle.cost(_native.BACKWARD)
        self.exact = handle.exact and not masked
        self.backend = handle.backend
        self.blocks = {"forward": handle.blocks(_native.FORWARD), "backward": None if none else backward_blocks}
        self.threads = handle.threads
        self.scale = handle.scale

    def cost_lengths(self, cache_seqlens=None, cu_seqlens_q=None, cu_seqlens_k=None, pass_="forward"):
        """The exact cost (a dict like .forward) of one call of a lengths-per-call plan with
        these lengths (fa_plan_cost_lengths); a plan made with lengths takes only its own."""
        from ._problem_inference import int32_lengths
        B = self._handle.problem.batch
        arrays = []
        for n, a, size in (("cache_seqlens", cache_seqlens, B), ("cu_seqlens_q", cu_seqlens_q, B + 1),
                           ("cu_seqlens_k", cu_seqlens_k, B + 1)):
            want = f"[{'batch' if size == B else 'batch + 1'}] = [{size}]"
            a = None if a is None else int32_lengths(n, a, want)
            if a is not None and a.shape[0] != size:  # the library reads exactly size entries
                raise ValueError(f"{n} must have shape {want} (the plan's batch is {B}), got {a.shape}")
            arrays.append(a)
        if pass_ not in ("forward", "backward"):
            raise ValueError(f"pass_ must be 'forward' or 'backward', got {pass_!r}")
        if pass_ == "backward" and self.backward is None:
            return None  # no backward, as .backward says
        which = _native.FORWARD if pass_ == "forward" else _native.BACKWARD
        return self._handle.cost_lengths(which, *arrays)

    def fits(self, budget_bytes, pass_="forward"):
        """Whether the flash kernel's peak memory for pass_ ("forward", "backward" or
        "both") is within budget_bytes (an int, or a string like "24G")."""
        budget = parse_bytes(budget_bytes)
        if pass_ not in ("forward", "backward", "both"):
            raise ValueError(f"pass_ must be 'forward', 'backward' or 'both', got {pass_!r}")
        passes = ("forward", "backward") if pass_ == "both" else (pass_,)
        if "backward" in passes and self.backward is None:
            raise ValueError("this plan has no backward (kv-cache decoding or lengths per call): "
                             "ask fits(budget, 'forward')")
        return all(getattr(self, p)["peak_bytes"] <= budget for p in passes)

    def naive_fits(self, budget_bytes):
        """Whether the naive reference (full score matrix) would fit budget_bytes."""
        return self.forward["naive_peak_bytes"] <= parse_bytes(budget_bytes)

    def as_dict(self):
        return {"backend": self.backend, "exact": self.exact, "blocks": self.blocks,
                "threads": self.threads, "scale": self.scale,
                "forward": dict(self.forward), "backward": None if self.backward is None else dict(self.backward)}

    def __repr__(self):
        f = self.forward
        return (f"Plan(backend={self.backend!r}, exact={self.exact}, blocks={self.blocks}, "
                f"forward flops={f['flops']}, peak_bytes={f['peak_bytes']})")


def plan(*, batch, heads, seq_q, head_dim, seq_k=None, head_dim_v=None, kv_heads=None,
         dtype="f32", causal=False, window=(-1, -1), softcap=0.0, scale=None,
         bias_shape=None, alibi=False, segment_ids=False, backend="auto",
         threads=0, block_q=0, block_k=0, diag_offset=None, bias_scale=None, bias_grad=False,
         mask_shape=None, sinks=False, mask=None, dropout_p=None, seed=None, dropout_offset=None):
    """Plans attention for q [batch, heads, seq_q, head_dim], k [batch, kv_heads, seq_k,
    head_dim], v [batch, kv_heads, seq_k, head_dim_v] from shapes alone: microseconds, no
    allocation of the problem's size. Bad arguments raise ValueError with the library's
    message (every integer must fit int64, threads int32). Beyond the issue's signature:
    threads, block sizes, diag_offset (where masks align: 0 is top-left), bias_scale and
    bias_grad (the backward writes dbias). bias_shape and mask_shape (a boolean mask=,
    which the fronts pass as a 0 / -inf bias): broadcastable to [batch, heads, seq_q, seq_k];
    with a mask the plan is not exact (see Plan). sinks: the problem has attention sinks
    (one more exp per row in the forward, and per row for dsink in the backward). mask: a
    flashattn.masks mask, built by the library as a block-sparse mask, so the plan stays
    exact (flops count the blocks that run, flops_useful the visible pairs); or a boolean
    array, planned as attention(mask=array) runs it, a 0 / -inf bias (as mask_shape=: not
    exact). masks.from_array(array) is the block-sparse form of an array, for both.
    dropout_p, seed, dropout_offset: as attention takes them (dropout_p > 0 needs a seed),
    judged by the library with the backend (one that has no dropout refuses it here); they
    change no figure (docs/semantics.md, "Dropout")."""
    causal, bias_grad = flag("causal", causal), flag("bias_grad", bias_grad)
    for name, present in (("alibi", alibi), ("segment_ids", segment_ids), ("sinks", sinks)):
        try:  # whether the call has them: an array here (as flashattn.jax.plan takes) is not a flag
            flag(name, present)
        except ValueError:
            raise ValueError(f"{name} is a flag here (True or False: whether the call has it), got "
                             f"{type(present).__name__}") from None
    seq_k = seq_q if seq_k is None else seq_k
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    kv_heads = heads if kv_heads is None else kv_heads
    if mask is not None and mask_shape is not None:
        raise ValueError("pass mask= or mask_shape=, not both")
    if mask is not None and not isinstance(mask, Mask):
        # a boolean array, as attention(mask=array) passes it: a 0 / -inf bias (the plan of the
        # call with the same arguments; it was planned as masks.from_array, which the call is not)
        if np.asarray(mask).dtype != np.bool_:
            raise TypeError(f"mask must be a flashattn.masks mask or a boolean array (True: attend), got dtype "
                            f"{np.asarray(mask).dtype}")
        mask, mask_shape = None, np.shape(mask)
    if bias_grad and bias_shape is None:  # as the call refuses it: a boolean mask's 0 / -inf bias has no gradient
        raise ValueError("bias_grad needs a bias (bias_shape=); a mask is not one")
    bias_scale = library_bias_scale(bias_scale, bias_shape is not None, mask_shape is not None)  # as the call's
    if bias_shape is not None or mask_shape is not None:
        bias_shape = combined_bias_dims(bias_shape, mask_shape, batch, heads, seq_q, seq_k)
    built = None
    if mask is not None:
        built = build_for_call(mask, batch, heads, seq_q, seq_k, diag_offset=diag_offset,
                               empty=empty_dims(batch, heads, kv_heads, seq_q, seq_k))
    p = make_problem(q_dims=(batch, heads, seq_q, head_dim), k_dims=(batch, kv_heads, seq_k, head_dim),
                     v_dims=(batch, kv_heads, seq_k, head_dim_v), dtype=public_dtype(dtype), causal=causal,
                     window=window, softcap=softcap, scale=scale, bias_shape=bias_shape,
                     alibi=alibi, segment_ids=segment_ids, diag_offset=diag_offset,
                     bias_scale=bias_scale, bias_grad=bias_grad, sinks=sinks,
                     mask=None if built is None else built.ptr, dropout_p=dropout_p, seed=seed,
                     dropout_offset=dropout_offset)
    options = make_options(backend, threads, block_q, block_k)
    return Plan(_native.plan_handle(p, options), masked=mask_shape is not None, mask=built)

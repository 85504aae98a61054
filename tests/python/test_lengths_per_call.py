"""Lengths per call in the numpy front: a decode loop runs on one plan (made from
capacities, the lengths passed with each step), each step against the float64 reference;
plan_kvcache's capacity plan gives each step's exact cost; flashattn.merge_states against
float64 states computed from their scores."""
import numpy as np
import pytest

import flashattn
from flashattn import _native
import reference_inference as ref
from conftest import check, np_dtype, randn


def test_decode_loop_reuses_one_plan(rng):
    B, S, Hq, Hk, D = 3, 64, 4, 2, 16
    kc, vc = randn(rng, (B, S, Hk, D)), randn(rng, (B, S, Hk, D))
    lens = np.array([0, 9, 30], np.int32)
    plans = None
    for step in range(12):
        q, kn, vn = randn(rng, (B, 1, Hq, D)), randn(rng, (B, 1, Hk, D)), randn(rng, (B, 1, Hk, D))
        o = flashattn.kvcache_attention(q, kc, vc, kn, vn, cache_seqlens=lens, causal=True)
        if step == 0:
            plans = len(_native._PLAN_CACHE)
        assert len(_native._PLAN_CACHE) == plans, "a decode step made a new plan"
        lens = lens + 1
        o_ref, _ = ref.decode(q, [kc[b, :lens[b]] for b in range(B)], [vc[b, :lens[b]] for b in range(B)])
        check("o", o, o_ref, 1e-5)


def test_capacity_plan_costs_each_step_exactly():
    kw = dict(seq_q=1, heads=8, kv_heads=2, head_dim=32, cache_len=256, new_kv=True, dtype="bf16", causal=True)
    one = flashattn.plan_kvcache(None, batch=3, **kw)
    for lens in ([0, 5, 100], [17, 200, 255]):
        assert one.cost_lengths(cache_seqlens=lens) == flashattn.plan_kvcache(lens, **kw).forward
    full = flashattn.plan_kvcache([255] * 3, **kw).forward
    assert one.forward == full  # the plan's own figures: every cache full
    # ... the capacity's, not a call's: not exact (a call's exact cost is cost_lengths)
    assert not one.exact and flashattn.plan_kvcache([255] * 3, **kw).exact
    assert not flashattn.plan_varlen(None, None, batch=2, heads=2, head_dim=8, total_q=16, total_k=16).exact
    with pytest.raises(ValueError, match=r"cache_seqlens\[1\] = 256 plus 1 new tokens exceeds"):
        one.cost_lengths(cache_seqlens=[0, 256, 0])
    fixed = flashattn.plan_kvcache([1, 2, 3], **kw)
    with pytest.raises(ValueError, match=r"cache_seqlens\[2\] = 4 but the plan was made with 3"):
        fixed.cost_lengths(cache_seqlens=[1, 2, 4])


def test_capacity_plans_describe_sinks_and_a_shared_prefix():
    """plan_kvcache and plan_varlen take what their calls may have: sinks (one more exp per
    row) and a shared prefix (its keys ahead of every sequence's: the useful flops of the
    same batch with the prefix copied into each cache)."""
    kw = dict(seq_q=1, heads=8, kv_heads=2, head_dim=32, dtype="bf16", causal=True)
    lens = np.array([0, 5, 100], np.int32)
    base = flashattn.plan_kvcache(lens, cache_len=256, **kw).forward
    sinks = flashattn.plan_kvcache(lens, cache_len=256, sinks=True, **kw).forward
    assert sinks["transcendentals"] == base["transcendentals"] + 3 * 8 * 1
    cap = flashattn.plan_kvcache(None, batch=3, cache_len=256, sinks=True, **kw)
    assert cap.cost_lengths(cache_seqlens=lens)["transcendentals"] == sinks["transcendentals"]
    prefix = flashattn.plan_kvcache(lens, cache_len=256, prefix_len=40, **kw).forward
    copied = flashattn.plan_kvcache(lens + 40, cache_len=296, **kw).forward
    assert prefix["flops_useful"] == copied["flops_useful"]
    cu = np.array([0, 3, 10], np.int32)
    v = flashattn.plan_varlen(cu, cu, heads=4, head_dim=16, sinks=True)
    assert v.forward["transcendentals"] == flashattn.plan_varlen(cu, cu, heads=4, head_dim=16).forward[
        "transcendentals"] + 4 * 10


def _state(s, v):
    """float64 state of scores s [..., K] and values v [..., K, Dv]."""
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - m)
    lse = (m[..., 0] + np.log(p.sum(-1)))
    return np.einsum("...k,...kd->...d", p, v) / p.sum(-1)[..., None], lse


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("sinks", [False, True])
def test_merge_states_matches_float64(rng, dtype, sinks):
    R, H, K, Dv, cut = 6, 4, 30, 16, 11
    s = rng.standard_normal((R, H, K)) * 3
    v = rng.standard_normal((R, H, K, Dv))
    sink = rng.standard_normal(H) if sinks else None
    oa, la = _state(s[..., :cut], v[..., :cut, :])
    ob, lb = _state(s[..., cut:], v[..., cut:, :])
    dt = np_dtype(dtype)
    o, lse = flashattn.merge_states(oa.astype(dt), la.astype(np.float32), ob.astype(dt), lb.astype(np.float32),
                                    sinks=None if sink is None else sink.astype(np.float32))
    full = np.concatenate([s, np.broadcast_to(sink[None, :, None], (R, H, 1))], -1) if sinks else s
    vz = np.concatenate([v, np.zeros((R, H, 1, Dv))], -2) if sinks else v  # a sink has no value
    o_ref, lse_ref = _state(full, vz)
    assert o.dtype == dt and lse.dtype == np.float32
    check("o", o, o_ref, {"f32": 1e-6, "f16": 2 * 2.0**-11, "bf16": 2 * 2.0**-8}[dtype])
    assert np.abs(lse - lse_ref).max() <= 1e-5 * (1 + np.abs(lse_ref).max())


def test_merge_states_empty_and_bad_input():
    o = np.full((2, 1, 3), np.nan, np.float32)
    la = np.array([[-np.inf], [0.5]], np.float32)
    lb = np.full((2, 1), -np.inf, np.float32)
    good = np.ones((2, 1, 3), np.float32)
    out, lse = flashattn.merge_states(o, la, good, lb)  # row 0: both empty; row 1: a alone (o NaN read?)
    assert (out[0] == 0).all() and lse[0, 0] == -np.inf
    assert np.isnan(out[1]).all() and lse[1, 0] == np.float32(0.5)  # a's own o (NaN here) with weight 1
    with pytest.raises(ValueError, match=r"lse_b must have shape"):
        flashattn.merge_states(good, la, good, lb[:1])
    with pytest.raises(ValueError, match=r"sinks\[0\] is nan"):
        flashattn.merge_states(good, la, good, lb, sinks=np.array([np.nan], np.float32))


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_shared_prefix_equals_the_unshared_batch(rng, dtype):
    """kvcache_attention with k_prefix/v_prefix equals the prefix copied in front of every
    cache, and the float64 reference."""
    B, P, S, Hq, Hk, D = 4, 600, 48, 8, 2, 32
    kp, vp = randn(rng, (P, Hk, D), dtype), randn(rng, (P, Hk, D), dtype)
    kc, vc = randn(rng, (B, S, Hk, D), dtype), randn(rng, (B, S, Hk, D), dtype)
    q, kn, vn = randn(rng, (B, 1, Hq, D), dtype), randn(rng, (B, 1, Hk, D), dtype), randn(rng, (B, 1, Hk, D), dtype)
    lens = np.array([0, 5, 20, 47], np.int32)
    uk = np.concatenate([np.broadcast_to(kp, (B, P, Hk, D)), kc], 1).copy()
    uv = np.concatenate([np.broadcast_to(vp, (B, P, Hk, D)), vc], 1).copy()
    o_u = flashattn.kvcache_attention(q, uk, uv, kn, vn, cache_seqlens=lens + P, causal=True)
    o = flashattn.kvcache_attention(q, kc, vc, kn, vn, cache_seqlens=lens, causal=True, k_prefix=kp, v_prefix=vp)
    tol = {"f32": 1e-5, "bf16": 2e-2}[dtype]
    check("o vs unshared", o, o_u.astype(np.float32), tol)
    n = lens + 1
    o_ref, _ = ref.decode(q, [uk[b, :P + n[b]] for b in range(B)], [uv[b, :P + n[b]] for b in range(B)], causal=True)
    check("o", o, o_ref, tol)
    with pytest.raises(ValueError, match="k_prefix and v_prefix"):
        flashattn.kvcache_attention(q, kc, vc, cache_seqlens=lens, k_prefix=kp)


def test_torch_merge_states_equals_numpy(rng):
    torch = pytest.importorskip("torch")
    import flashattn.torch as ft
    oa, ob = rng.standard_normal((2, 5, 3, 8)).astype(np.float32)
    la, lb = (rng.standard_normal((2, 5, 3)) * 4).astype(np.float32)
    la[0, 0] = -np.inf
    sinks = rng.standard_normal(3).astype(np.float32)
    o, lse = flashattn.merge_states(oa, la, ob, lb, sinks=sinks)
    to, tl = ft.merge_states(*(torch.from_numpy(x) for x in (oa, la, ob, lb)), sinks=torch.from_numpy(sinks))
    assert np.array_equal(to.numpy(), o) and np.array_equal(tl.numpy(), lse)
    tb, _ = ft.merge_states(torch.from_numpy(oa).bfloat16(), torch.from_numpy(la), torch.from_numpy(ob).bfloat16(),
                            torch.from_numpy(lb))
    assert tb.dtype == torch.bfloat16
    # lse and sinks of any real dtype, converted as numpy's merge_states converts them
    t64 = [torch.from_numpy(x) for x in (oa, la.astype(np.float64), ob, lb.astype(np.float64))]
    o64, l64 = ft.merge_states(*t64, sinks=torch.from_numpy(sinks.astype(np.float64)))
    assert np.array_equal(o64.numpy(), o) and np.array_equal(l64.numpy(), lse)
    # not differentiable: inputs that require grad are refused, not detached (no_grad merges)
    oa_t = torch.from_numpy(oa).requires_grad_()
    with pytest.raises(RuntimeError, match=r"merge_states is not differentiable, but o_a require grad"):
        ft.merge_states(oa_t, *(torch.from_numpy(x) for x in (la, ob, lb)))
    with torch.no_grad():
        og, _ = ft.merge_states(oa_t, *(torch.from_numpy(x) for x in (la, ob, lb)))
    assert not og.requires_grad
    with pytest.raises(ValueError, match="lse_a must be real numbers"):
        ft.merge_states(torch.from_numpy(oa), torch.from_numpy(la).bool(), torch.from_numpy(ob), torch.from_numpy(lb))
    args = [torch.from_numpy(x) for x in (oa, la, ob, lb)]
    for i, name in enumerate(("o_a", "lse_a", "o_b", "lse_b")):  # None was an AttributeError
        with pytest.raises(ValueError, match=f"{name} must be a CPU tensor, got NoneType"):
            ft.merge_states(*args[:i], None, *args[i + 1:])


def test_merge_states_shape_errors_are_the_same_words_in_numpy_and_torch(rng):
    """One rule and one wording for merge_states' shapes (_merge.check_merge_shapes): numpy's
    and torch's had their own checks and messages."""
    torch = pytest.importorskip("torch")
    import flashattn.torch as ft
    o = rng.standard_normal((2, 3, 4)).astype(np.float32)
    lse = rng.standard_normal((2, 3)).astype(np.float32)
    bad = [((o.astype(np.float16), lse, o, lse), None, r"o_a and o_b must have one shape and dtype, got \(2, 3, 4\) "),
           ((o[:1], lse, o, lse), None, "o_a and o_b must have one shape and dtype"),
           ((o[0, 0], lse[0], o[0, 0], lse[0]), None, r"o_a and o_b must be \[\.\.\., H, Dv\], got shape \(4,\)"),
           ((o, lse[:, :2], o, lse), None, r"lse_a must have shape \(2, 3\) \(\[\.\.\., H\] of o's \[\.\.\., H, Dv\]\), "
                                           r"got \(2, 2\)"),
           ((o, lse, o, lse[0]), None, r"lse_b must have shape \(2, 3\)"),
           ((o, lse, o, lse), np.zeros(2, np.float32), r"sinks must have shape \[H\] = \[3\], got \(2,\)")]
    for args, sinks, match in bad:
        with pytest.raises(ValueError, match=match) as theirs:
            flashattn.merge_states(*args, sinks=sinks)
        with pytest.raises(ValueError) as ours:
            ft.merge_states(*(torch.from_numpy(np.ascontiguousarray(x)) for x in args),
                            sinks=None if sinks is None else torch.from_numpy(sinks))
        assert str(ours.value).replace("torch.", "") == str(theirs.value), (str(ours.value), str(theirs.value))


def test_merge_states_rounds_through_float32(rng):
    """bf16 and f16 merges are the double result rounded to f32, then to the dtype
    (docs/semantics.md; the header and the numpy docstring said rounded once)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    oa, ob = rng.standard_normal((2, 4096, 2, 8)).astype(np.float32)
    la, lb = (rng.standard_normal((2, 4096, 2)) * 3).astype(np.float32)
    for dt in (np.float16, ml_dtypes.bfloat16):
        a, b = oa.astype(dt), ob.astype(dt)
        o, _ = flashattn.merge_states(a, la, b, lb)
        m = np.maximum(la, lb).astype(np.float64)[..., None]
        wa, wb = np.exp(la[..., None] - m), np.exp(lb[..., None] - m)
        want = ((wa * a.astype(np.float64) + wb * b.astype(np.float64)) / (wa + wb)).astype(np.float32).astype(dt)
        assert np.array_equal(o.astype(np.float32), want.astype(np.float32))


def test_cost_lengths_checks_the_arrays_against_the_plans_batch():
    """cost_lengths read as many entries as the plan's batch from whatever array it got: one
    too short was read past its end (garbage lengths, or a cost with no error), and a view
    of a longer buffer was priced as the buffer. Now ValueError naming the shape."""
    import numpy as np
    import flashattn
    p = flashattn.plan_kvcache(None, batch=4, seq_q=1, heads=2, kv_heads=2, head_dim=8, cache_len=64)
    buf = np.array([10, 20, 30, 40], np.int32)
    with pytest.raises(ValueError, match=r"cache_seqlens must have shape \[batch\] = \[4\]"):
        p.cost_lengths(cache_seqlens=buf[:1])
    assert p.cost_lengths(cache_seqlens=buf)["flops"] > 0
    v = flashattn.plan_varlen(None, None, batch=2, heads=2, head_dim=8, total_q=16, total_k=16)
    with pytest.raises(ValueError, match=r"cu_seqlens_q must have shape \[batch \+ 1\] = \[3\]"):
        v.cost_lengths(cu_seqlens_q=np.array([0, 5], np.int32), cu_seqlens_k=np.array([0, 5, 9], np.int32))

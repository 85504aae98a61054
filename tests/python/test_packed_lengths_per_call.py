"""Lengths per call for packed batches (docs/semantics.md, "Lengths per call"; docs/python.md):
varlen_attention's forward runs every call of the same tensor shapes on one plan made from
capacities (the packed tensors' rows), the prefix sums going with each call. A loop of steps
with other prefix sums each (ending below the rows too, empty sequences included) against a
fresh call on tensors cut to the sums' ends (bits equal) and the float64 reference, numpy and
torch (autograd: zero gradients past the ends); plan_varlen's capacity plan and its exact cost
for given lengths; prefix sums past the capacities are an error."""
import numpy as np
import pytest

import flashattn
from flashattn import _native
import reference_inference as ref
from conftest import SEED, check, randn

B, CAP_Q, CAP_K, HQ, HK, D = 3, 40, 56, 4, 2, 16
KW = dict(causal=True)


def prefix_sums(rng):
    """Random lengths [B] whose sums stay within the capacities; a 0 now and then."""
    lq = rng.integers(0, CAP_Q // B + 1, B)
    lk = lq + rng.integers(0, (CAP_K - CAP_Q) // B + 1, B)  # Sk >= Sq: causal rows see keys
    lq[rng.integers(0, B)] = 0
    return tuple(np.concatenate([[0], np.cumsum(n)]).astype(np.int32) for n in (lq, lk))


def test_numpy_steps_share_one_plan_and_equal_fresh_calls(rng):
    q, k, v = randn(rng, (CAP_Q, HQ, D)), randn(rng, (CAP_K, HK, D)), randn(rng, (CAP_K, HK, D))
    print(f"seed {SEED}")
    for step in range(6):
        cq, ck = prefix_sums(rng)
        plans = len(_native._PLAN_CACHE)
        o, lse = flashattn.varlen_attention(q, k, v, cq, ck, return_lse=True, **KW)
        assert step == 0 or len(_native._PLAN_CACHE) == plans, "a step with other lengths made a new plan"
        tq, tk = cq[-1], ck[-1]
        o_f, lse_f = flashattn.varlen_attention(q[:tq].copy(), k[:tk].copy(), v[:tk].copy(), cq, ck,
                                                return_lse=True, **KW)
        np.testing.assert_array_equal(o[:tq], o_f, err_msg=f"step {step}: o against a fresh call")
        np.testing.assert_array_equal(lse[:, :tq], lse_f, err_msg=f"step {step}: lse against a fresh call")
        assert (o[tq:] == 0).all() and np.isneginf(lse[:, tq:]).all(), "rows past the sums' end"
        o_ref, _ = ref.varlen(q[:tq], k[:tk], v[:tk], cq, ck, **KW)
        check("o", o[:tq], o_ref, 1e-5)


def test_numpy_backward_past_the_ends_is_zero(rng):
    q, k, v = randn(rng, (CAP_Q, HQ, D)), randn(rng, (CAP_K, HK, D)), randn(rng, (CAP_K, HK, D))
    cq, ck = prefix_sums(rng)
    tq, tk = cq[-1], ck[-1]
    o, lse = flashattn.varlen_attention(q, k, v, cq, ck, return_lse=True, **KW)
    do = randn(rng, o.shape)
    dq, dk, dv = flashattn.varlen_attention_backward(q, k, v, o, lse, do, cq, ck, **KW)
    fresh = flashattn.varlen_attention_backward(q[:tq].copy(), k[:tk].copy(), v[:tk].copy(), o[:tq].copy(),
                                                lse[:, :tq].copy(), do[:tq].copy(), cq, ck, **KW)
    for name, g, f, t in (("dq", dq, fresh[0], tq), ("dk", dk, fresh[1], tk), ("dv", dv, fresh[2], tk)):
        np.testing.assert_array_equal(g[:t], f, err_msg=name)
        assert (g[t:] == 0).all(), f"{name} past the sums' end"


def test_torch_steps_equal_fresh_calls_and_gradients(rng):
    torch = pytest.importorskip("torch")
    import flashattn.torch as ft
    q, k, v = (torch.from_numpy(randn(rng, s)) for s in ((CAP_Q, HQ, D), (CAP_K, HK, D), (CAP_K, HK, D)))
    compiled = torch.compile(lambda *a: ft.varlen_attention(*a, return_lse=True, **KW), fullgraph=True)
    for step in range(4):
        cq, ck = (torch.from_numpy(c) for c in prefix_sums(rng))
        tq, tk = int(cq[-1]), int(ck[-1])
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        o, lse = ft.varlen_attention(qg, kg, vg, cq, ck, return_lse=True, **KW)
        qf, kf, vf = (t[:n].clone().requires_grad_() for t, n in ((q, tq), (k, tk), (v, tk)))
        o_f, lse_f = ft.varlen_attention(qf, kf, vf, cq, ck, return_lse=True, **KW)
        assert torch.equal(o[:tq], o_f) and torch.equal(lse[:, :tq], lse_f), f"step {step}"
        assert (o[tq:] == 0).all() and torch.isneginf(lse[:, tq:]).all()
        do = torch.randn(o.shape, dtype=o.dtype)
        (o * do).sum().backward()
        (o_f * do[:tq]).sum().backward()
        for name, g, f, n in (("dq", qg, qf, tq), ("dk", kg, kf, tk), ("dv", vg, vf, tk)):
            assert torch.equal(g.grad[:n], f.grad), f"step {step}: {name}"
            assert (g.grad[n:] == 0).all(), f"step {step}: {name} past the sums' end"
        co, clse = compiled(q, k, v, cq, ck)
        assert torch.equal(co, o.detach()) and torch.equal(clse, lse.detach()), f"step {step}: compiled"


def test_capacity_plan_costs_each_call_exactly(rng):
    kw = dict(heads=HQ, kv_heads=HK, head_dim=D, dtype="bf16", causal=True)
    cap = flashattn.plan_varlen(None, None, batch=B, total_q=CAP_Q, total_k=CAP_K, **kw)
    one = np.array([0, CAP_Q, CAP_Q, CAP_Q]), np.array([0, CAP_K, CAP_K, CAP_K])
    # its own figures: all in one sequence, but its workspace (and so its peak) the most of any
    # tiles a call's sequences may choose (docs/semantics.md): at least the one sequence's
    mine, theirs = dict(cap.forward), dict(flashattn.plan_varlen(*one, **kw).forward)
    for field in ("workspace_bytes", "peak_bytes"):
        assert mine.pop(field) >= theirs.pop(field)
    assert mine == theirs
    for _ in range(3):
        cq, ck = prefix_sums(rng)
        got = cap.cost_lengths(cu_seqlens_q=cq, cu_seqlens_k=ck)
        want = flashattn.plan_varlen(cq, ck, **kw).forward
        # the memory figures count the tensors at their capacity rows; every other is the call's
        for field in ("peak_bytes", "naive_peak_bytes"):
            assert got.pop(field) >= want.pop(field)
        assert got == want, (cq, ck)
    past = np.array([0, 10, 20, CAP_Q + 1], np.int32), np.array([0, 10, 20, 30], np.int32)
    with pytest.raises(ValueError, match=rf"cu_seqlens_q\[{B}\] = {CAP_Q + 1} reaches past"):
        cap.cost_lengths(cu_seqlens_q=past[0], cu_seqlens_k=past[1])
    with pytest.raises(ValueError, match="not both"):
        flashattn.plan_varlen(*one, batch=B, **kw)


def test_plans_without_a_backward_say_so(rng):
    """The library runs no backward for decoding or lengths per call (docs/semantics.md, "A
    plan with no backward"): .backward and blocks["backward"] are None, fits() of the backward
    refuses, cost_lengths of it is None; a plan of the same packed lengths has both passes."""
    kw = dict(heads=HQ, kv_heads=HK, head_dim=D, dtype="bf16", causal=True)
    cq, ck = prefix_sums(rng)
    cap = flashattn.plan_varlen(None, None, batch=B, total_q=CAP_Q, total_k=CAP_K, **kw)
    dec = flashattn.plan_kvcache([3, 0, 7], seq_q=1, heads=HQ, kv_heads=HK, head_dim=D, cache_len=16)
    for p in (cap, dec):
        assert p.backward is None and p.blocks["backward"] is None and p.as_dict()["backward"] is None
        assert p.forward["flops"] > 0 and p.fits("1T")
        with pytest.raises(ValueError, match="no backward"):
            p.fits("1T", "both")
    assert cap.cost_lengths(cu_seqlens_q=cq, cu_seqlens_k=ck, pass_="backward") is None
    with pytest.raises(ValueError, match="pass_ must be"):
        cap.cost_lengths(cu_seqlens_q=cq, cu_seqlens_k=ck, pass_="bwd")
    fixed = flashattn.plan_varlen(cq, ck, **kw)
    assert fixed.backward["flops"] > 0 and fixed.blocks["backward"][0] > 0 and fixed.fits("1T", "both")


def test_lengths_past_the_capacities_are_an_error(rng):
    """A call whose prefix sums reach past the tensors' rows: the library's message, from the
    one plan reused (numpy, torch), nothing written into out=."""
    q, k, v = randn(rng, (CAP_Q, HQ, D)), randn(rng, (CAP_K, HK, D)), randn(rng, (CAP_K, HK, D))
    cq, ck = prefix_sums(rng)
    flashattn.varlen_attention(q, k, v, cq, ck, **KW)
    bad = ck.copy()
    bad[-1] = CAP_K + 3
    out = np.full((CAP_Q, HQ, D), 7.0, np.float32)
    with pytest.raises(ValueError, match=rf"cu_seqlens_k\[{B}\] = {CAP_K + 3} reaches past the packed tensor's"):
        flashattn.varlen_attention(q, k, v, cq, bad, out=out, **KW)
    assert (out == 7.0).all(), "a refused call wrote into out="
    torch = pytest.importorskip("torch")
    import flashattn.torch as ft
    with pytest.raises(ValueError, match=rf"cu_seqlens_k\[{B}\] = {CAP_K + 3} reaches past"):
        ft.varlen_attention(*(torch.from_numpy(a) for a in (q, k, v, cq, bad)), **KW)


def test_no_sequences_over_capacity_rows(rng):
    """A batch of no sequences (cu_seqlens [0]) over tensors that have rows: a capacity plan
    of batch 0 and a call with those lengths both work (the capacity stand-ins once had to end
    at the rows, naming a cu_seqlens_q the caller never passed); nothing is computed, o = 0
    and lse = -inf where the front fills them."""
    q = rng.standard_normal((5, 2, 16)).astype(np.float32)
    k = rng.standard_normal((7, 2, 16)).astype(np.float32)
    cu = np.array([0], np.int32)
    p = flashattn.plan_varlen(None, None, batch=0, total_q=5, total_k=7, heads=2, head_dim=16)
    assert p.forward["flops"] == 0 and p.forward["transcendentals"] == 0
    assert p.cost_lengths(cu_seqlens_q=cu, cu_seqlens_k=cu)["flops"] == 0
    o, lse = flashattn.varlen_attention(q, k, k, cu, cu, return_lse=True)
    assert o.shape == (5, 2, 16) and lse.shape == (2, 5)

"""The PyTorch fronts of the inference shapes against the per-sequence float64 reference:
packed batches forward and gradients (eager and torch.compile(fullgraph=True)), kv-cache
decoding with appending and paged caches (eager and compiled, the cache update kept), the
ops' fake kernels and registrations (opcheck), and bad input."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flashattn.torch as fat  # noqa: E402
import reference_inference as ref  # noqa: E402
from conftest import BWD_TOL, SEED, check, check_lse, fwd_tol  # noqa: E402
from inference_cases import (decode_rows, expected_cache, expected_pages, make_decode,  # noqa: E402
                             make_varlen, page)

TDT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def t(a, dtype="f32", grad=False):
    return torch.from_numpy(np.asarray(a, np.float32)).to(TDT[dtype]).requires_grad_(grad)


def i32(a):
    return torch.from_numpy(np.asarray(a, np.int32))


def f64(x):
    return x.detach().to(torch.float64).numpy()


def _torch_kw(kw):
    out = dict(kw)
    if "alibi_slopes" in out:
        out["alibi_slopes"] = torch.from_numpy(out["alibi_slopes"])
    return out


# ---- packed variable-length batches ---------------------------------------------------

@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("case", ["empty_and_one", "causal", "window_causal", "gqa", "softcap_alibi",
                                  "dv_differs"])
def test_varlen_forward_and_grads_match_reference(rng, case, dtype):
    qn, kn, vn, cq, ck, kw = make_varlen(rng, case, dtype)
    q, k, v = t(qn, dtype, True), t(kn, dtype, True), t(vn, dtype, True)
    o, lse = fat.varlen_attention(q, k, v, i32(cq), i32(ck), return_lse=True, **_torch_kw(kw))
    o_ref, lse_ref = ref.varlen(qn, kn, vn, cq, ck, **kw)
    check("o", f64(o), o_ref, fwd_tol(dtype, lse_ref))
    check_lse(f64(lse), lse_ref)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(SEED)).to(o.dtype)
    gq, gk, gv = torch.autograd.grad(o, (q, k, v), do)
    _, (rq, rk, rv) = ref.varlen(qn, kn, vn, cq, ck, do=f64(do), o_saved=f64(o), **kw)
    for name, g, r in (("dq", gq, rq), ("dk", gk, rk), ("dv", gv, rv)):
        assert g.dtype == q.dtype
        check(name, f64(g), r, BWD_TOL[dtype])


def test_varlen_compile_fullgraph_matches_eager(rng):
    """fullgraph=True fails on any graph break: both ops stay single nodes, grads too."""
    qn, kn, vn, cq, ck, kw = make_varlen(rng, "gqa")
    cu_q, cu_k = i32(cq), i32(ck)

    def f(q, k, v):
        return fat.varlen_attention(q, k, v, cu_q, cu_k, max_seqlen_q=13, window=(5, -1), **kw).relu() * 2

    inputs = [t(a, grad=True) for a in (qn, kn, vn)]
    do = torch.randn(qn.shape[:2] + (vn.shape[2],), generator=torch.Generator().manual_seed(SEED))
    eager = f(*inputs)
    g_eager = torch.autograd.grad(eager, inputs, do)
    compiled = torch.compile(f, fullgraph=True)
    got = compiled(*inputs)
    g_got = torch.autograd.grad(got, inputs, do)
    torch.testing.assert_close(got, eager, rtol=1e-6, atol=1e-6)
    for a, b in zip(g_got, g_eager):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_varlen_opcheck(rng):
    qn, kn, vn, cq, ck, _ = make_varlen(rng, "causal")
    q, k, v = (t(a, grad=True) for a in (qn, kn, vn))
    torch.library.opcheck(torch.ops.flashattn.varlen_fwd.default,
                          (q, k, v, i32(cq), i32(ck), None, None, None, True, -1, -1, 0.0, None, None))


def test_varlen_views_of_packed_qkv(rng):
    lens = [4, 0, 13]
    cq = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    qkv = t(rng.standard_normal((cq[-1], 3, 2, 16)), grad=True)
    q, k, v = qkv.unbind(1)
    o = fat.varlen_attention(q, k, v, i32(cq), i32(cq), causal=True)
    do = torch.ones_like(o)
    g, = torch.autograd.grad(o, (qkv,), do)
    (o_ref, _), grads = ref.varlen(f64(q), f64(k), f64(v), cq, cq, do=f64(do), causal=True)
    check("o", f64(o), o_ref, 1e-5)
    for i, name in enumerate(("dq", "dk", "dv")):
        check(name, f64(g[:, i]), grads[i], BWD_TOL["f32"])


# ---- kv-cache decoding -----------------------------------------------------------------

def _decode_tensors(d, dtype):
    T = {name: None if d[name] is None else t(d[name], dtype) for name in ("q", "k_cache", "v_cache", "k", "v")}
    return T


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("case", ["one_token", "gqa_8to1", "mqa_multi", "no_append", "window", "softcap_alibi"])
def test_decode_matches_reference_and_appends(rng, case, dtype):
    d = make_decode(rng, case, dtype)
    T = _decode_tensors(d, dtype)
    o, lse = fat.kvcache_attention(T["q"], T["k_cache"], T["v_cache"], T["k"], T["v"], i32(d["lens"]),
                                   return_lse=True, **_torch_kw(d["kw"]))
    o_ref, lse_ref = ref.decode(d["q"], *decode_rows(d), **d["kw"])
    check("o", f64(o), o_ref, fwd_tol(dtype, lse_ref))
    check_lse(f64(lse), lse_ref)
    for which in ("k", "v"):
        want = torch.from_numpy(np.asarray(expected_cache(d, which), np.float32)).to(TDT[dtype])
        assert torch.equal(T[which + "_cache"].isnan(), want.isnan())
        assert torch.equal(T[which + "_cache"].nan_to_num(), want.nan_to_num())


@pytest.mark.parametrize("case", ["one_token", "mqa_multi", "shared_pages"])
def test_paged_decode_matches_reference(rng, case):
    d = page(make_decode(rng, case), rng, share=case == "shared_pages")
    kp, vp = torch.from_numpy(d["k_pages"]), torch.from_numpy(d["v_pages"])
    kn = None if d["k"] is None else torch.from_numpy(d["k"])
    vn = None if d["v"] is None else torch.from_numpy(d["v"])
    o = fat.kvcache_attention(torch.from_numpy(d["q"]), kp, vp, kn, vn, i32(d["lens"]), i32(d["table"]),
                              **_torch_kw(d["kw"]))
    o_ref, lse_ref = ref.decode(d["q"], *decode_rows(d), **d["kw"])
    check("o", f64(o), o_ref, fwd_tol("f32", lse_ref))
    for name, got, want in (("k", kp, expected_pages(d, "k")), ("v", vp, expected_pages(d, "v"))):
        np.testing.assert_array_equal(got.numpy(), want, err_msg=f"{name} pages after the call")


def test_decode_compiled_keeps_the_cache_update(rng):
    """torch.compile(fullgraph=True) of a step that appends: same o as eager and the same
    caches afterwards (the op declares mutates_args, so functionalization keeps the write)."""
    d = make_decode(rng, "mqa_multi")
    lens = i32(d["lens"])

    def step(q, kc, vc, kn, vn):
        return fat.kvcache_attention(q, kc, vc, kn, vn, lens, causal=True)

    caches = [[torch.from_numpy(d[n]).clone() for n in ("k_cache", "v_cache")] for _ in range(2)]
    q, kn, vn = (torch.from_numpy(d[n]) for n in ("q", "k", "v"))
    eager = step(q, *caches[0], kn, vn)
    got = torch.compile(step, fullgraph=True)(q, *caches[1], kn, vn)
    torch.testing.assert_close(got, eager, rtol=0, atol=0)
    for a, b, name in zip(caches[0], caches[1], ("k", "v")):
        want = torch.from_numpy(expected_cache(d, name))
        torch.testing.assert_close(a, want, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(b, want, rtol=0, atol=0, equal_nan=True)


def test_decode_strided_cache_view_is_updated_in_place(rng):
    """A cache that is a view with gaps (every other head of a wider buffer) is written
    through its own strides; a broadcast (overlapping) one is refused before anything runs."""
    d = make_decode(rng, "one_token")
    wide = torch.from_numpy(np.repeat(d["k_cache"], 2, axis=2))
    kc = wide[:, :, ::2]
    assert not kc.is_contiguous()
    other = wide[:, :, 1::2].clone()
    vc = torch.from_numpy(d["v_cache"])
    o = fat.kvcache_attention(torch.from_numpy(d["q"]), kc, vc, torch.from_numpy(d["k"]),
                              torch.from_numpy(d["v"]), i32(d["lens"]), causal=True)
    o_ref, lse_ref = ref.decode(d["q"], *decode_rows(d), causal=True)
    check("o", f64(o), o_ref, fwd_tol("f32", lse_ref))
    np.testing.assert_array_equal(kc.numpy(), expected_cache(d, "k"))
    np.testing.assert_array_equal(wide[:, :, 1::2].numpy(), other.numpy())   # the gaps untouched
    shared = torch.from_numpy(d["v_cache"][:1]).expand(4, -1, -1, -1)
    with pytest.raises(ValueError, match=r"v_cache is written in place .* must not overlap"):
        fat.kvcache_attention(torch.from_numpy(d["q"]), kc, shared, torch.from_numpy(d["k"]),
                              torch.from_numpy(d["v"]), i32(d["lens"]))


def test_kvcache_opcheck_declares_its_mutations(rng):
    """opcheck's schema test runs the op and fails if it writes an argument that the schema
    does not declare mutated (or declares one it never writes)."""
    d = page(make_decode(rng, "one_token"), rng)
    args = [torch.from_numpy(d[n]) for n in ("q", "k_pages", "v_pages", "k", "v")]
    torch.library.opcheck(torch.ops.flashattn.kvcache_fwd.default,
                          (*args, i32(d["lens"]), i32(d["table"]), None, True, -1, -1, 0.0, None))


def test_kvcache_fake_kernel():
    q = torch.empty(3, 2, 8, 16, device="meta")
    kc = torch.empty(3, 40, 2, 16, device="meta")
    vc = torch.empty(3, 40, 2, 24, device="meta")
    lens = torch.zeros(3, dtype=torch.int32, device="meta")
    o, lse = torch.ops.flashattn.kvcache_fwd(q, kc, vc, None, None, lens, None, None, True, -1, -1, 0.0, None)
    assert o.shape == (3, 2, 8, 24) and lse.shape == (3, 8, 2) and lse.dtype == torch.float32
    # the public function with an append: meta tensors have no memory to share (every meta
    # storage reads as address 0, which the overlap check once took for k_cache == v_cache)
    kn, vn = torch.empty(3, 2, 2, 16, device="meta"), torch.empty(3, 2, 2, 24, device="meta")
    o = fat.kvcache_attention(q, kc, vc, kn, vn, cache_seqlens=torch.zeros(3, dtype=torch.int32))
    assert o.shape == (3, 2, 8, 24) and o.device.type == "meta"
    with pytest.raises(ValueError, match="share memory"):  # the same tensor twice is still refused
        fat.kvcache_attention(q, kc, kc, kn, kn, cache_seqlens=torch.zeros(3, dtype=torch.int32))


# ---- bad input -------------------------------------------------------------------------

def test_bad_input_names_the_argument(rng):
    qn, kn, vn, cq, ck, _ = make_varlen(rng, "causal")
    q, k, v = t(qn), t(kn), t(vn)
    bad = cq.copy()
    bad[3] = 0
    with pytest.raises(ValueError, match=r"cu_seqlens_q must be non-decreasing"):
        fat.varlen_attention(q, k, v, i32(bad), i32(ck))
    with pytest.raises(ValueError, match=r"max_seqlen_k = 2 but a sequence has 30 rows"):
        fat.varlen_attention(q, k, v, i32(cq), i32(ck), max_seqlen_k=2)
    with pytest.raises(ValueError, match=r"cu_seqlens_k must be integers"):
        fat.varlen_attention(q, k, v, i32(cq), torch.from_numpy(ck.astype(np.float32)))
    with pytest.raises(ValueError, match=r"q must have 3 dims"):
        fat.varlen_attention(q[None], k, v, i32(cq), i32(ck))

    d = page(make_decode(rng, "one_token"), rng)
    kp, vp = torch.from_numpy(d["k_pages"]), torch.from_numpy(d["v_pages"])
    before = kp.clone(), vp.clone()
    args = (torch.from_numpy(d["q"]), kp, vp, torch.from_numpy(d["k"]), torch.from_numpy(d["v"]), i32(d["lens"]))
    table = d["table"].copy()
    table[1, 0] = 10**6
    with pytest.raises(ValueError, match=r"block_table\[1\]\[0\] = 1000000 is out of range"):
        fat.kvcache_attention(*args, i32(table))
    over = d["lens"].copy()
    over[0] = 64
    with pytest.raises(ValueError, match=r"cache_seqlens\[0\] = 64 plus 1 new tokens exceeds the cache capacity 64"):
        fat.kvcache_attention(*args[:5], i32(over), i32(d["table"]))
    # a cache that requires grad is not written in place (torch's rule for leaves; decoding has
    # no backward); under no_grad it is
    kg = kp.clone().requires_grad_()
    with pytest.raises(RuntimeError, match=r"k_cache requires grad and is written in place"):
        fat.kvcache_attention(args[0], kg, vp, *args[3:], i32(d["table"]))
    for a, b in zip((kp, vp), before):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    with pytest.raises(ValueError, match=r"cache_seqlens must have shape \[batch\] = \[4\]"):
        fat.kvcache_attention(*args[:5], i32(d["lens"][:2]), i32(d["table"]))
    # lengths as a numpy array: named, as every integer argument that is not a tensor (it
    # raised numpy's "only 0-dimensional arrays can be converted to Python scalars")
    for lens in (np.asarray(d["lens"], np.int32), np.asarray(d["lens"][:1], np.int32)):
        with pytest.raises(ValueError, match=r"cache_seqlens must be an int32 torch.Tensor"):
            fat.kvcache_attention(*args[:5], lens, i32(d["table"]))
    with pytest.raises(ValueError, match=r"q, k_cache, v_cache, k, v must have one dtype"):
        fat.kvcache_attention(args[0].half(), *args[1:], i32(d["table"]))


def _meta(x):
    return torch.empty_like(x, device="meta")


def test_every_tensor_argument_on_qs_device(rng):
    """A length, page-table, cache, new-token or scale tensor on another device than q's
    raises ValueError naming it and both devices, before anything is written (on meta beside
    CPU tensors these once reached the ops' fake kernels: uninitialized outputs, an append
    that wrote nothing). Lengths and block tables may also be on the CPU beside tensors on
    another device (they are read on the host): meta q with CPU lengths gives shapes. The
    calls with every tensor on the CPU then match the float64 reference."""
    # packed batches
    qn, kn, vn, cq, ck, kw = make_varlen(rng, "causal")
    q, k, v = t(qn), t(kn), t(vn)
    for i, name in enumerate(("cu_seqlens_q", "cu_seqlens_k")):
        cus = [i32(cq), i32(ck)]
        cus[i] = _meta(cus[i])
        with pytest.raises(ValueError, match=f"{name} is on meta but q is on cpu"):
            fat.varlen_attention(q, k, v, *cus, **_torch_kw(kw))
    o_ref, lse_ref = ref.varlen(qn, kn, vn, cq, ck, **kw)
    check("o", f64(fat.varlen_attention(q, k, v, i32(cq), i32(ck), **_torch_kw(kw))), o_ref, fwd_tol("f32", lse_ref))
    o = fat.varlen_attention(*(_meta(x) for x in (q, k, v)), i32(cq), i32(ck), **_torch_kw(kw))
    assert o.device.type == "meta" and o.shape == q.shape
    # a dense cache with an append: nothing written when refused
    d = make_decode(rng, "one_token")
    T = _decode_tensors(d, "f32")
    before = [T["k_cache"].clone(), T["v_cache"].clone()]
    names = ("q", "k_cache", "v_cache", "k", "v", "cache_seqlens")
    for name in names[1:]:
        args = dict(T, cache_seqlens=i32(d["lens"]))
        args[name] = _meta(args[name])
        with pytest.raises(ValueError, match=f"{name} is on meta but q is on cpu"):
            fat.kvcache_attention(*(args[n] for n in names), **_torch_kw(d["kw"]))
        for a, b in zip((T["k_cache"], T["v_cache"]), before):
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    o = fat.kvcache_attention(*(T[n] for n in names[:5]), i32(d["lens"]), **_torch_kw(d["kw"]))
    o_ref, lse_ref = ref.decode(d["q"], *decode_rows(d), **d["kw"])
    check("o", f64(o), o_ref, fwd_tol("f32", lse_ref))
    # paged
    d = page(make_decode(rng, "mqa_multi"), rng)
    kp, vp = torch.from_numpy(d["k_pages"]), torch.from_numpy(d["v_pages"])
    kn_, vn_ = (None if d[n] is None else torch.from_numpy(d[n]) for n in ("k", "v"))
    args = (torch.from_numpy(d["q"]), kp, vp, kn_, vn_, i32(d["lens"]))
    with pytest.raises(ValueError, match="block_table is on meta but q is on cpu"):
        fat.kvcache_attention(*args, _meta(i32(d["table"])), **_torch_kw(d["kw"]))
    o = fat.kvcache_attention(*args, i32(d["table"]), **_torch_kw(d["kw"]))
    o_ref, lse_ref = ref.decode(d["q"], *decode_rows(d), **d["kw"])
    check("o", f64(o), o_ref, fwd_tol("f32", lse_ref))
    # a quantized cache (int8 codes, a scale per row and head): codes or scales elsewhere
    B, S, Hk, D, lens = 2, 16, 2, 8, [5, 11]
    qd = torch.from_numpy(rng.standard_normal((B, 1, 4, D)).astype(np.float32))
    kf, vf = (torch.from_numpy(rng.standard_normal((B, S, Hk, D)).astype(np.float32)) for _ in range(2))
    kc, ks, vc, vs = fat.quantize_cache(kf, vf, "int8")
    quant = dict(k_cache=kc, v_cache=vc, k_scale=ks, v_scale=vs)
    for name in quant:
        bad = dict(quant, **{name: _meta(quant[name])})
        with pytest.raises(ValueError, match=f"{name} is on meta but q is on cpu"):
            fat.kvcache_attention(qd, bad["k_cache"], bad["v_cache"], cache_seqlens=i32(lens), cache_dtype="int8",
                                  k_scale=bad["k_scale"], v_scale=bad["v_scale"])
    o = fat.kvcache_attention(qd, kc, vc, cache_seqlens=i32(lens), cache_dtype="int8", k_scale=ks, v_scale=vs)
    kq, vq = (c.double().numpy() * s.double().numpy()[..., None] for c, s in ((kc, ks), (vc, vs)))
    o_ref, lse_ref = ref.decode(qd.double().numpy(), [kq[b, :n] for b, n in enumerate(lens)],
                                [vq[b, :n] for b, n in enumerate(lens)])
    check("o", f64(o), o_ref, fwd_tol("f32", lse_ref))


def test_new_v_shape_names_dv():
    """A wrong new-v shape is reported against [B, Sq, Hk, Dv] (v's head dim), not D."""
    q, kc, vc = torch.randn(2, 1, 2, 8), torch.randn(2, 16, 2, 8), torch.randn(2, 16, 2, 4)
    with pytest.raises(ValueError, match=r"new v must have shape \[B, Sq, Hk, Dv\] = \(2, 1, 2, 4\), "
                                         r"got \(2, 1, 2, 8\)"):
        fat.kvcache_attention(q, kc, vc, torch.randn(2, 1, 2, 8), torch.randn(2, 1, 2, 8), cache_seqlens=3)
    with pytest.raises(ValueError, match=r"new k must have shape \[B, Sq, Hk, D\] = \(2, 1, 2, 8\), "
                                         r"got \(2, 1, 2, 4\)"):
        fat.kvcache_attention(q, kc, vc, torch.randn(2, 1, 2, 4), torch.randn(2, 1, 2, 4), cache_seqlens=3)

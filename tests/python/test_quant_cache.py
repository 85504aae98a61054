"""Quantized kv caches (docs/caches.md) through the numpy front: flashattn.quantize_cache
against an independent quantizer (numpy's round-half-even, ml_dtypes' float8_e4m3fn),
kvcache_attention over int8 and fp8 caches (dense and paged with shuffled pages, one new
token and chunked prefill) against the float64 reference on the dequantized values, the
caches after appending (the new rows' codes and scales, untouched elsewhere), bad scales
and missing scale arrays (ValueError, nothing written), and the plan's bytes."""
import numpy as np
import pytest

import flashattn
import reference_inference as ref
from conftest import SEED, check, fwd_tol, np_dtype, randn

ml_dtypes = pytest.importorskip("ml_dtypes")
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)


def independent_quantize(x, kind):
    """Codes and scales per row of the last axis, from the rule in docs/caches.md."""
    x = np.asarray(x, np.float32)
    amax = np.abs(x).max(axis=-1)
    top = np.float32(127 if kind == "int8" else 448)
    q = (amax / top).astype(np.float32)
    tiny = np.finfo(np.float32).tiny  # 2^-126: the scale of a nonzero row whose quotient is below it
    scale = np.where(amax == 0, np.float32(1), np.maximum(q, tiny)).astype(np.float32)
    y = (x / scale[..., None]).astype(np.float32)
    if kind == "int8":
        return np.clip(np.rint(y), -127, 127).astype(np.int8), scale
    return np.clip(y, -448, 448).astype(FP8), scale


def dequantize(codes, scale):
    return codes.astype(np.float64) * scale[..., None].astype(np.float64)


def bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


@pytest.mark.parametrize("kind", ["int8", "fp8"])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_quantize_cache_matches_independent_rule(rng, kind, dtype):
    k = randn(rng, (3, 17, 2, 40), dtype, scale=3.0)
    v = randn(rng, (3, 17, 2, 40), dtype)
    k[0, 0, 0] = 0  # a zero row: scale 1, codes 0
    k[0, 1, 0] = 0  # a row of subnormals whose amax / 448 underflows: scale 2^-126, zero codes (once 0 / 0: NaN)
    k[0, 1, 0, :3] = np.array([1e-44, -3e-45, 1e-45], np.float32).astype(k.dtype) if dtype == "f32" else 0
    if dtype == "f32":  # amax / max subnormal: its rounding put codes past the clamp; 60 times 2^-126
        k[0, 2, 0] = rng.uniform(-2.6e-43, 2.6e-43, 40).astype(np.float32)
        k[0, 2, 0, 5] = np.float32(-2.66e-43)
        k[0, 2, 1] = (rng.uniform(-60, 60, 40) * np.finfo(np.float32).tiny).astype(np.float32)
    if kind == "int8":  # ties at scale 1: amax 127 and halves
        k[1, 0, 1] = np.arange(40, dtype=np.float32) - 19.5
        k[1, 0, 1, 0] = 127
    kq, ks, vq, vs = flashattn.quantize_cache(k, v, kind)
    for got, gs, x in ((kq, ks, k), (vq, vs, v)):
        want, ws = independent_quantize(x, kind)
        assert got.dtype == want.dtype and got.shape == x.shape and gs.shape == x.shape[:-1]
        assert np.array_equal(bits(got), bits(want)), f"codes differ (seed {SEED})"
        assert np.array_equal(gs, ws), f"scales differ (seed {SEED})"
    assert ks[0, 0, 0] == 1 and not bits(kq[0, 0, 0]).any()
    tiny = np.finfo(np.float32).tiny
    assert ks[0, 1, 0] == (tiny if dtype == "f32" else 1) and np.all(kq[0, 1, 0].astype(np.float32) == 0)  # fp8 -0 too
    # docs/caches.md's bound on every element: int8 scale / 2, fp8 2^-4 |x| + 2^-10 scale
    x = np.asarray(k, np.float64)
    err = np.abs(dequantize(kq, ks) - x)
    sc = ks[..., None].astype(np.float64)  # int8: plus x / scale's f32 rounding, 2^-24 of |x| (times 2: slack)
    bound = sc / 2 + np.abs(x) * 2.0**-23 if kind == "int8" else np.abs(x) / 16 + sc / 1024
    assert np.all(err <= bound), f"past the error bound (seed {SEED})"


def test_quantize_cache_refuses_non_finite():
    k = np.ones((2, 4, 1, 8), np.float32)
    k[1, 2, 0, 3] = np.inf
    with pytest.raises(ValueError, match="not finite"):
        flashattn.quantize_cache(k, k, "int8")
    with pytest.raises(ValueError, match="int8, fp8"):
        flashattn.quantize_cache(k, k, "int4")


@pytest.mark.parametrize("front", ["numpy", "torch", "jax"])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_quantize_cache_names_the_non_finite_element(front, dtype):
    """The refusal names the tensor and the element's index as the user indexes it (it said
    "element 7 (row 19)", a flattened row, and not whether k or v held it)."""
    rng = np.random.default_rng(SEED)
    k = rng.standard_normal((2, 12, 3, 8)).astype(np.float32)
    v = rng.standard_normal((2, 12, 3, 8)).astype(np.float32)
    at = tuple(int(rng.integers(0, n)) for n in v.shape)
    v[at] = np.nan
    k, v = k.astype(np_dtype(dtype)), v.astype(np_dtype(dtype))
    if front == "torch":
        torch = pytest.importorskip("torch")
        import flashattn.torch as ft
        tt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype]
        call = lambda: ft.quantize_cache(torch.from_numpy(k.astype(np.float32)).to(tt),
                                         torch.from_numpy(v.astype(np.float32)).to(tt), "fp8")
    elif front == "jax":
        jnp = pytest.importorskip("jax.numpy")
        import flashattn.jax as fj
        call = lambda: fj.quantize_cache(jnp.asarray(k), jnp.asarray(v), "fp8")
    else:
        call = lambda: flashattn.quantize_cache(k, v, "fp8")
    want = "quantize_cache: v\\[" + ", ".join(map(str, at)) + "\\] is not finite"
    with pytest.raises(ValueError, match=want):
        call()


def _case(rng, dtype, kind, paged, Sq):
    B, Hq, Hk, D, cap = 2, 8, 2, 64, 96
    lens = np.array([int(rng.integers(0, cap - Sq)), 0], np.int32)
    kf = randn(rng, (B, cap, Hk, D), "f32", scale=2.0)
    vf = randn(rng, (B, cap, Hk, D), "f32")
    kq, ks, vq, vs = flashattn.quantize_cache(kf, vf, kind)
    table = None
    if paged:  # pages of 16 rows, in a shuffled order
        ps, mp = 16, cap // 16
        perm = rng.permutation(B * mp + 2).astype(np.int32)
        table = perm[:B * mp].reshape(B, mp)
        shape = (B * mp + 2, ps, Hk, D)
        pk, pv = np.zeros(shape, kq.dtype), np.zeros(shape, vq.dtype)
        pks, pvs = np.full(shape[:3], np.nan, np.float32), np.full(shape[:3], np.nan, np.float32)
        for b in range(B):
            for j in range(mp):
                sl = slice(j * ps, (j + 1) * ps)
                pk[table[b, j]], pv[table[b, j]] = kq[b, sl], vq[b, sl]
                pks[table[b, j]], pvs[table[b, j]] = ks[b, sl], vs[b, sl]
        kq, vq, ks, vs = pk, pv, pks, pvs
    q = randn(rng, (B, Sq, Hq, D), dtype)
    kn, vn = randn(rng, (B, Sq, Hk, D), dtype, scale=2.0), randn(rng, (B, Sq, Hk, D), dtype)
    return q, kq, vq, ks, vs, kn, vn, lens, table


def _row(table, b, t, ps=16):
    return (b, t) if table is None else (table[b, t // ps], t % ps)


@pytest.mark.parametrize("kind", ["int8", "fp8"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("Sq", [1, 3])
def test_quantized_decode_matches_reference(rng, kind, dtype, paged, Sq):
    q, kq, vq, ks, vs, kn, vn, lens, table = _case(rng, dtype, kind, paged, Sq)
    before = [a.copy() for a in (kq, vq, ks, vs)]
    o = flashattn.kvcache_attention(q, kq, vq, kn, vn, cache_seqlens=lens, block_table=table, causal=Sq > 1,
                                    cache_dtype=kind, k_scale=ks, v_scale=vs)
    # the expected caches: the new rows quantized, every other row as it was
    nkq, nks = independent_quantize(np.asarray(kn, np.float32), kind)
    nvq, nvs = independent_quantize(np.asarray(vn, np.float32), kind)
    want = [a.copy() for a in before]
    for b in range(q.shape[0]):
        for t in range(Sq):
            r = _row(table, b, int(lens[b]) + t)
            want[0][r], want[1][r], want[2][r], want[3][r] = nkq[b, t], nvq[b, t], nks[b, t], nvs[b, t]
    for got, w in zip((kq, vq, ks, vs), want):
        assert np.array_equal(bits(got), bits(w)), f"the caches after the call differ (seed {SEED})"
    k_rows, v_rows = [], []
    for b in range(q.shape[0]):
        rows = [_row(table, b, t) for t in range(int(lens[b]) + Sq)]
        k_rows.append(np.stack([dequantize(kq[r], ks[r]) for r in rows]))
        v_rows.append(np.stack([dequantize(vq[r], vs[r]) for r in rows]))
    o_ref, lse_ref = ref.decode(np.asarray(q, np.float64), k_rows, v_rows, causal=Sq > 1)
    check("o", o, o_ref, fwd_tol(dtype, lse_ref))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -1.0, "missing"])
def test_bad_scales_write_nothing(rng, bad):
    q, kq, vq, ks, vs, kn, vn, lens, table = _case(rng, "f32", "int8", False, 1)
    lens[0] = max(int(lens[0]), 1)
    if bad == "missing":
        vs = None
    else:
        ks[0, int(lens[0]) - 1, 1] = bad
    before = [a.copy() for a in (kq, vq, ks)]
    with pytest.raises(ValueError, match="v_scale" if bad == "missing" else "k_scale"):
        flashattn.kvcache_attention(q, kq, vq, kn, vn, cache_seqlens=lens, cache_dtype="int8", k_scale=ks,
                                    v_scale=vs)
    for got, w in zip((kq, vq, ks), before):
        assert np.array_equal(bits(got), bits(w)), "an error wrote into the caches"


def test_plan_bytes_use_the_code_and_scale_sizes():
    lens = np.array([4096], np.int32)
    kw = dict(seq_q=1, heads=32, kv_heads=8, head_dim=128, cache_len=4096, dtype="bf16", backend="cpu")
    plain = flashattn.plan_kvcache(lens, **kw).forward["bytes_accessed"]
    quant = flashattn.plan_kvcache(lens, cache_dtype="int8", **kw).forward["bytes_accessed"]
    cache = 4096 * 8 * 2 * 128
    # codes and scales of every row read, and the call's check of the scales once more
    assert plain - quant == cache - 4096 * 8 * 8 * 2, (plain, quant)
    with pytest.raises(ValueError, match="int8, fp8"):
        flashattn.plan_kvcache(lens, cache_dtype="int4", **kw)


def test_quantized_cache_elsewhere_is_refused(rng):
    np_dtype("f32")
    q = randn(rng, (1, 1, 4, 32), "f32")
    kq = np.zeros((1, 32, 4, 32), np.int8)
    with pytest.raises(ValueError, match="must hold int8 codes"):
        flashattn.kvcache_attention(q, q.repeat(32, 1), q.repeat(32, 1), cache_seqlens=4, cache_dtype="int8",
                                    k_scale=np.ones((1, 32, 4), np.float32), v_scale=np.ones((1, 32, 4), np.float32))
    with pytest.raises(ValueError, match="cache_dtype"):
        flashattn.kvcache_attention(q, kq, kq, cache_seqlens=4, k_scale=np.ones((1, 32, 4), np.float32))


@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_torch_front_matches_numpy(rng, kind):
    torch = pytest.importorskip("torch")
    import flashattn.torch as ft
    q, kq, vq, ks, vs, kn, vn, lens, table = _case(rng, "f32", kind, True, 2)
    tk, tks, tv, tvs = (torch.from_numpy(np.ascontiguousarray(a).view(np.uint8).copy()) for a in (kq, ks, vq, vs))
    tk = tk.view(torch.int8 if kind == "int8" else torch.float8_e4m3fn)
    tv = tv.view(torch.int8 if kind == "int8" else torch.float8_e4m3fn)
    tks, tvs = tks.view(torch.float32).reshape(ks.shape), tvs.view(torch.float32).reshape(vs.shape)
    o_t = ft.kvcache_attention(torch.from_numpy(q), tk, tv, torch.from_numpy(kn), torch.from_numpy(vn),
                               cache_seqlens=torch.from_numpy(lens), block_table=torch.from_numpy(table),
                               causal=True, cache_dtype=kind, k_scale=tks, v_scale=tvs)
    o_n = flashattn.kvcache_attention(q, kq, vq, kn, vn, cache_seqlens=lens, block_table=table, causal=True,
                                      cache_dtype=kind, k_scale=ks, v_scale=vs)
    assert np.array_equal(o_t.numpy(), o_n), "the torch and numpy fronts differ"
    assert np.array_equal(tk.view(torch.uint8).numpy(), bits(kq).reshape(kq.shape))
    assert np.array_equal(bits(tks.numpy()), bits(ks))
    # quantize_cache for tensors: the same codes as numpy's
    kf = randn(rng, (2, 5, 2, 16), "f32")
    a = ft.quantize_cache(torch.from_numpy(kf), torch.from_numpy(kf), kind)
    b = flashattn.quantize_cache(kf, kf, kind)
    assert np.array_equal(a[0].view(torch.uint8).numpy(), bits(b[0]).reshape(kf.shape))
    assert np.array_equal(a[1].numpy(), b[1])


@pytest.mark.parametrize("kind", ["int8", "fp8"])
@pytest.mark.parametrize("paged", [False, True])
def test_jax_front_matches_numpy(rng, kind, paged):
    pytest.importorskip("jax")
    try:
        import flashattn.jax as fj
    except ImportError as e:  # a build without the FFI handler
        pytest.skip(str(e))
    import jax.numpy as jnp
    q, kq, vq, ks, vs, kn, vn, lens, table = _case(rng, "f32", kind, paged, 2)
    code = jnp.int8 if kind == "int8" else jnp.float8_e4m3fn
    jk, jv = (jnp.asarray(bits(a).reshape(a.shape)).view(code) for a in (kq, vq))
    o_j, kc, vc, ksj, vsj = fj.kvcache_attention(jnp.asarray(q), jk, jv, jnp.asarray(kn), jnp.asarray(vn),
                                                  cache_seqlens=lens, block_table=table, causal=True,
                                                  cache_dtype=kind, k_scale=jnp.asarray(ks), v_scale=jnp.asarray(vs))
    o_n = flashattn.kvcache_attention(q, kq, vq, kn, vn, cache_seqlens=lens, block_table=table, causal=True,
                                      cache_dtype=kind, k_scale=ks, v_scale=vs)
    assert np.array_equal(np.asarray(o_j), o_n), "the jax and numpy fronts differ"
    assert np.array_equal(np.asarray(kc.view(jnp.uint8)), bits(kq).reshape(kq.shape))
    assert np.array_equal(bits(np.asarray(ksj)), bits(ks)) and np.array_equal(bits(np.asarray(vsj)), bits(vs))
    a = fj.quantize_cache(jnp.asarray(kn), jnp.asarray(vn), kind)
    b = flashattn.quantize_cache(kn, vn, kind)
    assert a[0].dtype == code and np.array_equal(np.asarray(a[0].view(jnp.uint8)), bits(b[0]).reshape(kn.shape))


@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_jax_append_of_tiny_rows_follows_the_rule(rng, kind):
    """New tokens of subnormal size (and rows whose amax / max is subnormal), appended through
    the JAX front, get the codes and scales quantize_cache and the numpy append give: XLA runs
    custom calls with denormals-are-zero and flush-to-zero, under which such rows got scale 1
    and zero codes."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import flashattn.jax as fj
    tiny = np.finfo(np.float32).tiny
    amax = np.array([1e-40, 2.7e-43, 1e-38, 100 * tiny, 127 * tiny, 448 * tiny, 1e-36, 1.0], np.float32)
    B, D = len(amax), 16
    r = rng.standard_normal((B, D)).astype(np.float32)
    x = (r / np.abs(r).max(-1, keepdims=True) * amax[:, None]).astype(np.float32).reshape(B, 1, 1, D)
    q = rng.standard_normal((B, 1, 1, D)).astype(np.float32)
    code = np.int8 if kind == "int8" else FP8
    want_codes, want_scales, _, _ = flashattn.quantize_cache(x, x, kind)
    kc, vc = np.zeros((B, 16, 1, D), code), np.zeros((B, 16, 1, D), code)
    ks, vs = np.ones((B, 16, 1), np.float32), np.ones((B, 16, 1), np.float32)
    lens = np.zeros(B, np.int32)
    flashattn.kvcache_attention(q, kc, vc, x, x, cache_seqlens=lens, cache_dtype=kind, k_scale=ks, v_scale=vs)
    jcode = jnp.int8 if kind == "int8" else jnp.float8_e4m3fn
    out = fj.kvcache_attention(jnp.asarray(q), jnp.zeros(kc.shape, jcode), jnp.zeros(vc.shape, jcode), jnp.asarray(x),
                               jnp.asarray(x), cache_seqlens=lens, cache_dtype=kind, k_scale=jnp.ones(ks.shape),
                               v_scale=jnp.ones(vs.shape))
    for got_c, got_s in ((kc[:, 0], ks[:, 0]), (np.asarray(out[1])[:, 0], np.asarray(out[3])[:, 0])):
        assert np.array_equal(bits(got_c), bits(want_codes[:, 0])), f"codes differ (seed {SEED})"
        assert np.array_equal(got_s, want_scales[:, 0]), f"scales differ (seed {SEED})"
    assert np.all(want_scales[:5, 0] == tiny) and np.any(bits(want_codes[2:7]) != 0)


def test_jax_quantize_cache_under_jit_says_it_runs_on_the_host():
    """It raised JAX's TracerArrayConversionError, which names neither the function nor the way out."""
    jax = pytest.importorskip("jax")
    import flashattn.jax as fj
    k = np.ones((1, 4, 2, 8), np.float32)
    with pytest.raises(TypeError, match="quantize_cache runs on the host and cannot be traced"):
        jax.jit(lambda k: fj.quantize_cache(k, k, "int8"))(k)


def test_append_of_a_non_finite_token_names_its_index():
    """An append into a quantized cache refuses a non-finite new element, naming it as the
    caller indexes k_new / v_new [B, Sq_new, Hk, D] (it said "v_new element 197")."""
    rng = np.random.default_rng(SEED)
    B, S, Hk, D = 2, 16, 2, 8
    k, v = (rng.standard_normal((B, S, Hk, D)).astype(np.float32) for _ in range(2))
    kq, ks, vq, vs = flashattn.quantize_cache(k, v, "int8")
    kn, vn = (rng.standard_normal((B, 1, Hk, D)).astype(np.float32) for _ in range(2))
    at = (int(rng.integers(B)), 0, int(rng.integers(Hk)), int(rng.integers(D)))
    vn[at] = np.nan
    q = rng.standard_normal((B, 1, 2 * Hk, D)).astype(np.float32)
    want = r"v_new\[" + ", ".join(map(str, at)) + r"\] .*is not finite"
    with pytest.raises(ValueError, match=want):
        flashattn.kvcache_attention(q, kq, vq, kn, vn, cache_seqlens=[3, 5], cache_dtype="int8", k_scale=ks,
                                    v_scale=vs)


def test_dtype_objects_name_the_cache_dtype():
    """quantize_cache's dtype may be a dtype object (np.int8, jnp.int8, ml_dtypes' or jnp's
    float8_e4m3fn) as well as its name; jnp.int8 was refused."""
    k = np.random.default_rng(SEED).standard_normal((1, 4, 2, 8)).astype(np.float32)
    want = {n: flashattn.quantize_cache(k, k, n) for n in ("int8", "fp8")}
    kinds = [(np.int8, "int8"), (ml_dtypes.float8_e4m3fn, "fp8")]
    jnp = pytest.importorskip("jax.numpy")
    kinds += [(jnp.int8, "int8"), (jnp.float8_e4m3fn, "fp8")]
    for d, n in kinds:
        got = flashattn.quantize_cache(k, k, d)
        assert all(np.array_equal(a.view(np.uint8) if a.dtype.itemsize == 1 else a,
                                  b.view(np.uint8) if b.dtype.itemsize == 1 else b) for a, b in zip(got, want[n]))
    with pytest.raises(ValueError, match="dtype must be one of int8, fp8"):
        flashattn.quantize_cache(k, k, np.float16)


def test_scale_arrays_judged_as_caches(rng):
    """Scale arrays meet the caches' rules, said in words: torch refuses writing into scales
    that require grad (it wrote them, no error), and names the dtype, shape or strides it got;
    JAX says a wrong-shaped scale's shape (it said the scale was missing); numpy says a
    read-only scale is read-only (it named C-contiguous strides). torch's quantize_cache reads
    a negated view as its values (the codes of x, not of -x)."""
    torch = pytest.importorskip("torch")
    import flashattn.torch as ft
    kf = randn(rng, (2, 32, 2, 16), "f32")
    kq, ks = flashattn.quantize_cache(kf, kf, "int8")[:2]
    q, kn = randn(rng, (2, 1, 4, 16), "f32"), randn(rng, (2, 1, 2, 16), "f32")
    lens = np.array([3, 5], np.int32)
    t = {n: torch.from_numpy(np.array(a)) for n, a in (("q", q), ("kc", kq), ("vc", kq), ("kn", kn), ("lens", lens))}
    vs = torch.from_numpy(ks.copy())
    with pytest.raises(RuntimeError, match="k_scale requires grad and is written in place"):
        ft.kvcache_attention(t["q"], t["kc"], t["vc"].clone(), t["kn"], t["kn"], t["lens"], cache_dtype="int8",
                             k_scale=torch.from_numpy(ks.copy()).requires_grad_(), v_scale=vs)
    for bad, got in ((torch.from_numpy(ks.astype(np.float64)), "got torch.float64"),
                     (torch.from_numpy(ks[..., :1].copy()), r"got shape \(2, 32, 1\)"),
                     (torch.from_numpy(ks.copy()).transpose(0, 1).contiguous().transpose(0, 1), "got strides")):
        with pytest.raises(ValueError, match=f"k_scale must be a contiguous float32 tensor of shape .*{got}"):
            ft.kvcache_attention(t["q"], t["kc"], t["vc"], cache_seqlens=t["lens"], cache_dtype="int8",
                                 k_scale=bad, v_scale=vs)
    ro = ks.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="k_scale is written in place .* got a read-only array"):
        flashattn.kvcache_attention(q, kq.copy(), kq.copy(), kn, kn, lens, cache_dtype="int8", k_scale=ro,
                                    v_scale=ks.copy())
    pytest.importorskip("jax")
    import flashattn.jax as fj
    with pytest.raises(ValueError, match=r"k_scale must have shape \(2, 32, 2\) .*got \(2, 32, 1\)"):
        fj.kvcache_attention(q, kq, kq, cache_seqlens=lens, cache_dtype="int8", k_scale=ks[..., :1], v_scale=ks)
    x = torch.from_numpy(kf)
    neg = torch._neg_view(x)  # contiguous, with the negative bit: its data are x's
    assert torch.equal(ft.quantize_cache(neg, neg, "int8")[0], ft.quantize_cache(-x, -x, "int8")[0])

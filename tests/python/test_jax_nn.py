"""flashattn.jax.dot_product_attention against the installed jax.nn.dot_product_attention:
the same signature, and on random cases (shapes, GQA, unbatched inputs, masks and biases of
every broadcast shape, boolean biases, Sq != Sk, causal, local windows, padding lengths, rows
with no visible key) the same output, residual and gradients in q, k, v and bias.

FA_JAX_NN_CASES sets the number of cases (default 60, the slice the default run takes;
make check-long runs 600); each case's draws come from the run's seed and its index."""
import inspect
import os

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import flashattn.jax as fj  # noqa: E402
from conftest import SEED  # noqa: E402

CASES = int(os.environ.get("FA_JAX_NN_CASES", "60"))
TOL = {"float32": 2e-5, "bfloat16": 3e-2, "float16": 5e-3}  # max|diff| / max|jax.nn|
# float32: a gradient past 2e-5 of max|jax.nn| is held to the roundoff of the terms that
# cancel in it (_roundoff_bounds; check_case). Measured over 300 cases (FA_TEST_SEED=3): 57 of
# 790 f32 gradients went there, the largest at 0.2 of its bound; 1,200 cases at two other
# seeds passed. It was 5e-4, 25 times looser than anything needed.
GRAD_TOL = {"float32": 2e-5, "bfloat16": 6e-2, "float16": 1e-2}


def test_signature_is_jax_nn_s():
    assert inspect.signature(fj.dot_product_attention) == inspect.signature(jax.nn.dot_product_attention) or \
        [(p.name, p.kind, p.default) for p in inspect.signature(fj.dot_product_attention).parameters.values()] == \
        [(p.name, p.kind, p.default) for p in inspect.signature(jax.nn.dot_product_attention).parameters.values()]


def _broadcast_shape(r, full):
    """A shape broadcastable to full: each dim 1 or full, leading dims sometimes dropped."""
    shape = tuple(int(d) if r.random() < 0.5 else 1 for d in full)
    drop = int(r.integers(0, 3)) if r.random() < 0.3 else 0
    return shape[drop:] if all(d == 1 for d in shape[:drop]) else shape


def draw_case(i):
    r = np.random.default_rng([SEED, 0x6E6E, i])
    B, T, S = int(r.integers(1, 3)), int(r.integers(1, 10)), int(r.integers(1, 10))
    K, G, H = int(r.integers(1, 3)), int(r.integers(1, 4)), int(r.choice([4, 8, 16]))
    N = K * G
    c = dict(B=B, T=T, S=S, N=N, K=K, H=H, unbatched=r.random() < 0.1,
             dtype=str(r.choice(["float32"] * 6 + ["bfloat16"])), kw={})
    if c["unbatched"]:
        c["B"] = B = 1
    full = (B, N, T, S) if not c["unbatched"] else (N, T, S)
    if r.random() < 0.4:
        c["bias"] = (_broadcast_shape(r, full), "bool" if r.random() < 0.2 else "float")
    if r.random() < 0.5:  # densities down to 0: rows with no visible key
        c["mask"] = (_broadcast_shape(r, full), float(r.choice([0.0, 0.3, 0.7, 0.9])))
    kw = c["kw"]
    if r.random() < 0.4:
        kw["is_causal"] = True
    if r.random() < 0.3:
        w = (int(r.integers(-1, 5)), int(r.integers(-1, 5)))
        kw["local_window_size"] = w if r.random() < 0.7 else max(w[0], 0)
    if r.random() < 0.3:
        kw["scale"] = float(r.uniform(0.05, 1.0))
    if not c["unbatched"] and r.random() < 0.3:
        kw["query_seq_lengths"] = r.integers(0, T + 1, size=B).astype(np.int32)
    if not c["unbatched"] and r.random() < 0.3:
        kw["key_value_seq_lengths"] = r.integers(0, S + 1, size=B).astype(np.int32)
    c["return_residual"] = bool(r.random() < 0.5)
    c["rng"] = r
    return c


def _arrays(c):
    r, dt = c["rng"], jnp.dtype(c["dtype"])
    lead = () if c["unbatched"] else (c["B"],)
    q = jnp.asarray(r.standard_normal(lead + (c["T"], c["N"], c["H"])), dt)
    k = jnp.asarray(r.standard_normal(lead + (c["S"], c["K"], c["H"])), dt)
    v = jnp.asarray(r.standard_normal(lead + (c["S"], c["K"], c["H"])), dt)
    bias = mask = None
    if "bias" in c:
        shape, kind = c["bias"]
        bias = jnp.asarray(r.random(shape) < 0.5) if kind == "bool" else jnp.asarray(r.standard_normal(shape), dt)
    if "mask" in c:
        shape, density = c["mask"]
        mask = jnp.asarray(r.random(shape) < density)
    kw = {n: (jnp.asarray(x) if isinstance(x, np.ndarray) else x) for n, x in c["kw"].items()}
    return q, k, v, bias, mask, kw


# the floor of _rel's denominator: inputs are O(1), so a result that cancels to about 0 (the
# gradient of a bias constant along the keys is exactly 0) is compared at the inputs' scale
# of rounding, not its own
FLOOR = {"float32": 1e-2, "bfloat16": 1.0, "float16": 1.0}


def _rel(x, ref, dtype="float32", floor=None):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    assert x.shape == ref.shape
    assert not np.isnan(x).any()
    return np.abs(x - ref).max(initial=0.0) / max(np.abs(ref).max(initial=0.0), floor or FLOOR[dtype])


def _dbias_floor(dtype, q_shape, n_heads, bias_shape):
    """FLOOR for dbias: each element of it sums the score gradient over the rows (batch, head,
    query) the bias is broadcast along, and each row's sum over keys is what cancels to about
    0 at FLOOR's scale, so r rows' sum cancels at r times it (a bias of shape (1, 1, 1, 1) sums
    every row: FA_TEST_SEED=715975242 case 15, both sums about 5e-6 from the exact 0)."""
    rows = int(np.prod(q_shape[:-2])) * n_heads  # (batch,) query rows, times heads
    bias_rows = int(np.prod(bias_shape[:-1]))
    return FLOOR[dtype] * max(1, rows // max(bias_rows, 1))


def _probabilities(q, k, bias, mask, kw):
    """jax.nn's attention probabilities P [.., T, N, S], by its own rules (masks, windows,
    lengths, rows with no visible key): its output for one-hot values, H keys at a time."""
    S, H = k.shape[-3], k.shape[-1]
    parts = []
    for c0 in range(0, S, H):
        onehot = (np.arange(S)[:, None] == c0 + np.arange(H)[None, :]).astype(np.float32)  # [S, H]
        v = jnp.asarray(np.broadcast_to(onehot[:, None, :], k.shape), k.dtype)
        parts.append(np.asarray(jax.nn.dot_product_attention(q, k, v, bias, mask, **kw), np.float64))
    return np.concatenate(parts, -1)[..., :S]


U32 = 2.0**-24  # float32's unit roundoff (both implementations accumulate in float32)
# o as the backward reads it (D = rowsum(do * o)) and jax.nn's own products are rounded to
# bf16: twice its unit roundoff of the terms; float32: none beyond the accumulation's
U_OUT = {"float32": 0.0, "bfloat16": 2.0**-7}


def _roundoff_bounds(q, k, v, bias, mask, kw, w, o, dtype):
    """Bounds on the roundoff of dq, dk and dbias where they cancel: dS = P*(dP - D) is 0
    where a row sees one key (P = 1, dP = D), so its computed value is roundoff of the terms
    |P*dP| + |P*D| (dot products of S + H terms: n float32 roundoffs of them, plus U_OUT);
    dq and dk carry it times |k| and |q| (dk summed over the query heads sharing a key),
    dbias summed over its broadcast dims (m more additions). Float64 from jax.nn's own P;
    only asked for where a gradient misses its bound relative to its own size."""
    p = _probabilities(q, k, bias, mask, kw)  # [.., T, N, S]
    qf, kf, vf, wf, of = (np.asarray(x, np.float64) for x in (q, k, v, w, o))
    g = q.shape[-2] // k.shape[-2]
    kn, vn = np.repeat(kf, g, -2), np.repeat(vf, g, -2)  # [.., S, N, H]: query head n reads n // g
    dp = np.einsum("...tne,...sne->...tns", wf, vn)
    d = (wf * of).sum(-1)[..., None]
    terms = p * (np.abs(dp) + np.abs(d))
    scale = kw.get("scale") or q.shape[-1] ** -0.5
    u = (k.shape[-3] + q.shape[-1]) * U32 + U_OUT[dtype]
    sq = scale * np.einsum("...tns,...snd->...tnd", terms, np.abs(kn)).max(initial=0.0)
    dk_n = np.einsum("...tns,...tnd->...snd", terms, np.abs(qf))
    sk = scale * dk_n.reshape(dk_n.shape[:-2] + (k.shape[-2], g, q.shape[-1])).sum(-2).max(initial=0.0)
    full = np.moveaxis(terms, -2, -3)  # [.., N, T, S], as a bias
    out = {"dq": u * sq, "dk": u * sk, "dbias": 0.0}
    if bias is not None and bias.dtype != jnp.bool_:
        summed = full.size // max(int(np.prod(bias.shape)), 1)
        out["dbias"] = (u + summed * U32) * float(_sum_to(full, bias.shape).max(initial=0.0))
    return out


def _sum_to(x, shape):
    """x summed over the dims it has beyond shape and where shape has 1 (numpy broadcast's
    reverse)."""
    x = x.sum(tuple(range(x.ndim - len(shape))))
    return x.sum(tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1), keepdims=True)


# a case's cost is compiling its program: XLA's cheapest optimization level (the results are
# compared with tolerances that do not depend on how XLA fuses the reference)
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _nn_in_f32(q, k, v, bias, mask, **kw):
    """jax.nn's attention on f32 copies of q, k, v and a float bias, o cast back to q's dtype
    (gradients flow back through the casts to the inputs' dtypes): the reference where XLA's
    CPU backend cannot compile jax.nn's bf16 dot for a shape at any optimization level
    ("Algorithm not supported by the ElementalIrEmitter: ALG_DOT_BF16_BF16_F32", seen at
    T = S = N = K = 1 with a bias)."""
    up = lambda x: x.astype(jnp.float32) if x is not None and x.dtype != jnp.bool_ else x  # noqa: E731
    res = jax.nn.dot_product_attention(up(q), up(k), up(v), up(bias), mask, **kw)
    if kw.get("return_residual"):
        return res[0].astype(q.dtype), res[1]
    return res.astype(q.dtype)


def _both(q, k, v, bias, mask, kw, rr, w, ref=jax.nn.dot_product_attention):
    """Outputs and gradients of jax.nn's (or ref's) and the drop-in's, in one jitted program
    (one compilation per case: compiling is what a case costs)."""
    float_bias = bias is not None and bias.dtype != jnp.bool_
    argnums = (0, 1, 2, 3) if float_bias else (0, 1, 2)

    def run(fn):
        def loss(q, k, v, b):
            res = fn(q, k, v, b, mask, return_residual=rr, **kw)
            o = res[0] if rr else res
            return jnp.sum(o.astype(jnp.float32) * w), res
        grads, res = jax.grad(loss, argnums=argnums, has_aux=True)(q, k, v, bias)
        return res, grads

    return run(ref), run(fj.dot_product_attention)


def check_case(i):
    c = draw_case(i)
    q, k, v, bias, mask, kw = _arrays(c)
    what = f"case {i} (FA_TEST_SEED={SEED}): {({n: c[n] for n in ('B', 'T', 'S', 'N', 'K', 'H', 'dtype')})} " \
           f"bias {c.get('bias')} mask {c.get('mask')} {c['kw']}"
    rr = c["return_residual"]
    out_shape = q.shape[:-1] + v.shape[-1:]
    w = jnp.asarray(c["rng"].standard_normal(out_shape), q.dtype)
    arrays = {n: x for n, x in kw.items() if isinstance(x, jax.Array)}
    static = {n: x for n, x in kw.items() if n not in arrays}
    fn = jax.jit(lambda q, k, v, bias, mask, arrays, w: _both(q, k, v, bias, mask, dict(static, **arrays), rr, w))
    args = (q, k, v, bias, mask, arrays, w)
    try:
        compiled = fn.lower(*args).compile(FAST_COMPILE)
    except jax.errors.JaxRuntimeError as e:  # jax.nn's bf16 dot: some shapes need XLA's optimizing passes
        if "ElementalIrEmitter" not in str(e):
            raise
        try:
            compiled = fn.lower(*args).compile()
        except jax.errors.JaxRuntimeError as e2:  # and some compile at no level: jax.nn on f32 copies
            if "ElementalIrEmitter" not in str(e2):
                raise
            fn = jax.jit(lambda q, k, v, bias, mask, arrays, w: _both(q, k, v, bias, mask, dict(static, **arrays), rr,
                                                                      w, _nn_in_f32))
            compiled = fn.lower(*args).compile(FAST_COMPILE)
    (ref, g_ref), (got, g_got) = compiled(*args)
    if rr:
        (ref, ref_lse), (got, got_lse) = ref, got
        assert got_lse.dtype == ref_lse.dtype and got_lse.shape == ref_lse.shape, what
        a, b = np.asarray(got_lse, np.float64), np.asarray(ref_lse, np.float64)
        np.testing.assert_allclose(a, b, rtol=TOL[c["dtype"]] * 4, atol=TOL[c["dtype"]] * 4, err_msg=what)
    assert got.shape == ref.shape and got.dtype == ref.dtype, what
    assert _rel(got, ref, c["dtype"]) <= TOL[c["dtype"]], what
    bounds = None
    for name, a, b in zip(("dq", "dk", "dv", "dbias"), g_got, g_ref):
        assert a.shape == b.shape and a.dtype == b.dtype, (name, what)
        floor = _dbias_floor(c["dtype"], q.shape, c["N"], b.shape) if name == "dbias" else None
        e = _rel(a, b, c["dtype"], floor)
        if e > GRAD_TOL[c["dtype"]] and name != "dv":  # a gradient that cancels: within its terms' roundoff
            bounds = bounds or _roundoff_bounds(q, k, v, bias, mask, dict(static, **arrays), w, ref, c["dtype"])
            err = float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max(initial=0.0))
            assert err <= bounds[name], (name, e, f"error {err:.2e} > roundoff bound {bounds[name]:.2e}", what)
        else:
            assert e <= GRAD_TOL[c["dtype"]], (name, e, what)


@pytest.mark.parametrize("i", range(CASES))
def test_matches_jax_nn(i):
    check_case(i)


def test_rows_with_no_visible_key_follow_jax_nn():
    """An all-False mask row is the mean of every value in jax.nn (hidden scores become a
    large finite number), and a row past query_seq_lengths is 0: the drop-in agrees; the
    library's own function gives o = 0 for both."""
    r = np.random.default_rng(SEED)
    q, k, v = (jnp.asarray(r.standard_normal((1, 3, 2, 8)), jnp.float32) for _ in range(3))
    mask = jnp.ones((1, 1, 3, 3), bool).at[0, 0, 1].set(False)
    got = fj.dot_product_attention(q, k, v, mask=mask)
    np.testing.assert_allclose(got[0, 1], jnp.mean(v[0], axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, jax.nn.dot_product_attention(q, k, v, mask=mask), rtol=1e-5, atol=1e-6)
    assert float(jnp.abs(fj.attention(q, k, v, mask=mask)[0, 1]).max()) == 0.0
    lens = jnp.array([2], jnp.int32)
    got = fj.dot_product_attention(q, k, v, query_seq_lengths=lens)
    assert float(jnp.abs(got[0, 2]).max()) == 0.0


def test_implementation():
    q = jnp.ones((1, 2, 1, 4), jnp.float32)
    fj.dot_product_attention(q, q, q, implementation="xla")
    with pytest.raises(ValueError, match="cudnn"):
        fj.dot_product_attention(q, q, q, implementation="cudnn")
    with pytest.raises(ValueError, match="mask dtype"):
        fj.dot_product_attention(q, q, q, mask=jnp.ones((1, 1, 2, 2), jnp.float32))


def test_a_traced_scale_runs_and_is_differentiated_as_in_jax_nn():
    """jax.nn takes scale as a traced value (a jit argument, a learned temperature) and
    differentiates it; the drop-in refused one (the library's scale is static). It now
    multiplies query by it: the same outputs and d/dscale as jax.nn's, within f32 rounding."""
    rng = np.random.default_rng([SEED, 17])
    q, k, v = (jnp.asarray(rng.standard_normal((2, 5, 4, 8)).astype(np.float32)) for _ in range(3))
    loss = lambda f: (lambda s: jnp.sum(f(q, k, v, scale=s, is_causal=True) ** 2))  # noqa: E731
    s = jnp.float32(0.3)
    want_o = jax.jit(lambda s: jax.nn.dot_product_attention(q, k, v, scale=s, is_causal=True))(s)
    got_o = jax.jit(lambda s: fj.dot_product_attention(q, k, v, scale=s, is_causal=True))(s)
    np.testing.assert_allclose(np.asarray(got_o), np.asarray(want_o), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got_o), np.asarray(fj.dot_product_attention(q, k, v, scale=0.3,
                                                                                       is_causal=True)),
                               rtol=1e-5, atol=1e-6)
    want_g = jax.grad(loss(jax.nn.dot_product_attention))(s)
    got_g = jax.jit(jax.grad(loss(fj.dot_product_attention)))(s)
    np.testing.assert_allclose(float(got_g), float(want_g), rtol=1e-4)
    with pytest.raises(ValueError, match="scale must be a scalar"):
        jax.jit(lambda s: fj.dot_product_attention(q, k, v, scale=s))(jnp.ones(2))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_residual_with_no_keys_is_minus_inf_as_in_jax_nn(dtype):
    """S = 0 keys: jax.nn's residual is logsumexp over nothing, -inf in every row, eager and
    under jit; the drop-in gave the large negative number of a fully masked row
    (-2.38e38, its fill for S >= 1) instead."""
    q = jnp.ones((1, 3, 2, 8), dtype)
    k = v = jnp.zeros((1, 0, 2, 8), dtype)
    for f in (fj.dot_product_attention, jax.nn.dot_product_attention):
        for run in (f, jax.jit(f, static_argnames="return_residual")):
            o, lse = run(q, k, v, return_residual=True)
            assert lse.shape == (1, 3, 2) and lse.dtype == dtype
            assert bool(jnp.all(jnp.isneginf(lse))), (f, lse)
            assert float(jnp.abs(o.astype(jnp.float32)).max()) == 0.0


def test_traced_local_window_size_as_jax_nn():
    """A local_window_size traced under jit (a jit argument) is jax.nn's window rule applied as
    a mask; it was refused with JAX's ConcretizationTypeError, naming no argument."""
    rng = np.random.default_rng(SEED)
    q, k, v = (jnp.asarray(rng.standard_normal((2, 5, 4, 8)), jnp.float32) for _ in range(3))
    want = fj.dot_product_attention(q, k, v, local_window_size=(2, 1))
    for arg in ((2, 1), 2):
        if isinstance(arg, tuple):
            got = jax.jit(lambda w: fj.dot_product_attention(q, k, v, local_window_size=(w, 1)))(arg[0])
        else:
            got = jax.jit(lambda w: fj.dot_product_attention(q, k, v, local_window_size=w))(arg)
            want = fj.dot_product_attention(q, k, v, local_window_size=arg)
        ref = jax.nn.dot_product_attention(q, k, v, local_window_size=arg, implementation="xla")
        assert float(jnp.abs(got - want).max()) < 1e-6 and float(jnp.abs(got - ref).max()) < 1e-5


def test_float64_with_x64_off_runs_as_float32_in_every_function():
    """With jax_enable_x64 off JAX holds float64 as float32: quantize_cache, plan and
    cost_estimate take it as the attention functions do (they refused it by its numpy dtype)."""
    if jax.config.jax_enable_x64:
        pytest.skip("x64 is on in this process")
    rng = np.random.default_rng(SEED)
    q = rng.standard_normal((1, 8, 2, 16))
    assert fj.cost_estimate(q, q, q).flops == fj.cost_estimate(q.astype(np.float32), q.astype(np.float32),
                                                               q.astype(np.float32)).flops
    fj.plan(q, q, q)
    kq, ks, vq, vs = fj.quantize_cache(q, q.tolist(), "int8")
    assert kq.dtype == jnp.int8 and ks.dtype == jnp.float32 and vq.shape == q.shape

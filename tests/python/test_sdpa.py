"""flashattn.torch.scaled_dot_product_attention against torch.nn.functional's, on random
cases: shapes (2 to 5 dims, broadcast batch dims), GQA with enable_gqa and broadcast heads
without it, Sq != Sk, causal (top-left), bool and float masks of every broadcast shape, rows
with no visible key, zero-size sequences; forward and gradients (query, key, value, float
mask), f32 and bf16 within the dtype's bounds; and SDPA's errors.

The default run draws FA_SDPA_CASES cases (60); `make check-long` runs 600. Each case has its
own seed, printed on failure: FA_TEST_SEED=<run seed> repeats the run."""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import flashattn.torch as fat  # noqa: E402
from conftest import BWD_TOL, FWD_TOL, SEED, check  # noqa: E402


N_CASES = int(os.environ.get("FA_SDPA_CASES", "60"))
TDT = {"f32": torch.float32, "bf16": torch.bfloat16}


def draw(rng):
    """One case: shapes, options and inputs, as SDPA takes them."""
    dtype = "f32" if rng.random() < 0.7 else "bf16"
    B, L = int(rng.integers(1, 4)), int(rng.integers(1, 40))
    S = 0 if rng.random() < 0.03 else int(rng.integers(1, 48))
    E = int(rng.choice([8, 16, 32]))
    Ev = E if rng.random() < 0.7 else int(rng.choice([8, 24]))
    Hk = int(rng.choice([1, 2, 3]))
    kind = rng.choice(["mha", "gqa", "mqa_broadcast"])
    if kind == "gqa":
        Hq, gqa = Hk * int(rng.integers(1, 4)), True
    elif kind == "mqa_broadcast":  # Hk = 1 broadcasts without enable_gqa, as in torch.matmul
        Hk, Hq, gqa = 1, int(rng.integers(1, 5)), bool(rng.random() < 0.5)
    else:
        Hq, gqa = Hk, bool(rng.random() < 0.3)
    ndim = int(rng.choice([2, 3, 4, 4, 4, 4, 5]))
    if ndim == 2:  # SDPA's enable_gqa needs a heads dim
        Hq, Hk, B, gqa = 1, 1, 1, False
    lead = {2: (), 3: (), 4: (B,), 5: (2, B)}[ndim]
    hq, hk = ((Hq,), (Hk,)) if ndim >= 3 else ((), ())
    qs, ks, vs = lead + hq + (L, E), lead + hk + (S, E), lead + hk + (S, Ev)
    if ndim >= 4 and rng.random() < 0.2:  # key/value shared over the batch
        ks, vs = (1,) + ks[1:], (1,) + vs[1:]
    causal = bool(rng.random() < 0.25)
    mask = None
    if not causal and rng.random() < 0.7:
        full = lead + ((Hq,) if ndim >= 3 else ()) + (L, S)
        shape = tuple(n if rng.random() < 0.5 else 1 for n in full)
        shape = shape[int(rng.integers(0, max(len(shape) - 1, 1))):] if rng.random() < 0.3 else shape
        if rng.random() < 0.5:
            m = rng.random(shape) < 0.6
            if m.ndim >= 2 and m.shape[-2] > 1 and rng.random() < 0.5:
                m[..., int(rng.integers(m.shape[-2])), :] = False  # rows with no visible key
            mask = torch.from_numpy(m)
        else:
            m = rng.standard_normal(shape).astype(np.float32)
            m[rng.random(shape) < 0.2] = -np.inf
            if m.ndim >= 2 and m.shape[-2] > 1 and rng.random() < 0.5:
                m[..., int(rng.integers(m.shape[-2])), :] = -np.inf
            mask = torch.from_numpy(m)
    scale = None if rng.random() < 0.6 else float(rng.uniform(0.05, 0.5))
    q, k, v = (torch.from_numpy(rng.standard_normal(s).astype(np.float32)).to(TDT[dtype]) for s in (qs, ks, vs))
    return dtype, q, k, v, dict(attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa)


def f64(x):
    return x.detach().to(torch.float64).numpy()


U32 = 2.0**-24  # float32's unit roundoff: the library's and the reference's accumulators
# The output o the backward reads (D = rowsum(do * o), as FlashAttention computes it) is
# rounded to the input dtype: D differs from the reference's by that rounding, twice bf16's
# unit roundoff allowed (2^-9 each for o and for D's f32 sum of rounded products)
U_OUT = {"f32": 0.0, "bf16": 2.0**-8}


def roundoff_bounds(q, k, v, kw, do, mask_shape, dtype):
    """Float64 bounds on the roundoff of dq, dk and a float mask's gradient where they cancel.
    dS = P*(dP - D) is 0 where a row sees one key (P = 1, dP = D), and 0 summed over a row's
    keys (a mask broadcast over them), so its computed value is roundoff of the terms
    |P*dP| + |P*D| (dot products of Sk + D terms: n float32 roundoffs of them, plus o's own
    rounding in D, U_OUT); dq and dk carry it times |k| and |q|, summed as they are (dk over
    the query heads and batch items that share a key), and the mask's gradient summed over
    its broadcast dims (m more additions). Returns {name: bound} (0 where nothing cancels)."""
    q, k0, v = (x.detach().double() for x in (q, k, v))
    k = k0
    if kw["enable_gqa"] and q.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        k, v = (x.repeat_interleave(q.shape[-3] // x.shape[-3], dim=-3) for x in (k, v))
    scale = kw["scale"] if kw["scale"] is not None else q.shape[-1] ** -0.5
    s = q @ k.transpose(-1, -2) * scale
    m = kw["attn_mask"]
    if m is not None:
        s = s + (m.double() if m.is_floating_point() else torch.zeros(m.shape).double().masked_fill(~m, -torch.inf))
    if kw["is_causal"]:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), -torch.inf)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    dp = do.double() @ v.transpose(-1, -2)
    d = (do.double() * (p @ v)).sum(-1, keepdim=True)
    terms = p * (dp.abs() + d.abs())
    n = k.shape[-2] + max(q.shape[-1], v.shape[-1])
    top = lambda t: float(t.max()) if t.numel() else 0.0  # noqa: E731 (no keys: nothing cancels)
    dk = terms.transpose(-1, -2) @ q.abs()
    if k0.dim() >= 3 and kw["enable_gqa"] and dk.shape[-3] != k0.shape[-3]:  # the group's heads, summed
        dk = dk.unflatten(-3, (k0.shape[-3], -1)).sum(-3)
    dk = dk.sum_to_size(k0.shape)
    u = n * U32 + U_OUT[dtype]
    out = {"dq": u * top(terms @ k.abs()) * scale, "dk": u * top(dk) * scale}
    if mask_shape is not None:
        summed = terms.numel() // max(int(np.prod(mask_shape)), 1)
        out["dmask"] = (u + summed * U32) * top(terms.sum_to_size(mask_shape))
    return out


@pytest.mark.parametrize("i", range(N_CASES))
def test_matches_sdpa(i):
    seed = [SEED, i]
    rng = np.random.default_rng(seed)
    dtype, q, k, v, kw = draw(rng)
    mask = kw["attn_mask"]
    where = (f"case {i} (seed {SEED}, FA_SDPA_CASES={N_CASES}): {dtype} q {tuple(q.shape)} k {tuple(k.shape)} "
             f"v {tuple(v.shape)} mask {None if mask is None else (mask.dtype, tuple(mask.shape))} "
             f"causal {kw['is_causal']} gqa {kw['enable_gqa']} scale {kw['scale']}")
    float_mask = mask is not None and mask.is_floating_point()
    ins = [x.clone().requires_grad_() for x in (q, k, v)] + ([mask.clone().requires_grad_()] if float_mask else [])
    o = fat.scaled_dot_product_attention(*ins[:3], **dict(kw, attn_mask=ins[3] if float_mask else mask))
    # SDPA in f32 on the same (rounded) inputs: the exact answer up to f32 roundoff; a float
    # mask enters it materialized, so that its gradient's terms before the broadcast sum show
    ref_ins = [x.detach().float().requires_grad_() for x in ins[:3]]
    if float_mask:
        ref_ins.append(mask.detach().expand(*o.shape[:-1], k.shape[-2]).clone().requires_grad_())
    r = F.scaled_dot_product_attention(*ref_ins[:3], **dict(kw, attn_mask=ref_ins[3] if float_mask else mask))
    assert o.shape == r.shape and o.dtype == q.dtype, where
    if r.numel() == 0:
        return
    check(f"o, {where}", f64(o), f64(r), FWD_TOL[dtype] * (4 if dtype == "f32" else 1))
    do = torch.from_numpy(rng.standard_normal(o.shape).astype(np.float32)).to(o.dtype)
    got = torch.autograd.grad(o, ins, do, allow_unused=True)
    want = list(torch.autograd.grad(r, ref_ins, do.float(), allow_unused=True))
    bounds = roundoff_bounds(*ref_ins[:3], kw, do, tuple(mask.shape) if float_mask else None, dtype)
    if float_mask:
        dfull = torch.zeros_like(ref_ins[3]) if want[3] is None else want[3]
        want[3] = dfull.sum_to_size(mask.shape)
    for name, g, w, x in zip(("dq", "dk", "dv", "dmask"), got, want, ins):
        g = torch.zeros_like(x) if g is None else g
        w = torch.zeros_like(x, dtype=torch.float32) if w is None else w
        assert g.shape == x.shape and g.dtype == x.dtype, (name, where)
        if g.numel():
            # within BWD_TOL of max|ref|, or, where the gradient cancels to about 0, within the
            # roundoff of the terms that cancel (roundoff_bounds: n unit roundoffs of them)
            err, ref = np.abs(f64(g) - f64(w)).max(), np.abs(f64(w)).max()
            bound = max(BWD_TOL[dtype] * ref, bounds.get(name, 0.0))
            assert err <= bound, f"{name}, {where}: error {err:.2e} > {bound:.2e} (max|ref| {ref:.2e})"


def _qkv(Hq=4, Hk=2):
    return torch.randn(1, Hq, 5, 8), torch.randn(1, Hk, 7, 8), torch.randn(1, Hk, 7, 8)


@pytest.mark.parametrize("kw, err, message", [
    ({}, RuntimeError, "must match the size"),                         # heads differ, no enable_gqa
    ({"dropout_p": 1.0, "enable_gqa": True}, ValueError, "dropout_p"),  # (dropout_p > 0 runs: test_dropout.py)
    ({"is_causal": True, "attn_mask": torch.ones(5, 7, dtype=torch.bool), "enable_gqa": True},
     RuntimeError, "attn_mask should not be set when is_causal"),
    ({"attn_mask": torch.ones(5, 7, dtype=torch.int64), "enable_gqa": True}, RuntimeError, "attn_mask dtype"),
    ({"attn_mask": torch.ones(3, 5, 7, dtype=torch.bool), "enable_gqa": True}, RuntimeError, "broadcast"),
])
def test_errors_as_sdpa(kw, err, message):
    q, k, v = _qkv()
    with pytest.raises(err, match=message):
        fat.scaled_dot_product_attention(q, k, v, **kw)
    if err is RuntimeError:  # SDPA refuses the same call alike
        with pytest.raises(RuntimeError):
            F.scaled_dot_product_attention(q, k, v, **kw)


def test_gqa_needs_divisible_heads():
    q, k, v = _qkv(Hq=4, Hk=3)
    for fn in (F.scaled_dot_product_attention, fat.scaled_dot_product_attention):
        with pytest.raises(RuntimeError, match="must divide"):
            fn(q, k, v, enable_gqa=True)


@pytest.mark.parametrize("Hq, Hk, Hv", [(4, 2, 1), (4, 1, 2), (8, 4, 2), (4, 4, 2), (8, 2, 4), (6, 2, 3),
                                        (4, 3, 1), (2, 4, 4)])
def test_gqa_with_key_and_value_head_counts_of_their_own(rng, Hq, Hk, Hv):
    """enable_gqa with Hk != Hv: SDPA repeats key and value each to Hq heads, so each count
    must divide Hq, and they need not divide each other; the drop-in agrees, forward and
    gradients, and refuses what SDPA refuses with its error."""
    q, k, v = (torch.from_numpy(rng.standard_normal((2, h, S, 8)).astype(np.float32)).requires_grad_()
               for h, S in ((Hq, 7), (Hk, 11), (Hv, 11)))
    if Hq % Hk or Hq % Hv:
        for fn in (F.scaled_dot_product_attention, fat.scaled_dot_product_attention):
            with pytest.raises(RuntimeError, match="must divide"):
                fn(q, k, v, enable_gqa=True)
        return
    mask = torch.from_numpy(rng.random((7, 11)) < 0.7)
    o = fat.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    r = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    check("o", f64(o), f64(r), 4 * FWD_TOL["f32"])
    do = torch.from_numpy(rng.standard_normal(o.shape).astype(np.float32))
    for name, g, w in zip(("dq", "dk", "dv"), torch.autograd.grad(o, (q, k, v), do),
                          torch.autograd.grad(r, (q, k, v), do)):
        check(name, f64(g), f64(w), BWD_TOL["f32"])


def test_gqa_single_value_head_is_a_view():
    """The smaller of key and value repeated to the library's kv heads without a copy where
    it has one head (a stride-0 view)."""
    from flashattn._torch_sdpa import _kv_heads
    v = torch.randn(2, 1, 11, 8)
    w = _kv_heads(v, 4)
    assert w.shape == (2, 4, 11, 8) and w.stride(1) == 0 and w.data_ptr() == v.data_ptr()
    assert torch.equal(_kv_heads(torch.arange(2.).reshape(1, 2, 1, 1), 4).flatten(), torch.tensor([0., 0., 1., 1.]))


def test_same_signature_as_sdpa():
    import inspect
    mine = inspect.signature(fat.scaled_dot_product_attention)
    assert list(mine.parameters) == ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                                     "enable_gqa"]
    for name, default in (("attn_mask", None), ("dropout_p", 0.0), ("is_causal", False), ("scale", None),
                          ("enable_gqa", False)):
        assert mine.parameters[name].default == default


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_rows_with_no_visible_key_follow_sdpa(kind):
    """The installed torch's CPU SDPA gives 0 (and zero gradients) for a row with no visible
    key, for a bool mask and a -inf float mask alike; so does the drop-in (docs/python.md)."""
    gen = torch.Generator().manual_seed(SEED)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=gen, requires_grad=True) for _ in range(3))
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[2] = False
    if kind == "float":
        mask = torch.zeros(4, 4).masked_fill(~mask, float("-inf"))
    for fn in (F.scaled_dot_product_attention, fat.scaled_dot_product_attention):
        o = fn(q, k, v, attn_mask=mask)
        assert (o[:, :, 2] == 0).all(), fn
        dq, = torch.autograd.grad(o.sum(), (q,))
        assert (dq[:, :, 2] == 0).all(), fn


@pytest.mark.parametrize("kw", [{}, {"is_causal": True}, {"mask": "bool"}, {"mask": "float"}, {"gqa": True},
                                {"short_q": True}])
def test_output_keeps_the_querys_memory_order(rng, kw):
    """SDPA returns o in query's memory order: for the usual proj(x).view(B, L, H, E)
    .transpose(1, 2) inputs it is a [B, L, H, E] tensor viewed as [B, H, L, E], so
    o.transpose(1, 2).view(B, L, H * E) works; the drop-in returned a contiguous [B, H, L, E]
    (that view raised). Values, strides and gradients as SDPA's."""
    B, L, H, E = 2, 7, 4, 8
    Hk = 2 if kw.get("gqa") else H
    x = torch.from_numpy(rng.standard_normal((B, L, H, E)).astype(np.float32)).requires_grad_()
    kv = torch.from_numpy(rng.standard_normal((B, L, Hk, 2 * E)).astype(np.float32)).requires_grad_()
    q = x.transpose(1, 2)
    k, v = kv[..., :E].transpose(1, 2), kv[..., E:].transpose(1, 2)
    if kw.get("short_q"):
        q = q[:, :, :3]
    extra = {"is_causal": kw.get("is_causal", False), "enable_gqa": bool(kw.get("gqa"))}
    if kw.get("mask") == "bool":
        extra["attn_mask"] = torch.from_numpy(rng.random((q.shape[2], L)) < 0.7) | torch.eye(q.shape[2], L, dtype=bool)
    elif kw.get("mask") == "float":
        extra["attn_mask"] = torch.from_numpy(rng.standard_normal((1, H, q.shape[2], L)).astype(np.float32))
    want = F.scaled_dot_product_attention(q, k, v, **extra)
    got = fat.scaled_dot_product_attention(q, k, v, **extra)
    assert got.stride() == want.stride() and got.shape == want.shape
    check("o", got.detach().numpy(), want.detach().numpy(), FWD_TOL["f32"])
    assert got.transpose(1, 2).view(B, q.shape[2], H * E).data_ptr() == got.data_ptr()
    g = torch.from_numpy(rng.standard_normal(tuple(want.shape)).astype(np.float32))
    gw = torch.autograd.grad(want, (x, kv), g)
    gg = torch.autograd.grad(got, (x, kv), g)
    for name, a, b in zip(("dx", "dkv"), gg, gw):
        check(name, a.numpy(), b.numpy(), BWD_TOL["f32"])


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_mask_on_another_device_is_refused(kind):
    """An attn_mask on another device than query (here meta beside CPU tensors) raises
    ValueError naming both devices, as attention's mask and bias do: the drop-in returned
    uninitialized memory (the op dispatched to its meta kernel)."""
    q, k, v = _qkv(Hq=2, Hk=2)
    mask = torch.ones(5, 7, dtype=torch.bool, device="meta") if kind == "bool" else torch.zeros(5, 7, device="meta")
    with pytest.raises(ValueError, match="attn_mask is on meta but q is on cpu"):
        fat.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("amp", ["bf16", "f16"])
@pytest.mark.parametrize("mdt", ["f32", "f16", "bf16", "f64"])
def test_autocast_casts_a_float_mask_as_sdpa(rng, amp, mdt):
    """Under a CPU autocast SDPA casts a float attn_mask to autocast's dtype with query, key and
    value (float32 rounded to it too; float64, which autocast leaves as it is, is refused by
    SDPA's mask dtype rule); so does the drop-in, which refused an f16 mask under a bf16
    autocast. The mask's gradient comes back in its own dtype."""
    ac = {"bf16": torch.bfloat16, "f16": torch.float16}[amp]
    md = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64}[mdt]
    q, k, v = (torch.from_numpy(rng.standard_normal((2, 2, n, 8)).astype(np.float32)).requires_grad_()
               for n in (5, 6, 6))
    m = torch.from_numpy(rng.standard_normal((5, 6))).to(md).requires_grad_()
    if mdt == "f64":
        for fn in (F.scaled_dot_product_attention, fat.scaled_dot_product_attention):
            with torch.autocast("cpu", dtype=ac), pytest.raises(RuntimeError, match="attn_mask dtype"):
                fn(q, k, v, attn_mask=m)
        return
    with torch.autocast("cpu", dtype=ac):
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        got = fat.scaled_dot_product_attention(q, k, v, attn_mask=m)
    assert got.dtype == want.dtype == ac
    # exactly the drop-in on the inputs cast to autocast's dtype, the mask with them
    cast = fat.scaled_dot_product_attention(*(t.detach().to(ac) for t in (q, k, v, m)))
    torch.testing.assert_close(got, cast, rtol=0, atol=0)
    check("o", f64(got), f64(want), 2 * FWD_TOL[amp])
    do = torch.from_numpy(rng.standard_normal(tuple(want.shape)).astype(np.float32)).to(ac)
    gw = torch.autograd.grad(want, (q, m), do)
    gg = torch.autograd.grad(got, (q, m), do)
    for name, a, b in zip(("dq", "dmask"), gg, gw):
        assert a.dtype == b.dtype
        check(name, f64(a), f64(b), 2 * BWD_TOL[amp])


@pytest.mark.parametrize("kw", [{}, {"is_causal": True}, {"mask": "bool"}, {"mask": "float"}])
def test_unbatched_output_keeps_the_querys_memory_order(rng, kw):
    """Unbatched (3-d) inputs written the usual way, x (L, H * E) viewed as (L, H, E) and
    transposed to (H, L, E): SDPA's o is in that memory order, so o.transpose(0, 1).view(L,
    H * E) works; the drop-in returned a contiguous (H, L, E), and that view raised. Values,
    strides and gradients as SDPA's."""
    L, H, E = 7, 3, 8
    x = torch.from_numpy(rng.standard_normal((L, H * E)).astype(np.float32)).requires_grad_()
    q = k = v = x.view(L, H, E).transpose(0, 1)
    extra = {"is_causal": kw.get("is_causal", False)}
    if kw.get("mask") == "bool":
        extra["attn_mask"] = torch.from_numpy(rng.random((L, L)) < 0.7) | torch.eye(L, dtype=bool)
    elif kw.get("mask") == "float":
        extra["attn_mask"] = torch.from_numpy(rng.standard_normal((H, L, L)).astype(np.float32))
    want = F.scaled_dot_product_attention(q, k, v, **extra)
    got = fat.scaled_dot_product_attention(q, k, v, **extra)
    assert got.shape == want.shape and got.stride() == want.stride() == (E, H * E, 1)
    assert got.transpose(0, 1).view(L, H * E).data_ptr() == got.data_ptr()
    check("o", got.detach().numpy(), want.detach().numpy(), FWD_TOL["f32"])
    g = torch.from_numpy(rng.standard_normal((H, L, E)).astype(np.float32))
    gw, = torch.autograd.grad(want, (x,), g)
    gg, = torch.autograd.grad(got, (x,), g)
    check("dx", gg.numpy(), gw.numpy(), BWD_TOL["f32"])


@pytest.mark.parametrize("mask", [[[True] * 7] * 5, 0.0])
def test_a_mask_that_is_no_tensor_raises_sdpas_type_error(mask):
    """A list or a number as attn_mask: SDPA's TypeError and wording (the drop-in raised
    AttributeError)."""
    q, k, v = _qkv(Hq=2, Hk=2)
    message = f"argument 'attn_mask' must be Tensor, not {type(mask).__name__}"
    for fn in (F.scaled_dot_product_attention, fat.scaled_dot_product_attention):
        with pytest.raises(TypeError, match=message):
            fn(q, k, v, attn_mask=mask)


def test_batch_dims_that_do_not_broadcast_are_named():
    """query's batch dims against key's and value's that do not broadcast: RuntimeError, as
    SDPA's, naming the arguments and their shapes (torch.broadcast_shapes' own message named
    'argument at index 1')."""
    q, k, v = torch.randn(2, 2, 5, 8), torch.randn(3, 2, 6, 8), torch.randn(3, 2, 6, 8)
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, k, v)
    with pytest.raises(RuntimeError, match=r"query of shape \[2, 2, 5, 8\], key of shape \[3, 2, 6, 8\] and "
                                           r"value of shape \[3, 2, 6, 8\]: their batch dims .* do not broadcast"):
        fat.scaled_dot_product_attention(q, k, v)

"""Yes/no options (causal, return_lse, bias_grad, the plans' flags) follow one rule in every
front (_problem.flag): True or False, numpy's bool, or the integers 0 and 1; anything else is a
ValueError naming the option, before anything is written. They were taken by their truth, so
causal="False" turned causal masking on and gave a silently different answer. The drop-ins
take theirs as their frameworks do: torch's SDPA a bool (its TypeError otherwise), jax.nn and
the Pallas kernel by truth value."""
import numpy as np
import pytest

import flashattn
from conftest import randn

BAD = ["False", "yes", 2, -1, 0.5, 1.0, None, [True], np.array([True, False])]
GOOD = [(True, True), (False, False), (1, True), (0, False), (np.bool_(True), True), (np.bool_(False), False)]


def _qkv(rng, B=1, H=2, S=6, D=8):
    return [randn(rng, (B, H, S, D)) for _ in range(3)]


def _numpy_calls(rng):
    q, k, v = _qkv(rng)
    qv = q[0].transpose(1, 0, 2).copy()  # [total, H, D]
    cu = np.array([0, 2, 6], np.int32)
    cache = randn(rng, (1, 8, 2, 8))
    qd, kn = randn(rng, (1, 2, 2, 8)), randn(rng, (1, 2, 2, 8))  # 2 new tokens: causal shows the 2nd one more
    return {
        "attention causal": lambda x: flashattn.attention(q, k, v, causal=x),
        "attention return_lse": lambda x: flashattn.attention(q, k, v, return_lse=x),
        "attention_backward causal": lambda x: flashattn.attention_backward(q, k, v, q, np.zeros((1, 2, 6), np.float32),
                                                                           q, causal=x),
        "attention_backward bias_grad": lambda x: flashattn.attention_backward(
            q, k, v, q, np.zeros((1, 2, 6), np.float32), q, bias=np.zeros((6, 6), np.float32), bias_grad=x),
        "varlen causal": lambda x: flashattn.varlen_attention(qv, qv, qv, cu, cu, causal=x),
        "varlen return_lse": lambda x: flashattn.varlen_attention(qv, qv, qv, cu, cu, return_lse=x),
        "kvcache causal": lambda x: flashattn.kvcache_attention(qd, cache.copy(), cache.copy(), kn, kn, cache_seqlens=5, causal=x),
        "kvcache return_lse": lambda x: flashattn.kvcache_attention(qd, cache, cache, cache_seqlens=5, return_lse=x),
        "plan causal": lambda x: flashattn.plan(batch=1, heads=2, seq_q=6, head_dim=8, causal=x),
        "plan bias_grad": lambda x: flashattn.plan(batch=1, heads=2, seq_q=6, head_dim=8, bias_shape=(6, 6),
                                                   bias_grad=x),
        "plan_varlen causal": lambda x: flashattn.plan_varlen(cu, cu, heads=2, head_dim=8, causal=x),
        "plan_kvcache causal": lambda x: flashattn.plan_kvcache(None, batch=1, cache_len=8, seq_q=2, heads=2, head_dim=8,
                                                                causal=x),
    }


@pytest.mark.parametrize("name", list(_numpy_calls(np.random.default_rng(0))))
def test_numpy_flags(rng, name):
    call = _numpy_calls(rng)[name]
    option = name.split()[-1]
    for bad in BAD:
        with pytest.raises(ValueError, match=f"{option} must be True or False, got "):
            call(bad)
    results = {}
    for good, as_bool in GOOD:
        r = call(good)
        if name.startswith("plan"):
            r = sorted(r.forward.items())
        elif isinstance(r, tuple):
            r = tuple(np.asarray(x).tobytes() if x is not None else None for x in r)
        else:
            r = np.asarray(r).tobytes()
        results.setdefault(as_bool, r)
        assert results[as_bool] == r, (name, good)  # 1 and np.True_ give what True gives
    if "return_lse" not in name and "bias_grad" not in name:
        assert results[True] != results[False], name  # the option did something in these cases


def test_numpy_bad_flag_writes_nothing(rng):
    q, k, v = _qkv(rng)
    out = np.full(q.shape, np.nan, np.float32)
    for kw in (dict(causal="False"), dict(return_lse="no")):
        with pytest.raises(ValueError, match="must be True or False"):
            flashattn.attention(q, k, v, out=out, **kw)
        assert np.isnan(out).all()


def test_plan_presence_flags_keep_their_message():
    """alibi, segment_ids and sinks are flags in flashattn.plan (whether the call has them)."""
    for kw in (dict(alibi="yes"), dict(sinks=2), dict(segment_ids=np.zeros((1, 6), np.int32))):
        with pytest.raises(ValueError, match=r"is a flag here \(True or False: whether the call has it\)"):
            flashattn.plan(batch=1, heads=2, seq_q=6, head_dim=8, **kw)
    assert flashattn.plan(batch=1, heads=2, seq_q=6, head_dim=8, alibi=1).forward == \
        flashattn.plan(batch=1, heads=2, seq_q=6, head_dim=8, alibi=True).forward


def test_torch_flags(rng):
    torch = pytest.importorskip("torch")
    import flashattn.torch as ft
    q, k, v = (torch.from_numpy(x) for x in _qkv(rng))
    qv = q[0].transpose(0, 1).contiguous()
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    cache = torch.from_numpy(randn(rng, (1, 8, 2, 8)))
    qd = torch.from_numpy(randn(rng, (1, 1, 2, 8)))
    calls = {
        "causal": [lambda x: ft.attention(q, k, v, causal=x), lambda x: ft.varlen_attention(qv, qv, qv, cu, cu, causal=x),
                   lambda x: ft.kvcache_attention(qd, cache.clone(), cache.clone(), cache_seqlens=5, causal=x)],
        "return_lse": [lambda x: ft.attention(q, k, v, return_lse=x),
                       lambda x: ft.varlen_attention(qv, qv, qv, cu, cu, return_lse=x),
                       lambda x: ft.kvcache_attention(qd, cache.clone(), cache.clone(), cache_seqlens=5, return_lse=x)],
    }
    for option, fns in calls.items():
        for fn in fns:
            for bad in BAD + [torch.tensor([True, False])]:
                with pytest.raises(ValueError, match=f"{option} must be True or False, got "):
                    fn(bad)
            want = fn(True)
            for good in (1, np.bool_(True), torch.tensor(True)):
                got = fn(good)
                for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                    assert torch.equal(a, b), (option, good)


def test_torch_sdpa_flags_as_torch(rng):
    """The drop-in refuses what F.scaled_dot_product_attention refuses, with its message."""
    torch = pytest.importorskip("torch")
    import flashattn.torch as ft
    F = torch.nn.functional
    q, k, v = (torch.from_numpy(x) for x in _qkv(rng))
    for option in ("is_causal", "enable_gqa"):
        for bad in ("False", 1, 0, None, np.bool_(True), torch.tensor(True), 1.0):
            with pytest.raises(TypeError) as theirs:
                F.scaled_dot_product_attention(q, k, v, **{option: bad})
            with pytest.raises(TypeError) as ours:
                ft.scaled_dot_product_attention(q, k, v, **{option: bad})
            assert str(ours.value) == str(theirs.value), (option, bad)
    assert torch.equal(ft.scaled_dot_product_attention(q, k, v, is_causal=True),
                       ft.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))


def test_jax_flags(rng):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import flashattn.jax as fj
    q, k, v = (jnp.asarray(x.transpose(0, 2, 1, 3)) for x in _qkv(rng))  # bshd
    qv = q[0]
    cu = np.array([0, 2, 6], np.int32)
    cache = jnp.asarray(randn(rng, (1, 8, 2, 8)))
    qd = jnp.asarray(randn(rng, (1, 1, 2, 8)))
    calls = {
        "causal": [lambda x: fj.attention(q, k, v, causal=x), lambda x: fj.varlen_attention(qv, qv, qv, cu, cu, causal=x),
                   lambda x: fj.kvcache_attention(qd, cache, cache, cache_seqlens=5, causal=x)[0],
                   lambda x: sorted(fj.plan(q, k, v, causal=x).forward.items())],
        "return_lse": [lambda x: fj.attention(q, k, v, return_lse=x),
                       lambda x: fj.varlen_attention(qv, qv, qv, cu, cu, return_lse=x),
                       lambda x: fj.kvcache_attention(qd, cache, cache, cache_seqlens=5, return_lse=x)[:2],
                       lambda x: fj.cost_estimate(q, k, v, return_lse=x).flops],
    }
    for option, fns in calls.items():
        for fn in fns:
            for bad in BAD:
                with pytest.raises(ValueError, match=f"{option} must be True or False, got "):
                    fn(bad)
            want = jax.tree_util.tree_leaves(fn(True))
            for good in (1, np.bool_(True), jnp.bool_(True)):
                got = jax.tree_util.tree_leaves(fn(good))
                assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(got, want)), (option, good)
    with pytest.raises(ValueError, match=r"causal must be True or False known when the call is built"):
        jax.jit(lambda c: fj.attention(q, k, v, causal=c))(True)


def test_jax_drop_ins_take_truth_as_their_frameworks(rng):
    """jax.nn takes is_causal by its truth value, and so does its drop-in (and the Pallas one
    its causal): code that runs with them runs the same with flashattn's."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import flashattn.jax as fj
    q, k, v = (jnp.asarray(x.transpose(0, 2, 1, 3)) for x in _qkv(rng))
    want = fj.dot_product_attention(q, k, v, is_causal=True)
    for truthy in (1, "yes", np.bool_(True)):
        assert np.array_equal(np.asarray(fj.dot_product_attention(q, k, v, is_causal=truthy)), np.asarray(want))
        assert np.array_equal(np.asarray(jax.nn.dot_product_attention(q, k, v, is_causal=truthy)),
                              np.asarray(jax.nn.dot_product_attention(q, k, v, is_causal=True)))
    qb, kb, vb = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))  # the Pallas kernel's [B, H, S, D]
    assert np.array_equal(np.asarray(fj.flash_attention(qb, kb, vb, causal=1)),
                          np.asarray(fj.flash_attention(qb, kb, vb, causal=True)))

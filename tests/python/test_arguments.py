"""Arguments the fronts once took silently wrong: integers past int64 (which ctypes wrapped:
batch 2**64 + 1 planned batch 1), segment ids past int32 in JAX, a float batch, float64
arrays, out= overlapping an input; and threads= per call."""
import numpy as np
import pytest

import flashattn
from conftest import randn

BASE = dict(batch=2, heads=4, seq_q=16, head_dim=8)


@pytest.mark.parametrize("kw, name", [
    ({"batch": 2**64 + 1}, "batch"), ({"heads": 2**63}, "heads"), ({"seq_q": -(2**63) - 1}, "seq_q"),
    ({"seq_k": 2**64}, "seq_k"), ({"head_dim": 2**64 + 8}, "head_dim"), ({"window": (2**64, 0)}, "window left"),
    ({"window": (0, 2**64 + 3)}, "window right"), ({"diag_offset": 2**64}, "diag_offset"),
    ({"threads": 2**32 + 1}, "threads"), ({"block_q": 2**64 + 16}, "block_q"),
])
def test_plan_integers_past_int64_raise_naming_them(kw, name):
    with pytest.raises(ValueError, match=name):
        flashattn.plan(**dict(BASE, **kw))


def test_plan_float_batch_is_value_error():
    with pytest.raises(ValueError, match="batch must be an integer"):
        flashattn.plan(**dict(BASE, batch=1.5))


def test_numpy_integers_past_int64(rng):
    q = randn(rng, (1, 1, 4, 8))
    for kw, name in (({"diag_offset": 2**64}, "diag_offset"), ({"window": (2**64, 0)}, "window"),
                     ({"threads": 2**40}, "threads")):
        with pytest.raises(ValueError, match=name):
            flashattn.attention(q, q, q, **kw)
    with pytest.raises(ValueError, match="int32"):
        flashattn.attention(q, q, q, q_segment_ids=np.full((1, 4), 2**31), kv_segment_ids=np.zeros((1, 4), int))
    cu = np.array([0, 4])
    with pytest.raises(ValueError, match="diag_offset"):
        flashattn.varlen_attention(q[0].transpose(1, 0, 2), q[0].transpose(1, 0, 2), q[0].transpose(1, 0, 2),
                                   cu, cu, diag_offset=2**64)


def test_float64_error_names_the_dtypes_that_work(rng):
    q = rng.standard_normal((1, 1, 4, 8))
    with pytest.raises(ValueError, match=r"float32, float16 or bfloat16.*float64"):
        flashattn.attention(q, q, q)


def _dtype_spellings():
    """Every way a numpy, PyTorch or JAX user names the three dtypes, with the library's name."""
    import ml_dtypes
    out = [("f32", "f32"), ("float32", "f32"), (np.float32, "f32"), (np.dtype("float32"), "f32"),
           ("f16", "f16"), ("float16", "f16"), ("half", "f16"), (np.float16, "f16"),
           ("bf16", "bf16"), ("bfloat16", "bf16"), (ml_dtypes.bfloat16, "bf16"), (np.dtype(ml_dtypes.bfloat16), "bf16")]
    try:
        import torch
        out += [(torch.float32, "f32"), (torch.float16, "f16"), (torch.bfloat16, "bf16")]
    except ImportError:
        pass
    try:
        import jax.numpy as jnp
        out += [(jnp.float32, "f32"), (jnp.bfloat16, "bf16"), (jnp.dtype("float16"), "f16")]
    except ImportError:
        pass
    return out


@pytest.mark.parametrize("dtype, name", _dtype_spellings(), ids=lambda x: repr(x))
def test_plan_takes_every_front_s_dtype_spelling(dtype, name):
    got = flashattn.plan(**dict(BASE, dtype=dtype)).forward
    assert got == flashattn.plan(**dict(BASE, dtype=name)).forward
    assert got["bytes_accessed"] != flashattn.plan(**dict(BASE, dtype="f32" if name != "f32" else "bf16")).forward[
        "bytes_accessed"]


@pytest.mark.parametrize("dtype", ["float64", np.float64, "int8", None, True, object(), 0, 1, 2, 3], ids=repr)
def test_plan_refuses_other_dtypes_naming_them(dtype):
    """... bare ints too: the library's own codes, which planned as some dtype without a word."""
    with pytest.raises(ValueError, match=r"f32, f16 or bf16.*got"):
        flashattn.plan(**dict(BASE, dtype=dtype))
    with pytest.raises(ValueError, match=r"f32, f16 or bf16.*got"):
        flashattn.plan_varlen([0, 4], [0, 4], heads=2, head_dim=8, dtype=dtype)
    with pytest.raises(ValueError, match=r"f32, f16 or bf16.*got"):
        flashattn.plan_kvcache([3], seq_q=1, heads=2, head_dim=8, cache_len=8, dtype=dtype)


@pytest.mark.parametrize("front", ["numpy", "torch", "jax"])
def test_bias_scale_without_a_bias_names_the_argument(rng, front):
    """Every front refuses it in its own words (numpy and torch once passed the library's,
    "bias_scale (has_bias_scale) needs a bias (has_bias)")."""
    q = randn(rng, (1, 2, 8, 8))
    with pytest.raises(ValueError, match=r"bias_scale needs a bias \(bias=\)"):
        if front == "numpy":
            flashattn.attention(q, q, q, bias_scale=0.5)
        elif front == "torch":
            torch = pytest.importorskip("torch")
            import flashattn.torch as ft
            ft.attention(*(torch.from_numpy(q) for _ in range(3)), bias_scale=0.5)
        else:
            pytest.importorskip("jax")
            import flashattn.jax as fj
            fj.attention(q, q, q, bias_scale=0.5, layout="bhsd")


def test_threads_per_call(rng):
    q, k, v = randn(rng, (1, 2, 40, 8)), randn(rng, (1, 2, 40, 8)), randn(rng, (1, 2, 40, 8))
    o1 = flashattn.attention(q, k, v, threads=1)
    o2 = flashattn.attention(q, k, v, threads=2)
    np.testing.assert_array_equal(o1, o2)  # the result does not depend on the thread count
    assert flashattn.plan(**dict(BASE, threads=1)).threads == 1
    flashattn.attention_backward(q, k, v, o1, flashattn.attention(q, k, v, return_lse=True)[1], o1, threads=1)


@pytest.mark.parametrize("which", ["q", "k", "v", "bias"])
def test_out_overlapping_an_input_raises(rng, which):
    arrays = {n: randn(rng, (1, 1, 8, 8)) for n in ("q", "k", "v", "bias")}
    out = arrays[which] if which != "bias" else arrays["bias"].reshape(1, 1, 8, 8)
    kw = {"bias": arrays["bias"][0, 0]}
    with pytest.raises(ValueError, match=f"overlaps {which}"):
        flashattn.attention(arrays["q"], arrays["k"], arrays["v"], out=out, **kw)
    # a view into the same buffer counts as well
    buf = randn(rng, (2, 1, 1, 8, 8))
    with pytest.raises(ValueError, match="overlaps"):
        flashattn.attention(buf[0], buf[0], buf[0], out=buf[0])
    o = flashattn.attention(buf[0], buf[0], buf[0], out=buf[1])  # disjoint halves of one buffer: fine
    assert o is buf[1] or np.shares_memory(o, buf[1])


def test_kvcache_out_overlapping_cache_raises(rng):
    q = randn(rng, (1, 1, 1, 8))
    kc, vc = randn(rng, (1, 16, 1, 8)), randn(rng, (1, 16, 1, 8))
    with pytest.raises(ValueError, match="overlaps"):
        flashattn.kvcache_attention(q, kc, vc, cache_seqlens=4, out=kc[:, :1])


def test_jax_integers_and_segment_ids():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import flashattn.jax as fj
    q = jnp.ones((1, 4, 1, 8), jnp.float32)
    for kw, name in (({"window": (2**64, 0)}, "window left"), ({"threads": 2**40}, "threads")):
        with pytest.raises(ValueError, match=name):
            fj.attention(q, q, q, **kw)
    with pytest.raises(ValueError, match="diag_offset"):
        fj.plan(q, q, q, diag_offset=2**64)
    big = np.array([[0, 1, 2, 2**31]], np.int64)
    with pytest.raises(ValueError, match="q_segment_ids.*int32"):
        fj.attention(q, q, q, q_segment_ids=big, kv_segment_ids=np.zeros((1, 4), np.int32))
    o = fj.attention(q, q, q, threads=1)
    np.testing.assert_allclose(np.asarray(o), np.asarray(fj.attention(q, q, q)))
    cu = jnp.array([0, 4], jnp.int32)
    with pytest.raises(ValueError, match="threads"):
        fj.varlen_attention(q[0], q[0], q[0], cu, cu, threads=2**33)


def _front(front):
    """attention(q, k, v, **options) of a front, on numpy arrays, returning numpy's o."""
    if front == "numpy":
        return flashattn.attention
    if front == "torch":
        torch = pytest.importorskip("torch")
        import flashattn.torch as ft
        return lambda *arrays, **kw: ft.attention(*(torch.from_numpy(np.asarray(a)) for a in arrays), **{
            n: torch.from_numpy(np.asarray(a)) if isinstance(a, np.ndarray) else a for n, a in kw.items()}).numpy()
    pytest.importorskip("jax")
    import flashattn.jax as fj
    return lambda *arrays, **kw: np.asarray(fj.attention(*arrays, layout="bhsd", **kw))


@pytest.mark.parametrize("front", ["numpy", "torch", "jax"])
@pytest.mark.parametrize("name", ["bias", "alibi_slopes", "sinks"])
def test_option_arrays_follow_one_rule(rng, front, name):
    """bias, alibi_slopes and sinks by one rule in every front (_problem.check_real): real
    numbers, float or signed or unsigned integer, taken as float32; bool and complex refused
    (torch once took complex and bool slopes, dropping the imaginary part, and refused int
    sinks; JAX took complex options and bool slopes and sinks)."""
    attention = _front(front)
    q, k, v = (randn(rng, (1, 2, 8, 4)) for _ in range(3))
    ints = rng.integers(0, 3, (8, 8) if name == "bias" else (2,))
    want = attention(q, k, v, **{name: ints.astype(np.float32)})
    for dt in (np.int64, np.int32, np.uint8, np.float16, np.float64):
        np.testing.assert_array_equal(attention(q, k, v, **{name: ints.astype(dt)}), want, err_msg=str(dt))
    err, said = (TypeError, "mask=") if name == "bias" else (ValueError, "real numbers")
    with pytest.raises(err, match=said):
        attention(q, k, v, **{name: ints > 0})
    for dt in (np.complex64, np.complex128):
        with pytest.raises(ValueError, match=f"{name} must be real numbers.*complex"):
            attention(q, k, v, **{name: (ints + 1j).astype(dt)})


@pytest.mark.parametrize("front", ["numpy", "torch", "jax"])
def test_seed_without_dropout_and_threads_none_in_every_front(rng, front):
    """Every front alike: dropout off (dropout_p 0 or None) with a seed is the call without
    dropout (the seed checked, then unused; torch and JAX once refused it, numpy took it);
    threads=None is the library's default (once torch's alone)."""
    attention = _front(front)
    q, k, v = (randn(rng, (1, 2, 8, 4)) for _ in range(3))
    want = attention(q, k, v)
    for kw in ({"dropout_p": 0.0, "seed": 1}, {"seed": 1}, {"threads": None}):
        if front == "torch" and kw == {"seed": 1}:
            kw = {"seed": 1, "dropout_p": None}
        np.testing.assert_array_equal(attention(q, k, v, **kw), want, err_msg=str(kw))
    with pytest.raises(ValueError, match="seed"):
        attention(q, k, v, dropout_p=0.0, seed=-1)


@pytest.mark.parametrize("dtype, said", [(np.int32, "got int32: cast first"),
                                         (">f4", r"got >f4 \(big-endian float32\)"),
                                         (np.float64, "got float64: the library has no float64 kernels")])
def test_numpy_dtype_error_names_the_dtype(rng, dtype, said):
    q = randn(rng, (1, 1, 4, 8)).astype(dtype)
    with pytest.raises(ValueError, match=f"q, k, v must be float32, float16 or bfloat16.*{said}"):
        flashattn.attention(q, q, q)


def test_plan_fits_takes_byte_counts_only():
    """fits("inf") raised OverflowError, fits("nan") numpy's message, fits("1e30") passed where
    fits(1e30) was refused, fits(-1) answered False: every budget is a byte count from 0 to
    2**63 - 1, or ValueError naming it."""
    p = flashattn.plan(batch=1, heads=1, seq_q=8, head_dim=8)
    for bad in ("inf", "nan", "1e30", -1, "-5G", 2**63, "1.3K"):
        with pytest.raises(ValueError, match="memory budget"):
            p.fits(bad)
    assert p.fits("24G") and p.fits(10**9) and not p.fits(0) and p.fits("1.5K") == p.fits(1536)


@pytest.mark.parametrize("front", ["numpy", "torch", "jax"])
def test_diag_offset_needs_something_to_place(rng, front):
    """diag_offset places causal, the window, ALiBi and the masks built for the call; given
    with none of them it changed nothing, silently (library, fronts and CLI alike). Now
    refused; with a flashattn.masks mask alone it still aligns the mask."""
    from flashattn import masks
    attention = _front(front)
    q, k, v = (randn(rng, (1, 2, 8, 4)) for _ in range(3))
    k, v = randn(rng, (1, 2, 12, 4)), randn(rng, (1, 2, 12, 4))
    with pytest.raises(ValueError, match="diag_offset places causal"):
        attention(q, k, v, diag_offset=3)
    with pytest.raises(ValueError, match="diag_offset places causal"):
        attention(q, k, v, diag_offset=0, window=(-1, -1))
    # with something to place: accepted, and the offset matters
    for kw in ({"causal": True}, {"window": (2, 1)}, {"alibi_slopes": np.array([0.5, 0.25], np.float32)}):
        top, bottom = attention(q, k, v, diag_offset=0, **kw), attention(q, k, v, **kw)
        assert not np.array_equal(top, bottom), kw
    # a mask built for the call takes it (top-left chunks, not the default bottom-right)
    want = attention(q, k, v, mask=masks.chunked(4, diag_offset=0))
    np.testing.assert_array_equal(attention(q, k, v, mask=masks.chunked(4), diag_offset=0), want)
    assert not np.array_equal(attention(q, k, v, mask=masks.chunked(4)), want)
    with pytest.raises(ValueError, match="flashattn.masks masks"):  # a call that takes masks names them
        attention(q, k, v, diag_offset=3)
    # (documents pack q and k alike: a square call)
    np.testing.assert_array_equal(attention(q, q, q, mask=masks.chunked(4) & masks.documents([5, 3]), diag_offset=1),
                                  attention(q, q, q, mask=masks.chunked(4, diag_offset=1) & masks.documents([5, 3])))
    # a mask that does not read it (no diagonal, or its own offset) places nothing either
    for m in (masks.documents([5, 3]), masks.chunked(4, diag_offset=1), masks.from_array(np.tril(np.ones((8, 8), bool)))):
        with pytest.raises(ValueError, match="diag_offset places causal"):
            attention(q, q, q, mask=m, diag_offset=0)


def test_budget_strings_are_taken_exactly_as_the_cli_takes_them():
    """Plan.fits' byte budgets by the CLI's rule (tools/cli_args.c, cli_parse_bytes): exact
    integers (they went through float: 2**53 + 1 became 2**53, 2**63 - 1 was refused),
    P and E suffixes, and a fraction that is not a whole number of bytes refused (a float's
    rounding let 1.0000000000000001K through as 1024)."""
    from flashattn._plan import parse_bytes
    for text, want in (("9007199254740993", 2**53 + 1), ("9223372036854775807", 2**63 - 1), ("1.5K", 1536),
                       ("1.50k", 1536), (".5K", 512), ("24GiB", 24 << 30), ("24GB", 24 << 30), ("24giB", 24 << 30),
                       ("512B", 512), ("1P", 1 << 50),
                       ("7E", 7 << 60), ("0", 0)):
        assert parse_bytes(text) == want, text
    for text, said in (("1.0000000000000001K", "whole number"), ("1.3K", "whole number"), ("1.5", "whole number"),
                       ("8E", "2\\*\\*63 - 1"), ("9223372036854775808", "2\\*\\*63 - 1"), ("1e3", "not a number"),
                       ("-1", "not a number"), ("", "not a number"), ("K", "not a number"),
                       ("24gib", "not a number"), ("24Gb", "not a number"), (" 24G", "not a number"),
                       ("24G ", "not a number"), ("\u0661K", "not a number"), ("\uff11G", "not a number"),
                       ("\u0663", "not a number")):  # digits of other scripts: the CLI takes ASCII only
        with pytest.raises(ValueError, match=said):
            parse_bytes(text)


def test_diag_offset_refusal_of_packed_and_cached_calls_names_no_masks(rng):
    """Packed batches and kv caches take no flashattn.masks mask, so their refusal of a
    diag_offset with nothing to place names only causal, the window and ALiBi (it named
    the masks too, which those calls do not accept)."""
    q = randn(rng, (8, 2, 4))
    cu = np.array([0, 3, 8], np.int32)
    with pytest.raises(ValueError, match="diag_offset places causal") as e:
        flashattn.varlen_attention(q, q, q, cu, cu, diag_offset=1)
    assert "masks" not in str(e.value), e.value


def test_bias_grad_without_a_bias_is_refused_by_every_plan(rng):
    """bias_grad with a boolean mask but no bias: the call refuses it (a mask's 0 / -inf bias
    has no gradient), flashattn.plan counted a dbias for it and flashattn.jax.plan /
    cost_estimate dropped the flag silently; every front now refuses it, naming bias_grad."""
    mask = rng.random((1, 1, 8, 8)) < 0.7
    shape = dict(batch=1, heads=2, seq_q=8, head_dim=4)
    for kw in ({"mask": mask}, {"mask_shape": mask.shape}, {}):
        with pytest.raises(ValueError, match="bias_grad needs a bias"):
            flashattn.plan(**shape, bias_grad=True, **kw)
    flashattn.plan(**shape, bias_grad=True, bias_shape=(1, 2, 8, 8), mask=mask)  # with a bias: planned
    q, k, v = (randn(rng, (1, 2, 8, 4)) for _ in range(3))
    o, lse = flashattn.attention(q, k, v, mask=mask, return_lse=True)
    with pytest.raises(ValueError, match="bias_grad needs a bias"):
        flashattn.attention_backward(q, k, v, o, lse, o, mask=mask, bias_grad=True)
    pytest.importorskip("jax")
    import jax
    import flashattn.jax as fj
    s = jax.ShapeDtypeStruct((1, 8, 2, 4), np.float32)
    for kw in ({"mask": jax.ShapeDtypeStruct((1, 1, 8, 8), np.bool_)}, {}):
        with pytest.raises(ValueError, match="bias_grad needs a bias"):
            fj.plan(s, s, s, bias_grad=True, **kw)
        with pytest.raises(ValueError, match="bias_grad needs a bias"):
            fj.cost_estimate(s, s, s, pass_="backward", bias_grad=True, **kw)
    fj.plan(s, s, s, bias_grad=True, bias=jax.ShapeDtypeStruct((1, 2, 8, 8), np.float32))


def test_float_options_refuse_strings_and_bools(rng):
    """scale="0.3", scale=True and softcap="2" were taken as float(v); a float option is a
    number, as the integer options refuse strings and bools."""
    q = randn(rng, (1, 1, 4, 8))
    for kw in ({"scale": "0.3"}, {"scale": True}, {"softcap": "2"}, {"scale": np.bool_(True)}):
        with pytest.raises(ValueError, match="must be a number"):
            flashattn.attention(q, q, q, **kw)
    flashattn.attention(q, q, q, scale=np.float32(0.3), softcap=2)  # numbers of any kind still are


def test_inference_messages_name_the_cause(rng):
    """An empty cu_seqlens list was said to be float64 (numpy's dtype for []), and a cache with
    a reversed dim was said not to be writable, aligned and non-overlapping; both now say
    what is wrong."""
    q = randn(rng, (4, 2, 8))
    with pytest.raises(ValueError, match=r"must both be \[batch \+ 1\]"):
        flashattn.varlen_attention(q, q, q, [], [])
    kc = randn(rng, (1, 8, 2, 8))[:, :, ::-1]
    new = randn(rng, (1, 1, 2, 8))
    with pytest.raises(ValueError, match="k_cache .* must have non-negative strides"):
        flashattn.kvcache_attention(new, kc, kc.copy(), new, new, np.array([3], np.int32))

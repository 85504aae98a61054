"""The numpy front on unusual arrays (found by the unusual-arrays audit): big-endian bfloat16
(its dtype is named "bfloat16" too) is refused like big-endian float32 instead of being read
as native bytes; arrays that numpy flags contiguous although a size-1 or size-0 dim has a
negative or odd stride are copied (np.ascontiguousarray returned them as they were, and the
library refused or the front failed); numpy masked arrays are refused (their mask was
dropped); messages name what was passed."""
import numpy as np
import pytest

import flashattn
from conftest import randn

ml_dtypes = pytest.importorskip("ml_dtypes")


def ref(q, k, v):
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    s = np.einsum("bhid,bhjd->bhij", q, k) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhij,bhjd->bhid", p / p.sum(-1, keepdims=True), v)


def test_big_endian_bfloat16_is_refused_everywhere(rng):
    be = np.dtype(ml_dtypes.bfloat16).newbyteorder(">")
    q = randn(rng, (1, 2, 8, 16)).astype(be)
    with pytest.raises(ValueError, match="native byte order.*big-endian bfloat16"):
        flashattn.attention(q, q, q)
    o = randn(rng, (3, 2, 16)).astype(be)
    lse = randn(rng, (3, 2))
    with pytest.raises(ValueError, match="native byte order"):
        flashattn.merge_states(o, lse, o, lse)
    with pytest.raises(ValueError, match="bfloat16"):
        flashattn.quantize_cache(q, q, "int8")
    cache = randn(rng, (1, 16, 2, 16)).astype(be)
    with pytest.raises(ValueError, match="native byte order"):
        flashattn.kvcache_attention(randn(rng, (1, 1, 2, 16)).astype(be), cache, cache, cache_seqlens=[8])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_strides_numpy_calls_contiguous_are_copied(rng, dtype):
    """Random inputs from the rng fixture (conftest prints its seed; FA_TEST_SEED repeats it)."""
    q, k, v = (randn(rng, (1, 2, 8, 16)).astype(dtype) for _ in range(3))
    want = ref(q, k, v)
    tol = 1e-5 if dtype == np.float32 else 2e-3
    for args in ((q[::-1], k, v), (q, k[::-1], v[::-1])):  # a reversed batch dim of size 1
        assert np.abs(flashattn.attention(*args) - want).max() <= tol
    empty = np.zeros((3, 2, 8, 16), dtype)[::-1][3:]  # shape (0, ...), a negative stride
    assert flashattn.attention(empty, empty, empty).shape == (0, 2, 8, 16)
    rec = np.zeros(1, [("q", dtype, (2, 8, 16)), ("pad", np.uint8)])  # a field: strides not of its itemsize
    rec["q"] = q[0]
    assert np.abs(flashattn.attention(rec["q"], k, v) - ref(q, k, v)).max() <= tol
    o, lse = flashattn.attention(q, k, v, return_lse=True)
    dq, dk, dv = flashattn.attention_backward(q[::-1], k, v, o[::-1], lse, np.ones_like(o)[::-1])
    dq0, dk0, dv0 = flashattn.attention_backward(q, k, v, o, lse, np.ones_like(o))
    for a, b in ((dq, dq0), (dk, dk0), (dv, dv0)):
        assert np.array_equal(a, b)


def test_masked_arrays_are_refused(rng):
    q = randn(rng, (1, 2, 8, 16))
    k = np.ma.masked_array(q, mask=np.zeros(q.shape, bool))
    with pytest.raises(ValueError, match="k is a numpy masked array"):
        flashattn.attention(q, k, q)
    with pytest.raises(ValueError, match="bias is a numpy masked array"):
        flashattn.attention(q, q, q, bias=np.ma.masked_array(np.zeros((1, 1, 8, 8), np.float32)))
    with pytest.raises(ValueError, match="mask is a numpy masked array"):
        flashattn.attention(q, q, q, mask=np.ma.masked_array(np.ones((8, 8), bool)))
    cache = randn(rng, (1, 16, 2, 16))
    with pytest.raises(ValueError, match="cache_seqlens is a numpy masked array"):
        flashattn.kvcache_attention(randn(rng, (1, 1, 2, 16)), cache, cache,
                                    cache_seqlens=np.ma.masked_array([8], mask=[True]))


def test_messages_name_what_was_passed(rng):
    q = randn(rng, (1, 2, 8, 16))
    with pytest.raises(ValueError, match=r"sinks must have shape \[H\] = \[2\], got \(\)"):
        flashattn.attention(q, q, q, sinks=0.5)
    with pytest.raises(ValueError, match="out must have non-negative strides"):
        flashattn.attention(q, q, q, out=np.empty((1, 2, 8, 16), np.float32)[::-1])
    o, lse = randn(rng, (3, 2, 16)).astype(np.float64), randn(rng, (3, 2))
    with pytest.raises(ValueError, match=r"e\.g\. o_a\.astype"):
        flashattn.merge_states(o, lse, o, lse)
    with pytest.raises(ValueError, match=r"lse_a must have shape \(3, 2\).*got \(\)"):
        flashattn.merge_states(o.astype(np.float32), 0.0, o.astype(np.float32), lse)

"""An independent float64 reference for the tests (docs/semantics.md), in plain numpy: the
whole score matrix, no tiling, nothing shared with the library's kernels.

Arrays are [B, H, S, D] (the tests transpose other layouts first)."""
import numpy as np


def visible(Sq, Sk, causal=False, window=(-1, -1), q_seg=None, kv_seg=None, batch=1, diag_offset=None):
    """[B, Sq, Sk] bool: key j visible to query i (masks aligned bottom-right, or at
    diag_offset: query i sits at key position i + diag_offset)."""
    off = Sk - Sq if diag_offset is None else diag_offset
    i = np.arange(Sq)[:, None] + off
    j = np.arange(Sk)[None, :]
    m = np.ones((Sq, Sk), bool)
    if causal:
        m &= j <= i
    left, right = window
    if left >= 0:
        m &= j >= i - left
    if right >= 0:
        m &= j <= i + right
    m = np.broadcast_to(m, (batch, Sq, Sk))
    if q_seg is not None:
        m = m & (np.asarray(q_seg)[:, :, None] == np.asarray(kv_seg)[:, None, :])
    return m


def _expand_heads(k, Hq):
    return np.repeat(k, Hq // k.shape[1], axis=1)


def scores(q, k, *, scale=None, softcap=0.0, bias=None, alibi_slopes=None, bias_scale=None,
           diag_offset=None):
    """(s, s_before_cap / cap or None): the scores, f64, [B, Hq, Sq, Sk], before masking."""
    q = np.asarray(q, np.float64)
    k = _expand_heads(np.asarray(k, np.float64), q.shape[1])
    D = q.shape[-1]
    scale = 1.0 / np.sqrt(D) if scale is None else float(scale)
    s = scale * np.einsum("bhid,bhjd->bhij", q, k)
    t = None
    if softcap:
        t = np.tanh(s / softcap)
        s = softcap * t
    if bias is not None:
        b = np.asarray(bias, np.float64)
        s = s + (1.0 if bias_scale is None else float(bias_scale)) * b.reshape((1,) * (4 - b.ndim) + b.shape)
    if alibi_slopes is not None:
        Sq, Sk = s.shape[-2:]
        off = Sk - Sq if diag_offset is None else diag_offset
        dist = np.abs(np.arange(Sq)[:, None] + off - np.arange(Sk)[None, :])
        s = s - np.asarray(alibi_slopes, np.float64)[None, :, None, None] * dist
    return s, t, scale


def softmax_rows(s, vis):
    """(lse, p) of scores s over the last axis, keys where vis is False left out (f64). A
    row with no visible key (or no keys at all): lse = -inf, p = 0."""
    s = np.where(vis, s, -np.inf)
    m = s.max(-1, keepdims=True) if s.shape[-1] else np.zeros(s.shape[:-1] + (1,))
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(vis, np.exp(s - m), 0.0)
    total = e.sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(total > 0, np.log(total) + m, -np.inf)[..., 0]
        p = np.where(total > 0, e / total, 0.0)
    return lse, p


def forward(q, k, v, *, causal=False, window=(-1, -1), softcap=0.0, scale=None, bias=None,
            alibi_slopes=None, q_segment_ids=None, kv_segment_ids=None, bias_scale=None,
            diag_offset=None):
    """(o, lse, p) in f64. A row with no visible key: o = 0, lse = -inf."""
    s, _, _ = scores(q, k, scale=scale, softcap=softcap, bias=bias, alibi_slopes=alibi_slopes,
                     bias_scale=bias_scale, diag_offset=diag_offset)
    B, H, Sq, Sk = s.shape
    window = (-1, -1) if window is None else tuple(-1 if w is None else w for w in window)
    vis = visible(Sq, Sk, causal, window, q_segment_ids, kv_segment_ids, B, diag_offset)[:, None]
    vis = vis & (s != -np.inf)
    lse, p = softmax_rows(s, vis)
    v64 = _expand_heads(np.asarray(v, np.float64), H)
    o = p @ v64
    return o, lse, p


def backward(q, k, v, do, *, o_saved=None, causal=False, window=(-1, -1), softcap=0.0,
             scale=None, bias=None, alibi_slopes=None, q_segment_ids=None, kv_segment_ids=None,
             bias_scale=None, diag_offset=None):
    """(dq, dk, dv, dbias4) of sum(o * do) in f64; dbias4 is [B, Hq, Sq, Sk] (sum it over
    broadcast dims). o_saved: the o whose rows give delta = sum(do * o), as a kernel that
    saved a rounded o computes it (default: the exact o)."""
    kw = dict(causal=causal, window=window, softcap=softcap, scale=scale, bias=bias,
              alibi_slopes=alibi_slopes, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
              bias_scale=bias_scale, diag_offset=diag_offset)
    o, _, p = forward(q, k, v, **kw)
    _, t, sc = scores(q, k, scale=scale, softcap=softcap, bias=bias, alibi_slopes=alibi_slopes,
                      bias_scale=bias_scale, diag_offset=diag_offset)
    Hq, Hk = q.shape[1], k.shape[1]
    do = np.asarray(do, np.float64)
    v64 = _expand_heads(np.asarray(v, np.float64), Hq)
    k64 = _expand_heads(np.asarray(k, np.float64), Hq)
    q64 = np.asarray(q, np.float64)
    o_used = o if o_saved is None else np.asarray(o_saved, np.float64)
    dp = do @ np.swapaxes(v64, -1, -2)
    delta = (do * o_used).sum(-1, keepdims=True)
    ds = p * (dp - delta)            # d/ds of the final score
    dbias = ds * (1.0 if bias_scale is None else float(bias_scale))
    if t is not None:
        ds = ds * (1.0 - t * t)      # through cap * tanh(s / cap)
    dq = sc * ds @ k64
    dk_full = sc * np.swapaxes(ds, -1, -2) @ q64
    dv_full = np.swapaxes(p, -1, -2) @ do
    B, _, Sk, D = dk_full.shape
    dk = dk_full.reshape(B, Hk, Hq // Hk, Sk, D).sum(2)
    dv = dv_full.reshape(B, Hk, Hq // Hk, Sk, dv_full.shape[-1]).sum(2)
    return dq, dk, dv, dbias


U32 = 2.0**-24  # float32's unit roundoff: the library accumulates in float32


def cancel_floor(q, k, v, do, bias_shape=None, **kw):
    """Bounds on the float32 roundoff of dq and dk where they cancel: dS = P*(dP - delta) is 0
    where a row sees one key (P = 1, dP = delta), so a computed dq or dk that should be 0 is
    roundoff of the terms |P*dP| + |P*delta| (dot products of Sk + Dv terms: n unit roundoffs
    of them), times |k| or |q| (dk summed over the query heads that share a key). Float64,
    with forward's masks and options (kw as backward's). Returns (dq floor, dk floor); a
    gradient within BWD_TOL of max|ref| or within its floor is right. With bias_shape, a third:
    dbias's, the terms summed over the bias's broadcast dims (m more additions)."""
    o, _, p = forward(q, k, v, **kw)
    _, _, sc = scores(q, k, scale=kw.get("scale"), softcap=kw.get("softcap", 0.0), bias=kw.get("bias"),
                      alibi_slopes=kw.get("alibi_slopes"), bias_scale=kw.get("bias_scale"),
                      diag_offset=kw.get("diag_offset"))
    Hq, Hk = q.shape[1], k.shape[1]
    do = np.asarray(do, np.float64)
    v64, k64 = (_expand_heads(np.asarray(x, np.float64), Hq) for x in (v, k))
    terms = p * (np.abs(do @ np.swapaxes(v64, -1, -2)) + np.abs((do * o).sum(-1, keepdims=True)))
    n = k.shape[2] + v.shape[-1]
    dq = np.abs(sc) * terms @ np.abs(k64)
    dk = (np.abs(sc) * np.swapaxes(terms, -1, -2) @ np.abs(np.asarray(q, np.float64)))
    dk = dk.reshape(dk.shape[0], Hk, Hq // Hk, *dk.shape[2:]).sum(2)
    out = (n * U32 * dq.max(initial=0.0), n * U32 * dk.max(initial=0.0))
    if bias_shape is not None:
        lead = terms.ndim - len(bias_shape)
        summed = terms.sum(tuple(range(lead)) + tuple(lead + i for i, d in enumerate(bias_shape) if d == 1))
        m = terms.size // max(int(np.prod(bias_shape)), 1)
        out += ((n + m) * U32 * summed.max(initial=0.0),)
    return out

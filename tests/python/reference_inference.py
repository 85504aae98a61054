"""An independent float64 reference for the inference shapes, in plain numpy: every sequence
is its own dense problem (the whole score matrix), with analytic gradients. Nothing here
calls flashattn (the masked softmax is reference.py's, plain numpy too); the tests build
expected values from it alone.

Per-sequence tensors are [S, H, D] (the packed layout's rows of one sequence)."""
import numpy as np

from reference import softmax_rows


def _groups(k, Hq):
    """[S, Hk, D] -> [S, Hq, D]: each kv head serves Hq / Hk consecutive query heads."""
    return np.repeat(k, Hq // k.shape[1], axis=1)


def _visible(Sq, Sk, off, causal, window):
    i = np.arange(Sq)[:, None] + off
    j = np.arange(Sk)[None, :]
    m = np.ones((Sq, Sk), bool)
    if causal:
        m &= j <= i
    left, right = (-1, -1) if window is None else window
    if left >= 0:
        m &= j >= i - left
    if right >= 0:
        m &= j <= i + right
    return m


def sequence(q, k, v, do=None, *, o_saved=None, causal=False, window=None, softcap=0.0, scale=None,
             alibi_slopes=None, diag_offset=None):
    """One sequence: q [Sq, Hq, D], k [Sk, Hk, D], v [Sk, Hk, Dv] (and do [Sq, Hq, Dv]).
    Returns (o [Sq, Hq, Dv], lse [Hq, Sq]) and, with do, (dq, dk, dv) of sum(o * do).
    Masks align at off = Sk - Sq (bottom-right) unless diag_offset; a row with no visible
    key gets o = 0, lse = -inf and no gradient. o_saved: the o that delta = rowsum(do * o)
    is taken from (the library's own, as its backward does), else the reference's."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    Sq, Hq, D = q.shape
    Sk, Hk = k.shape[:2]
    scale = 1.0 / np.sqrt(D) if scale is None else float(scale)
    off = Sk - Sq if diag_offset is None else diag_offset
    kk, vv = _groups(k, Hq), _groups(v, Hq)
    s = scale * np.einsum("ihd,jhd->hij", q, kk)                   # [Hq, Sq, Sk]
    t = None
    if softcap:
        t = np.tanh(s / softcap)
        s = softcap * t
    if alibi_slopes is not None:
        dist = np.abs(np.arange(Sq)[:, None] + off - np.arange(Sk)[None, :])
        s = s - np.asarray(alibi_slopes, np.float64)[:, None, None] * dist
    vis = np.broadcast_to(_visible(Sq, Sk, off, causal, window), s.shape)
    lse, p = softmax_rows(s, vis)
    o = np.einsum("hij,jhd->ihd", p, vv)
    if do is None:
        return o, lse
    do = np.asarray(do, np.float64)
    dvv = np.einsum("hij,ihd->jhd", p, do)
    dp = np.einsum("ihd,jhd->hij", do, vv)
    o_d = o if o_saved is None else np.asarray(o_saved, np.float64)
    delta = np.einsum("ihd,ihd->hi", do, o_d)[..., None]
    ds = p * (dp - delta)
    if t is not None:
        ds = ds * (1 - t * t)
    dq = scale * np.einsum("hij,jhd->ihd", ds, kk)
    dkk = scale * np.einsum("hij,ihd->jhd", ds, q)
    g = Hq // Hk
    dk = dkk.reshape(Sk, Hk, g, D).sum(2)
    dv = dvv.reshape(Sk, Hk, g, v.shape[2]).sum(2)
    return (o, lse), (dq, dk, dv)


def varlen(q, k, v, cu_q, cu_k, do=None, o_saved=None, **kw):
    """The packed batch, sequence by sequence: (o [Tq, Hq, Dv], lse [Hq, Tq]) and, with do,
    (dq, dk, dv) in the packed layouts."""
    Tq, Hq = q.shape[:2]
    o = np.zeros((Tq, Hq, v.shape[2]))
    lse = np.full((Hq, Tq), -np.inf)
    grads = [np.zeros(a.shape) for a in (q, k, v)]
    for b in range(len(cu_q) - 1):
        sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        dob = None if do is None else do[sq]
        res = sequence(q[sq], k[sk], v[sk], dob, o_saved=None if o_saved is None else o_saved[sq], **kw)
        (ob, lb), gb = (res, None) if do is None else res
        o[sq], lse[:, sq] = ob, lb
        if do is not None:
            for g, gs, sl in zip(grads, gb, (sq, sk, sk)):
                g[sl] = gs
    return (o, lse) if do is None else ((o, lse), tuple(grads))


def decode(q, k_rows, v_rows, **kw):
    """One decoding step: q [B, Sq, Hq, D]; k_rows[b], v_rows[b] the keys and values sequence
    b attends to, in position order ([Sk_b, Hk, D]). (o [B, Sq, Hq, Dv], lse [B, Hq, Sq])."""
    outs = [sequence(q[b], k_rows[b], v_rows[b], **kw) for b in range(q.shape[0])]
    return np.stack([o for o, _ in outs]), np.stack([lse for _, lse in outs])

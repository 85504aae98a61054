"""The package itself: what importing it loads, the ctypes mirrors' guard, flashattn.plan."""
import ctypes
import subprocess
import sys
import time

import numpy as np
import pytest

import flashattn
from flashattn import _native


def test_import_loads_neither_torch_nor_jax():
    code = ("import sys, flashattn; flashattn.plan(batch=1, heads=1, seq_q=4, head_dim=8); "
            "bad = [m for m in ('torch', 'jax', 'jaxlib') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_stale_mirror_is_an_import_error_naming_the_struct(monkeypatch):
    class OldProblem(ctypes.Structure):  # as if fields had been added to the header
        _fields_ = _native.Problem._fields_[:-2]  # (the last two ints share 8 bytes: one alone hides in padding)
    mirrors = list(_native.MIRRORS)
    mirrors[0] = ("fa_problem", OldProblem)
    monkeypatch.setattr(_native, "MIRRORS", tuple(mirrors))
    with pytest.raises(ImportError, match="fa_problem"):
        _native._check_mirrors(_native.lib)


def test_every_mirror_matches_the_library():
    for which, (name, mirror) in enumerate(_native.MIRRORS):
        assert _native.lib.fa_struct_size(which) == ctypes.sizeof(mirror), name
    assert _native.lib.fa_struct_size(99) == 0
    # the constants the fronts check before the library does, against the public header
    import pathlib
    import re
    header = (pathlib.Path(__file__).resolve().parents[2] / "include" / "flashattn.h").read_text()
    assert int(re.search(r"#define FA_MAX_THREADS (\d+)", header).group(1)) == _native.MAX_THREADS


SEED_PROBLEM = dict(batch=18, heads=32, seq_q=16384, head_dim=256, dtype="bf16")


def test_plan_reports_every_cost_field():
    p = flashattn.plan(**SEED_PROBLEM)
    for d in (p.forward, p.backward):
        assert set(d) == set(_native.COST_FIELDS)
        assert all(isinstance(x, int) and x > 0 for x in d.values())
    B, H, S, D = 18, 32, 16384, 256
    assert p.forward["flops_useful"] == 4 * B * H * S * S * D
    # naive: q, k, v, o in bf16, lse in f32, the f32 score matrix
    assert p.forward["naive_peak_bytes"] == 4 * B * H * S * D * 2 + B * H * S * 4 + B * H * S * S * 4
    assert p.exact is True and p.backend in ("cpu", "cuda")
    assert set(p.blocks) == {"forward", "backward"} and all(len(b) == 2 for b in p.blocks.values())


def test_plan_is_fast_and_fits():
    t0 = time.perf_counter()
    for _ in range(100):
        p = flashattn.plan(causal=True, **SEED_PROBLEM)
    per_plan = (time.perf_counter() - t0) / 100
    assert per_plan < 0.01, f"a plan took {per_plan * 1e3:.2f} ms"
    assert p.fits("24G") and p.fits(24 << 30)
    assert not p.naive_fits("24G")
    assert not p.fits("1G") and p.fits("1T", pass_="both")
    assert p.forward["flops_useful"] * 2 == flashattn.plan(**SEED_PROBLEM).forward["flops_useful"] + \
        2 * (256 + 256) * 18 * 32 * 16384  # causal: the diagonal counts once


def test_plan_options():
    base = dict(batch=2, heads=8, seq_q=100, head_dim=64)
    gqa = flashattn.plan(kv_heads=2, seq_k=300, head_dim_v=32, **base)
    assert gqa.forward["flops_useful"] == 2 * (64 + 32) * 2 * 8 * 100 * 300
    seg = flashattn.plan(segment_ids=True, **base)
    assert seg.exact is False
    with_bias = flashattn.plan(bias_shape=(1, 8, 100, 100), alibi=True, softcap=30.0, window=(16, 0), **base)
    assert with_bias.forward["transcendentals"] > flashattn.plan(window=(16, 0), **base).forward["transcendentals"]
    assert flashattn.plan(backend="cuda", dtype="bf16", **base).backend == "cuda"  # plans need no device
    assert flashattn.plan(backend="cpu", threads=3, **base).threads == 3
    assert flashattn.plan(scale=0.5, **base).scale == 0.5


def test_plan_is_keyword_only():
    with pytest.raises(TypeError):
        flashattn.plan(1, 8, 100, 64)


@pytest.mark.parametrize("kw, message", [
    ({"heads": 6, "kv_heads": 4}, r"heads_q \(6\) is not a multiple of heads_kv \(4\)"),
    ({"seq_q": -1}, "seq_q must be >= 0"),  # 0 is an empty problem (test_empty.py)
    ({"head_dim": 0}, "head_dim must be positive"),
    ({"window": (-2, 3)}, "window"),
    ({"softcap": -1.0}, "softcap"),
    ({"scale": float("nan")}, "scale must be finite"),
    ({"scale": 1e40}, r"scale = 1e\+40 does not fit float32"),  # not "got inf"
    ({"dtype": "f64"}, "dtype"),
    ({"backend": "tpu"}, "backend"),
    ({"bias_shape": (3, 8, 100, 100)}, "bias"),
    ({"bias_shape": (1, 8, 100, 99)}, "bias"),
    ({"batch": 1 << 40, "seq_q": 1 << 30}, "overflow|too large|beyond"),
])
def test_plan_bad_arguments_raise_value_error(kw, message):
    args = dict(batch=2, heads=8, seq_q=100, head_dim=64)
    args.update(kw)
    with pytest.raises(ValueError, match=message):
        flashattn.plan(**args)


def test_bias_scale_and_dbias_are_planned():
    base = dict(batch=2, heads=8, seq_q=100, head_dim=64, bias_shape=(1, 8, 100, 100))
    p = flashattn.plan(bias_scale=0.125, bias_grad=True, **base)
    assert p.backward["bytes_accessed"] > flashattn.plan(**base).backward["bytes_accessed"]
    with pytest.raises(ValueError, match="bias"):
        flashattn.plan(batch=2, heads=8, seq_q=100, head_dim=64, bias_grad=True)


def test_budget_strings():
    p = flashattn.plan(batch=1, heads=1, seq_q=8, head_dim=8)
    with pytest.raises(ValueError, match="budget"):
        p.fits("lots")
    assert p.fits("1.5M") and not p.fits("1.5K")


def test_plan_cache_follows_fa_isa(monkeypatch):
    """FA_ISA is read at every plan (docs/environment.md): a shape planned before the variable
    changed is planned again, not taken from the front's plan cache with the old kernel set.
    Seen through a kernel set no CPU has: the library refuses it at the plan."""
    import numpy as np
    q = np.ones((1, 1, 8, 16), np.float32)
    monkeypatch.setenv("FA_ISA", "scalar")
    flashattn.attention(q, q, q)  # planned (and cached) with the scalar kernels
    monkeypatch.setenv("FA_ISA", "no-such-kernels")
    with pytest.raises(ValueError, match="FA_ISA"):
        flashattn.attention(q, q, q)
    monkeypatch.delenv("FA_ISA")
    flashattn.attention(q, q, q)
    monkeypatch.setenv("FA_BWD_SCHEDULE", "fussed")  # read at every plan too: a typo is refused
    with pytest.raises(ValueError, match="FA_BWD_SCHEDULE must be 'fused' or 'two-pass'"):
        flashattn.attention(q, q, q)


def test_plan_cache_from_many_threads(monkeypatch):
    """Calls from several threads whose shapes overflow the plan cache (fa_plan_create
    releases the GIL, so threads interleave inside cached_plan): no call raises, and each
    gets its own problem's answer. The cache is shrunk to 4 plans and the switch interval
    made tiny so that evictions race within a second; the race once raised KeyError and
    'dictionary changed size during iteration'."""
    import threading
    monkeypatch.setattr(_native, "_PLAN_CACHE_SIZE", 4)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    errors, wrong = [], []

    def worker(t):
        rng = np.random.default_rng(t)
        for i in range(40):
            S = 4 + (t * 40 + i) % 37
            q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((1, 1, 3, 4), (1, 1, S, 4), (1, 1, S, 4)))
            try:
                o = flashattn.attention(q, k, v, threads=1)
            except Exception as e:  # noqa: BLE001 (any is the failure this test looks for)
                errors.append(f"{type(e).__name__}: {e}")
                continue
            p = np.exp(q[0, 0] @ k[0, 0].T / 2.0)
            if not np.allclose(o[0, 0], (p / p.sum(-1, keepdims=True)) @ v[0, 0], atol=1e-5):
                wrong.append((t, i))
    try:
        threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors and not wrong, (errors[:3], wrong[:3])
    assert len(_native._PLAN_CACHE) <= 4


def test_plan_cache_lets_a_deleted_mask_go():
    """Each plan holds its own reference to its library mask, so the plan cache kept every
    mask a call had used after the user let go of it (up to 256 plans: 20 masks of 4096 x
    4096 held 390 MB). A built mask's destructor now drops the cached plans that hold it."""
    import gc
    from flashattn import masks
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 1, 64, 8)).astype(np.float32)
    before = len(_native._PLAN_CACHE)
    for i in range(5):
        m = masks.from_array(rng.random((64, 64)) < 0.5)
        flashattn.attention(q, q, q, mask=m)
        del m
        gc.collect()
    assert len(_native._PLAN_CACHE) == before, "cached plans still hold deleted masks"
    assert not _native._PLANS_OF_MASK


def test_a_mask_deleted_at_interpreter_exit_is_quiet():
    """At exit the interpreter clears this module's globals before the last masks' __del__
    runs: forget_mask then raised TypeError (None as a lock) from each, printed as 'Exception
    ignored in NativeMask.__del__' after a passing run. A fresh interpreter that keeps masks
    alive to the end prints nothing on stderr."""
    code = ("import numpy as np, flashattn\nfrom flashattn import masks\n"
            "q = np.ones((1, 1, 64, 8), np.float32)\n"
            "keep = [masks.chunked(16), masks.from_array(np.tri(64, dtype=bool))]\n"
            "for m in keep: flashattn.attention(q, q, q, mask=m)\n"
            "import flashattn._native as n\nn._keep_until_exit = keep\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stderr == "", r.stderr[-2000:]


def test_plan_cache_follows_the_openmp_thread_count(monkeypatch):
    """A plan with the default thread count takes OpenMP's (omp_get_max_threads, which
    torch.set_num_threads and omp_set_num_threads change); the cache keyed it by
    OMP_NUM_THREADS alone, so a shape planned before such a change kept the old count."""
    omp = _native._omp_max_threads
    if omp is None:
        pytest.skip("no OpenMP runtime reachable through the library")
    setter = _native.lib.omp_set_num_threads
    setter.argtypes = [ctypes.c_int]
    seen, real = [], _native.cached_plan

    def spy(problem, options):
        handle = real(problem, options)
        seen.append(handle.threads)
        return handle

    monkeypatch.setattr(_native, "cached_plan", spy)
    was = omp()
    q = np.random.default_rng(4).standard_normal((1, 2, 32, 8)).astype(np.float32)
    try:
        for n in (2, 1, 3, 1):
            setter(n)
            seen.clear()
            flashattn.attention(q, q, q)  # the same shapes each time: planned once per count
            assert seen == [n], (n, seen)
    finally:
        setter(was)

"""Shared fixtures: the seed (printed in the header; FA_TEST_SEED repeats a run), random
inputs, dtype helpers and the error bounds of the C suite (tests/test_forward.c,
tests/backward_check.h), stated relative to the largest reference value."""
import atexit
import os
import random
import shutil
import tempfile
import zlib

import numpy as np
import pytest

# every output a front allocates is NaN until the library writes it (python/flashattn/_native.py)
os.environ["FLASHATTN_POISON"] = "1"

# torch.compile's caches (inductor's, AOTAutograd's) in a folder of this run's own: they key a
# compiled backward without the custom ops' Python code, so a cache another checkout wrote
# can answer for this one (it did when the ops' seed argument changed type)
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="flashattn-inductor-")
    atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], True)

SEED = int(os.environ.get("FA_TEST_SEED", random.SystemRandom().randrange(1, 2**31)))

try:
    import ml_dtypes
    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # bf16 arrays need ml_dtypes; those cases skip, saying so
    ml_dtypes = None
    BF16 = None

# forward: max|o - ref| / max|ref|
FWD_TOL = {"f32": 1e-5, "f16": 5e-3, "bf16": 2e-2}
# backward: max|g - ref| / max|ref|; 5 unit roundoffs for f16 and bf16
BWD_TOL = {"f32": 5e-5, "f16": 5 * 2.0**-11, "bf16": 5 * 2.0**-8}
LSE_TOL = 1e-5  # |lse - ref| <= LSE_TOL * (1 + |ref|), every dtype


def pytest_report_header(config):
    return f"flashattn test seed: {SEED} (FA_TEST_SEED={SEED} repeats this run)"


def pytest_terminal_summary(terminalreporter):
    """The seed again at the end, where -q (which drops the header) shows it too."""
    terminalreporter.write_line(f"flashattn test seed: {SEED} (FA_TEST_SEED={SEED} repeats this run)")


@pytest.fixture
def rng(request):
    """A generator seeded from the run's seed and the test's name, so one test's draws do
    not depend on which others ran."""
    return np.random.default_rng([SEED, zlib.crc32(request.node.nodeid.encode())])


def np_dtype(name):
    if name == "bf16":
        if BF16 is None:
            pytest.skip("bf16 numpy arrays need ml_dtypes, which is not installed")
        return BF16
    return {"f32": np.float32, "f16": np.float16}[name]


def randn(rng, shape, dtype="f32", scale=1.0):
    """Random values (never zeros), rounded to dtype; returned as that numpy dtype."""
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(np_dtype(dtype))


def rel_err(x, ref):
    x = np.asarray(x, np.float64)
    ref = np.asarray(ref, np.float64)
    assert x.shape == ref.shape, (x.shape, ref.shape)
    assert not np.isnan(x).any(), "NaN in the result"
    if ref.size == 0:  # an empty result (all packed lengths 0) matches an empty reference
        return 0.0
    denom = max(np.abs(ref).max(), 1e-30)
    return np.abs(x - ref).max() / denom


def fwd_tol(dtype, lse_ref):
    """The C suite's bound: f32's grows with the scores' magnitude (|lse| stands for it)."""
    if dtype != "f32":
        return FWD_TOL[dtype]
    finite = lse_ref[np.isfinite(lse_ref)]
    top = np.abs(finite).max() if finite.size else 0.0
    return FWD_TOL["f32"] * max(1.0, top / 8)


def check_lse(lse, ref):
    lse = np.asarray(lse, np.float64)
    assert lse.shape == ref.shape
    inf = np.isinf(ref)
    assert np.array_equal(np.isneginf(lse), inf), "rows with no visible key must give lse = -inf exactly"
    err = np.abs(lse[~inf] - ref[~inf]) / (1 + np.abs(ref[~inf]))
    assert err.size == 0 or err.max() <= LSE_TOL, f"lse error {err.max():.2e} > {LSE_TOL:.0e} (seed {SEED})"


def check(name, x, ref, tol):
    e = rel_err(x, ref)
    assert e <= tol, f"{name}: max|err| / max|ref| = {e:.2e} > {tol:.1e} (seed {SEED})"

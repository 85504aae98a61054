"""flashattn.progress: the progress of the numpy and torch fronts' CPU calls, as the CLI's
--progress reports it (python/flashattn/_progress.py, docs/python.md)."""
import threading

import numpy as np
import pytest

import flashattn

from conftest import randn


def _recorder():
    seen = []
    return seen, (lambda what, done, total: seen.append((what, done, total)))


def _well_formed(reports, what):
    """Strictly increasing done of one total, ending at it, from one call's reports."""
    assert reports and all(w == what for w, _, _ in reports), reports
    totals = {t for _, _, t in reports}
    done = [d for _, d, _ in reports]
    assert len(totals) == 1 and done == sorted(set(done)) and done[-1] == totals.pop() and done[0] > 0, reports


@pytest.mark.parametrize("threads", [1, 2])
def test_forward_and_backward_report_their_work(rng, threads):
    q, k, v = (randn(rng, (1, 4, 600, 32)) for _ in range(3))
    seen, fn = _recorder()
    with flashattn.progress(fn):
        o, lse = flashattn.attention(q, k, v, causal=True, return_lse=True, threads=threads)
    _well_formed(seen, "forward")
    del seen[:]
    with flashattn.progress(fn):
        flashattn.attention_backward(q, k, v, o, lse, randn(rng, o.shape), causal=True, threads=threads)
    _well_formed(seen, "backward")
    del seen[:]
    flashattn.attention(q, k, v, threads=threads)  # outside the block: no reports
    assert seen == []
    # the reports change nothing of the result
    np.testing.assert_array_equal(o, flashattn.attention(q, k, v, causal=True, threads=threads))


def test_decode_and_packed_calls_report(rng):
    kc, vc = (randn(rng, (2, 700, 2, 32)) for _ in range(2))
    q = randn(rng, (2, 1, 4, 32))
    seen, fn = _recorder()
    with flashattn.progress(fn):
        flashattn.kvcache_attention(q, kc, vc, cache_seqlens=np.array([700, 300], np.int32))
    _well_formed(seen, "forward")
    del seen[:]
    qp, kp = randn(rng, (500, 4, 32)), randn(rng, (500, 4, 32))
    with flashattn.progress(fn):
        flashattn.varlen_attention(qp, kp, kp, np.array([0, 200, 500], np.int32), np.array([0, 200, 500], np.int32))
    _well_formed(seen, "forward")


def test_default_prints_every_tenth_on_stderr(rng, capfd):
    q = randn(rng, (1, 8, 1024, 32))
    with flashattn.progress():
        flashattn.attention(q, q, q)
    lines = capfd.readouterr().err.splitlines()
    assert lines and all(line.startswith("flashattn: forward ") for line in lines), lines
    assert lines[-1].split()[2] == "100%" and len(lines) <= 11, lines  # tenths 0 to 10


def test_an_exception_of_the_callback_is_raised_after_the_call(rng):
    q = randn(rng, (1, 4, 600, 32))
    calls = []

    def fail(what, done, total):
        calls.append(done)
        raise KeyError("stop here")
    with pytest.raises(KeyError, match="stop here"), flashattn.progress(fail):
        flashattn.attention(q, q, q, threads=2)
    assert len(calls) == 1  # no reports after the first exception


def test_blocks_nest_and_other_threads_are_not_reported(rng):
    q = randn(rng, (1, 4, 600, 32))
    outer, fo = _recorder()
    inner, fi = _recorder()
    other = threading.Thread(target=lambda: [flashattn.attention(q, q, q) for _ in range(5)])
    with flashattn.progress(fo):
        other.start()
        with flashattn.progress(fi):
            flashattn.attention(q, q, q)
        other.join()
        assert outer == []
        flashattn.attention(q, q, q)
    _well_formed(inner, "forward")
    _well_formed(outer, "forward")


def test_not_callable_is_refused():
    with pytest.raises(TypeError, match="callable"), flashattn.progress(3):
        pass


def test_torch_forward_and_backward_report(rng):
    torch = pytest.importorskip("torch")
    import flashattn.torch as fat
    q, k, v = (torch.from_numpy(randn(rng, (1, 4, 600, 32))).requires_grad_() for _ in range(3))
    seen, fn = _recorder()
    with flashattn.progress(fn):
        fat.attention(q, k, v, causal=True).sum().backward()
    assert [w for w, _, _ in seen][0] == "forward" and seen[-1][0] == "backward", seen
    _well_formed([r for r in seen if r[0] == "forward"], "forward")
    _well_formed([r for r in seen if r[0] == "backward"], "backward")


def test_ctrl_c_during_a_reported_call_is_raised():
    """Python runs a SIGINT handler in the next Python code of the main thread: the progress
    callback, where ctypes printed the KeyboardInterrupt and dropped it (the loop ran on).
    Now it is raised when the call returns."""
    import subprocess
    import sys
    code = ("import os, signal, threading, time, numpy as np, flashattn\n"
            "q = np.ones((1, 8, 1500, 64), np.float32)\n"
            "threading.Thread(target=lambda: (time.sleep(0.3), os.kill(os.getpid(), signal.SIGINT))).start()\n"
            "try:\n"
            "    with flashattn.progress(lambda *a: None):\n"
            "        for _ in range(200): flashattn.attention(q, q, q, threads=2)\n"
            "    print('finished')\n"
            "except KeyboardInterrupt:\n"
            "    print('interrupted', signal.getsignal(signal.SIGINT) is signal.default_int_handler)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.stdout.strip() == "interrupted True" and "Exception ignored" not in r.stderr, (r.stdout, r.stderr[-2000:])


def test_a_callback_that_calls_flashattn_does_not_recurse(rng):
    """On the thread that made the call (OpenMP's first thread) the block is in the callback's
    context: a call the callback made reported again, and so on (RecursionError). Calls made
    by the callback report nothing."""
    q = randn(rng, (1, 4, 600, 32))
    small = randn(rng, (1, 1, 8, 8))
    seen, fn = _recorder()

    def callback(what, done, total):
        fn(what, done, total)
        flashattn.attention(small, small, small)
    with flashattn.progress(callback):
        flashattn.attention(q, q, q, threads=1)
    _well_formed(seen, "forward")


def test_default_printer_of_calls_running_at_once(rng):
    """Calls run at once in copies of the block's context (asyncio.to_thread) each print their
    own tenths with the default printer: it once kept one state for every call, dropping
    lines and now and then raising KeyError('forward') from a call that had finished."""
    import asyncio
    import io
    import sys

    q = randn(rng, (1, 1, 64, 32))
    k, v = randn(rng, (1, 1, 40000, 32)), randn(rng, (1, 1, 40000, 32))
    tenths = []
    with flashattn.progress(lambda w, d, t: tenths.append(d * 10 // t)):
        flashattn.attention(q, k, v, threads=1)
    per_call = len(set(tenths))

    class Lines(io.TextIOBase):
        def __init__(self):
            self.text, self.lock = [], threading.Lock()

        def write(self, s):
            with self.lock:
                self.text.append(s)
            return len(s)

    async def four():
        with flashattn.progress():
            return await asyncio.gather(*[asyncio.to_thread(flashattn.attention, q, k, v, threads=1)
                                          for _ in range(4)], return_exceptions=True)

    out, real = Lines(), sys.stderr
    sys.stderr = out
    try:
        results = [x for _ in range(40) for x in asyncio.run(four())]
    finally:
        sys.stderr = real
    assert not [x for x in results if isinstance(x, BaseException)], "a call raised"
    lines = "".join(out.text).splitlines()
    assert len(lines) == 160 * per_call, f"{len(lines)} progress lines of 160 calls, {per_call} each"
    assert sum(" 100% " in line for line in lines) == 160, "a call's 100% line is missing"

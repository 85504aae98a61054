"""A process forked after the parent ran multi-threaded calls completes its own (the C
library runs a forked child's calls on one thread: src/fork.c; GCC's OpenMP workers do not
survive fork). The child must reproduce the parent's output bit for bit; a hang ends the
child by its alarm and fails the test."""
import os
import signal

import numpy as np
import pytest

import flashattn

from conftest import randn


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")
def test_forked_child_completes_its_calls(rng):
    q, k, v = (randn(rng, (2, 4, 200, 64)) for _ in range(3))
    want = flashattn.attention(q, k, v, causal=True, threads=2)
    pid = os.fork()
    if pid == 0:  # the child: exit code 0 only if its call returns the parent's bits
        code = 1
        try:
            signal.alarm(60)
            got = flashattn.attention(q, k, v, causal=True, threads=2)
            code = 0 if np.array_equal(got, want) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert not os.WIFSIGNALED(status), f"the forked child was killed by signal {os.WTERMSIG(status)} (hung in a call)"
    assert os.WEXITSTATUS(status) == 0, "the forked child's output differs from the parent's"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")
def test_fork_while_other_threads_call(rng):
    """A fork while another thread held the plan cache's (or the masks') lock left it held for
    good in the child, whose only thread then hung at its first call (11 of 30 children in one
    run). The locks are new in the child (os.register_at_fork): every child completes."""
    import threading
    from flashattn import masks
    q, k, v = (randn(rng, (1, 2, 96, 16)) for _ in range(3))
    want = flashattn.attention(q, k, v, causal=True, threads=2)
    want_m = flashattn.attention(q, k, v, mask=masks.chunked(32), threads=2)
    stop = threading.Event()

    def churn(seed):  # many shapes and thread counts: the cache fills and evicts under its lock
        r = np.random.default_rng(seed)
        while not stop.is_set():
            s = int(r.integers(8, 600))
            a = r.standard_normal((1, 1, s, 8)).astype(np.float32)
            flashattn.attention(a, a, a, causal=bool(s % 2), mask=masks.chunked(16) if s % 5 == 0 else None,
                                threads=int(r.integers(1, 5)))
    threads = [threading.Thread(target=churn, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    statuses = []
    try:
        for _ in range(30):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    signal.alarm(10)
                    ok = np.array_equal(flashattn.attention(q, k, v, causal=True, threads=2), want)
                    ok &= np.array_equal(flashattn.attention(q, k, v, mask=masks.chunked(32), threads=2), want_m)
                    code = 0 if ok else 2
                finally:
                    os._exit(code)
            statuses.append(os.waitpid(pid, 0)[1])
    finally:
        stop.set()
        for t in threads:
            t.join()
    hung = sum(os.WIFSIGNALED(s) for s in statuses)
    wrong = sum(os.WIFEXITED(s) and os.WEXITSTATUS(s) != 0 for s in statuses)
    assert hung == 0 and wrong == 0, f"{hung} of 30 children hung, {wrong} gave other bits"

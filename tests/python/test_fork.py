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

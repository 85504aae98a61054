"""flashattn.progress: the progress of long calls, as the CLI's --progress shows it."""
import contextlib
import sys

from . import _native


def _print_every_tenth():
    """The CLI's report (docs/cli.md): a line on stderr when a call passes a tenth. One per
    call (_native.PerCall): calls running at once each keep their own last tenth."""
    last = [None]

    def report(what, done, total):
        tenth = done * 10 // total
        if tenth != last[0]:
            last[0] = tenth
            print(f"flashattn: {what} {done * 100 // total:3d}% ({done}/{total})", file=sys.stderr, flush=True)
    return report


@contextlib.contextmanager
def progress(fn=None):
    """Reports the progress of the CPU calls made inside the block (numpy and torch fronts;
    the calls of one thread, or one asyncio task: a context variable).

        with flashattn.progress():              # a line on stderr at every tenth of a call
            o = flashattn.attention(q, k, v)
        with flashattn.progress(lambda what, done, total: bar.update(...)):
            loss.backward()

    fn(what, done, total) hears of each call ("forward" or "backward") at most once per
    percent, with work items (score tiles, or a decode call's chunks of cached keys) done of
    total, strictly increasing and ending at total; it runs on one of the call's worker
    threads, one report of the call at a time, so keep it short (calls running at once, in
    copies of the context, report at once: a callback they share sees them interleaved). An
    exception it raises stops its reports and is raised when the call returns (the call
    itself runs to its end). JAX calls run inside XLA and report nothing; nor do CUDA calls."""
    if fn is not None and not callable(fn):
        raise TypeError(f"flashattn.progress: fn must be callable (what, done, total), got {type(fn).__name__}")
    token = _native.PROGRESS.set(_native.PerCall(_print_every_tenth) if fn is None else fn)
    try:
        yield
    finally:
        _native.PROGRESS.reset(token)

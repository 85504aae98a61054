"""The C library through ctypes: loading it, mirrors of its public structs, error mapping.

Everything here follows include/flashattn.h exactly. At import the size of every mirror is
compared with what the library reports (fa_struct_size), so a mirror that fell behind the
header fails with ImportError naming the struct instead of passing garbage to C.
"""
import contextvars
import ctypes
import os
import signal
import threading

c_int64 = ctypes.c_int64
c_void_p = ctypes.c_void_p

# fa_dtype, fa_backend, fa_pass, fa_status values; fa_problem.lengths_per_call values
LENGTHS_AT_PLAN, LENGTHS_CACHE, LENGTHS_PACKED = 0, 1, 2
F32, F16, BF16 = 0, 1, 2
INT8, FP8_E4M3 = 3, 4  # kv-cache element types only (docs/caches.md)
BACKEND_AUTO, BACKEND_CPU, BACKEND_CUDA = 0, 1, 2
FORWARD, BACKWARD = 0, 1
MAX_THREADS = 1024  # FA_MAX_THREADS
OK, ERR_INVALID, ERR_NULL, ERR_OVERFLOW = 0, 1, 2, 3
ERR_UNSUPPORTED, ERR_NO_MEMORY = 4, 5

BACKEND_NAMES = {BACKEND_AUTO: "auto", BACKEND_CPU: "cpu", BACKEND_CUDA: "cuda"}


class Strides(ctypes.Structure):
    _fields_ = [("s", c_int64 * 4)]


class Problem(ctypes.Structure):
    _fields_ = [
        ("batch", c_int64), ("heads_q", c_int64), ("heads_kv", c_int64),
        ("seq_q", c_int64), ("seq_k", c_int64), ("head_dim", c_int64), ("head_dim_v", c_int64),
        ("dtype", ctypes.c_int),
        ("q_stride", Strides), ("k_stride", Strides), ("v_stride", Strides), ("o_stride", Strides),
        ("has_scale", ctypes.c_int), ("scale", ctypes.c_float),
        ("causal", ctypes.c_int),
        ("window_left", c_int64), ("window_right", c_int64),
        ("softcap", ctypes.c_float),
        ("has_alibi", ctypes.c_int),
        ("has_bias", ctypes.c_int),
        ("bias_batch", c_int64), ("bias_heads", c_int64),
        ("bias_stride", Strides),
        ("has_segment_ids", ctypes.c_int),
        ("has_diag_offset", ctypes.c_int), ("diag_offset", c_int64),
        ("has_bias_scale", ctypes.c_int), ("bias_scale", ctypes.c_float),
        ("bias_grad", ctypes.c_int),
        # packed variable-length batches, kv-cache decoding, paged caches (README, "Inference shapes")
        ("cu_seqlens_q", c_void_p), ("cu_seqlens_k", c_void_p),
        ("cache_seqlens", c_void_p), ("has_new_kv", ctypes.c_int),
        ("page_size", c_int64), ("num_pages", c_int64), ("max_pages", c_int64),
        ("has_sinks", ctypes.c_int),  # attention sinks (docs/semantics.md)
        ("lengths_per_call", ctypes.c_int),
        ("shared_prefix_len", c_int64),
        # dropout (docs/semantics.md, "Dropout")
        ("dropout_p", ctypes.c_float), ("dropout_seed", ctypes.c_uint64), ("dropout_offset", ctypes.c_uint64),
        ("mask", c_void_p),  # a block-sparse mask (docs/masks.md); the plan keeps a reference
        ("bias_seq_q", c_int64),  # 1: one bias row for every query row; 0 or seq_q: one per row
        # quantized kv caches (docs/caches.md)
        ("has_cache_dtype", ctypes.c_int), ("cache_dtype", ctypes.c_int),
        ("dropout_batch0", c_int64),  # dropout's batch index of item 0 (a part of a batch)
    ]


class Options(ctypes.Structure):
    _fields_ = [("backend", ctypes.c_int), ("threads", ctypes.c_int),
                ("block_q", c_int64), ("block_k", c_int64)]


COST_FIELDS = ("flops", "flops_useful", "transcendentals", "bytes_accessed", "min_bytes",
               "workspace_bytes", "peak_bytes", "naive_peak_bytes")


class Cost(ctypes.Structure):
    _fields_ = [(name, c_int64) for name in COST_FIELDS]


class Counts(ctypes.Structure):
    _fields_ = [("flops", c_int64), ("transcendentals", c_int64)]


PROGRESS_FN = ctypes.CFUNCTYPE(None, c_void_p, c_int64, c_int64)


class ForwardArgs(ctypes.Structure):
    _fields_ = [
        ("q", c_void_p), ("k", c_void_p), ("v", c_void_p), ("o", c_void_p),
        ("lse", c_void_p), ("bias", c_void_p), ("alibi_slopes", c_void_p),
        ("q_segment_ids", c_void_p), ("kv_segment_ids", c_void_p),
        ("workspace", c_void_p), ("workspace_size", ctypes.c_size_t),
        ("stream", c_void_p),
        ("counts", ctypes.POINTER(Counts)),
        ("progress", PROGRESS_FN), ("progress_ctx", c_void_p),
        ("k_new", c_void_p), ("v_new", c_void_p), ("block_table", c_void_p),
        ("sinks", c_void_p),
        # the lengths of this call (plans with lengths_per_call)
        ("cache_seqlens", c_void_p), ("cu_seqlens_q", c_void_p), ("cu_seqlens_k", c_void_p),
        ("k_prefix", c_void_p), ("v_prefix", c_void_p),  # a shared prefix (shared_prefix_len)
        ("k_scale", c_void_p), ("v_scale", c_void_p),
    ]


class BackwardArgs(ctypes.Structure):
    _fields_ = [
        ("q", c_void_p), ("k", c_void_p), ("v", c_void_p), ("o", c_void_p), ("d_o", c_void_p),
        ("lse", c_void_p),
        ("dq", c_void_p), ("dk", c_void_p), ("dv", c_void_p),
        ("dbias", c_void_p),
        ("bias", c_void_p), ("alibi_slopes", c_void_p),
        ("q_segment_ids", c_void_p), ("kv_segment_ids", c_void_p),
        ("workspace", c_void_p), ("workspace_size", ctypes.c_size_t),
        ("stream", c_void_p),
        ("counts", ctypes.POINTER(Counts)),
        ("progress", PROGRESS_FN), ("progress_ctx", c_void_p),
        ("sinks", c_void_p), ("dsink", c_void_p),
    ]


# fa_struct_id order in the header
MIRRORS = (("fa_problem", Problem), ("fa_options", Options), ("fa_cost", Cost),
           ("fa_counts", Counts), ("fa_forward_args", ForwardArgs),
           ("fa_backward_args", BackwardArgs))

LIB_NAME = "libflashattn.so"
# FLASHATTN_POISON=1 (the test suite sets it): the fronts fill every output they allocate
# with NaN before the library writes it, so an element the library leaves unwritten shows.
POISON = os.environ.get("FLASHATTN_POISON") == "1"


def _library_path():
    """$FLASHATTN_LIBDIR (a CMake build directory, for development) wins over the copy
    installed inside the package."""
    libdir = os.environ.get("FLASHATTN_LIBDIR")
    if libdir:
        path = os.path.join(libdir, LIB_NAME)
        if not os.path.exists(path):
            raise ImportError(f"FLASHATTN_LIBDIR={libdir!r} has no {LIB_NAME}")
        return path
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), LIB_NAME)
    if not os.path.exists(path):
        raise ImportError(f"{LIB_NAME} is not installed beside {__file__}; install the package "
                          "with `pip install .` or point FLASHATTN_LIBDIR at a CMake build directory")
    return path


def _mismatch(path, why):
    """The ImportError for a library at path that is not the one this package was written
    for (another version of flashattn, or another library): names it and where it came from."""
    libdir = os.environ.get("FLASHATTN_LIBDIR")
    if libdir:
        where = (f" (from FLASHATTN_LIBDIR={libdir!r})", "point FLASHATTN_LIBDIR at a build of this "
                 "version of flashattn, or unset it to use the package's own copy")
    else:
        where = ("", "reinstall the package")
    return ImportError(f"flashattn: the library {path}{where[0]} does not match this package: {why}; {where[1]}")


def _declare(lib):
    P = ctypes.POINTER
    sig = {
        "fa_problem_init": (None, [P(Problem)]),
        "fa_plan_create": (ctypes.c_int, [P(Problem), P(Options), P(c_void_p)]),
        "fa_plan_destroy": (None, [c_void_p]),
        "fa_plan_cost": (ctypes.c_int, [c_void_p, ctypes.c_int, P(Cost)]),
        "fa_plan_cost_lengths": (ctypes.c_int, [c_void_p, ctypes.c_int, c_void_p, c_void_p, c_void_p, P(Cost)]),
        "fa_merge_states": (ctypes.c_int, [ctypes.c_int, c_int64, c_int64, c_int64, c_void_p, P(ctypes.c_float),
                                            c_void_p, P(ctypes.c_float), P(ctypes.c_float), c_void_p,
                                            P(ctypes.c_float)]),
        "fa_plan_exact": (ctypes.c_int, [c_void_p]),
        "fa_plan_backend": (ctypes.c_int, [c_void_p]),
        "fa_plan_blocks": (None, [c_void_p, ctypes.c_int, P(c_int64), P(c_int64)]),
        "fa_plan_threads": (ctypes.c_int, [c_void_p]),
        "fa_plan_problem": (P(Problem), [c_void_p]),
        "fa_plan_scale": (ctypes.c_float, [c_void_p]),
        "fa_forward": (ctypes.c_int, [c_void_p, P(ForwardArgs)]),
        "fa_backward": (ctypes.c_int, [c_void_p, P(BackwardArgs)]),
        "fa_status_string": (ctypes.c_char_p, [ctypes.c_int]),
        "fa_last_error": (ctypes.c_char_p, []),
        "fa_cuda_available": (ctypes.c_int, []),
        "fa_cpu_isa": (ctypes.c_char_p, []),
        "fa_struct_size": (ctypes.c_size_t, [ctypes.c_int]),
        "fa_dropout_keep_rate": (ctypes.c_double, [ctypes.c_float]),
        "fa_dropout_keep_mask": (ctypes.c_int, [ctypes.c_float, ctypes.c_uint64, ctypes.c_uint64, c_int64, c_int64,
                                                c_int64, c_int64, c_int64, c_int64, c_void_p]),
        "fa_quantize_rows": (ctypes.c_int, [ctypes.c_int, ctypes.c_int, c_void_p, c_int64, c_int64, c_void_p,
                                            c_void_p]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name, None)
        if fn is None:
            raise _mismatch(lib._name, f"it has no {name} (an older flashattn?)")
        fn.restype = res
        fn.argtypes = args


def _check_mirrors(lib):
    for which, (name, mirror) in enumerate(MIRRORS):
        want = lib.fa_struct_size(which)
        have = ctypes.sizeof(mirror)
        if want != have:
            raise _mismatch(lib._name, f"its {name} is {want} bytes, this package's ({have} bytes, "
                                       "python/flashattn/_native.py) follows another include/flashattn.h")


def _load(path):
    """The library at path, its functions declared, checked to be the one this package mirrors."""
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:  # not a shared library, or one for another machine
        raise _mismatch(path, f"it does not load ({e})") from None
    if not hasattr(lib, "fa_struct_size"):
        raise _mismatch(path, "it has no fa_struct_size (not flashattn's library, or one too old)")
    _declare(lib)
    _check_mirrors(lib)
    return lib


LIB_PATH = _library_path()
lib = _load(LIB_PATH)


def last_error():
    return (lib.fa_last_error() or b"").decode("utf-8", "replace")


class OutOfMemory(RuntimeError, MemoryError):
    """FA_ERR_NO_MEMORY: a RuntimeError like every other failure, and a MemoryError."""


def check(status, what="flashattn"):
    """Raises the Python exception for a non-OK status, with the library's message."""
    if status == OK:
        return
    msg = last_error() or lib.fa_status_string(status).decode()
    if status in (ERR_INVALID, ERR_NULL, ERR_OVERFLOW):
        raise ValueError(f"{what}: {msg}")
    if status == ERR_NO_MEMORY:
        raise OutOfMemory(f"{what}: {msg}")
    if status == ERR_UNSUPPORTED:
        raise NotImplementedError(f"{what}: {msg}")
    raise RuntimeError(f"{what}: {msg} ({lib.fa_status_string(status).decode()})")


def new_problem():
    p = Problem()
    lib.fa_problem_init(ctypes.byref(p))
    return p


class PlanHandle:
    """Owns one fa_plan*; destroyed with the object."""

    __slots__ = ("ptr", "__weakref__")

    def __init__(self, problem, options=None):
        out = c_void_p()
        opt = ctypes.byref(options) if options is not None else None
        check(lib.fa_plan_create(ctypes.byref(problem), opt, ctypes.byref(out)), "plan")
        self.ptr = out

    def __del__(self, _destroy=lib.fa_plan_destroy):
        ptr = getattr(self, "ptr", None)
        if ptr:
            _destroy(ptr)
            self.ptr = None

    def cost(self, which):
        c = Cost()
        check(lib.fa_plan_cost(self.ptr, which, ctypes.byref(c)), "plan")
        return {name: getattr(c, name) for name in COST_FIELDS}

    def cost_lengths(self, which, cache_seqlens=None, cu_seqlens_q=None, cu_seqlens_k=None):
        """fa_plan_cost_lengths: the exact cost of one call with these lengths (int32 arrays)."""
        c = Cost()
        ptr = lambda a: None if a is None else a.ctypes.data  # noqa: E731
        check(lib.fa_plan_cost_lengths(self.ptr, which, ptr(cache_seqlens), ptr(cu_seqlens_q), ptr(cu_seqlens_k),
                                       ctypes.byref(c)), "plan")
        return {name: getattr(c, name) for name in COST_FIELDS}

    def blocks(self, which):
        bq, bk = c_int64(), c_int64()
        lib.fa_plan_blocks(self.ptr, which, ctypes.byref(bq), ctypes.byref(bk))
        return (bq.value, bk.value)

    @property
    def backend(self):
        return BACKEND_NAMES[lib.fa_plan_backend(self.ptr)]

    @property
    def exact(self):
        return bool(lib.fa_plan_exact(self.ptr))

    @property
    def threads(self):
        return lib.fa_plan_threads(self.ptr)

    @property
    def scale(self):
        return lib.fa_plan_scale(self.ptr)

    @property
    def problem(self):
        """A copy of the validated problem (strides and scale resolved)."""
        p = Problem()
        ctypes.memmove(ctypes.byref(p), lib.fa_plan_problem(self.ptr), ctypes.sizeof(p))
        return p

    def forward(self, args):
        _run_reporting(lambda: lib.fa_forward(self.ptr, ctypes.byref(args)), args, "forward")

    def backward(self, args):
        _run_reporting(lambda: lib.fa_backward(self.ptr, ctypes.byref(args)), args, "backward")


# flashattn.progress: the callback of the calls made inside its block, in this context
PROGRESS = contextvars.ContextVar("flashattn.progress", default=None)


class PerCall:
    """A PROGRESS value that makes each call its own callback (make()): for callbacks that
    keep state about one call, such as the default printer's last tenth, which calls
    running at once in copies of the context (asyncio.to_thread) would otherwise share."""

    __slots__ = ("make",)

    def __init__(self, make):
        self.make = make


def _run_reporting(call, args, what):
    """Runs a forward or backward call, with the progress callback of flashattn.progress where
    one is set: the C library calls it from a worker thread (at most once per percent, one at
    a time); ctypes takes the GIL around it. An exception it raises is kept and raised after
    the call, which cannot be stopped half-way (its outputs are complete). So is Ctrl-C: on
    the main thread Python runs its SIGINT handler inside whatever Python code runs next,
    here the callback, where ctypes would print the KeyboardInterrupt and drop it; for the
    call the handler is one that notes the signal, and the one it replaced runs after."""
    fn = PROGRESS.get()
    if fn is None:
        return check(call(), what)
    if isinstance(fn, PerCall):
        fn = fn.make()
    failed, interrupts = [], []

    def report(_ctx, done, total):
        if not failed:
            token = PROGRESS.set(None)  # a call the callback makes reports nothing (no recursion)
            try:
                fn(what, int(done), int(total))
            except BaseException as e:  # noqa: B036 (KeyboardInterrupt too: raised after the call)
                failed.append(e)
            finally:
                PROGRESS.reset(token)
    args.progress = PROGRESS_FN(report)  # the struct holds the ctypes object for the call
    old = None
    if threading.current_thread() is threading.main_thread() and callable(signal.getsignal(signal.SIGINT)):
        old = signal.signal(signal.SIGINT, lambda signum, frame: interrupts.append((signum, frame)))
    try:
        check(call(), what)
    finally:
        args.progress = PROGRESS_FN()
        if old is not None:
            signal.signal(signal.SIGINT, old)
            for signum, frame in interrupts:
                old(signum, frame)  # Python's default raises KeyboardInterrupt here
    if failed:
        raise failed[0]


def plan_handle(problem, options=None):
    return PlanHandle(problem, options)  # zero sizes too: the library plans empty problems


_LENGTH_ARRAYS = ("cu_seqlens_q", "cu_seqlens_k", "cache_seqlens")


def _plan_key(problem):
    """The problem's bytes, with each length array's contents in place of its address: the
    plan copies the lengths, so two calls with equal lengths share a plan, and a buffer
    reused with other lengths never finds a stale one."""
    ptrs = [getattr(problem, name) for name in _LENGTH_ARRAYS]
    if not any(ptrs):
        return bytes(problem)
    p = Problem.from_buffer_copy(problem)
    extra = []
    for name, ptr in zip(_LENGTH_ARRAYS, ptrs):
        setattr(p, name, None)
        n = problem.batch + (0 if name == "cache_seqlens" else 1)
        extra.append(ctypes.string_at(ptr, 4 * n) if ptr and n > 0 else b"")
    return bytes(p) + b"|".join(extra)


_PLAN_CACHE = {}
_PLAN_CACHE_SIZE = 256
# callers on several threads (fa_plan_create releases the GIL); reentrant, for a mask's
# destructor (forget_mask) that a collection runs on a thread inside the lock
_PLAN_CACHE_LOCK = threading.RLock()
_PLANS_OF_MASK = {}  # a library mask's address -> the cache keys of the plans that hold it (forget_mask)
_MASK_OF_PLAN = {}  # and back: a cache key -> its plan's mask address (_drop)
# OpenMP's default thread count now (what a plan with threads = 0 asks for: omp_get_max_threads,
# which torch.set_num_threads and omp_set_num_threads change, per calling thread), found through
# the library's own OpenMP runtime; None where it cannot be (the key then has the environment only)
_omp_max_threads = getattr(lib, "omp_get_max_threads", None)
if _omp_max_threads is not None:
    _omp_max_threads.restype, _omp_max_threads.argtypes = ctypes.c_int, []


def _new_cache_lock_in_child():
    """A fork while another thread held the lock left it held forever in the child (whose
    only thread then hung at its first call): the child starts with a free one."""
    global _PLAN_CACHE_LOCK
    _PLAN_CACHE_LOCK = threading.RLock()


os.register_at_fork(after_in_child=_new_cache_lock_in_child)


def cached_plan(problem, options):
    """Plans are pure functions of (problem, options) and the environment the library reads
    at every plan (FA_ISA, OMP_NUM_THREADS, FA_BWD_SCHEDULE: docs/environment.md): reuse them
    across calls of the same shapes (a plan costs microseconds, but per-call overhead
    matters for small tensors), and not across a change of those variables. Safe from
    several threads: the cache changes under a lock (a plan is made outside it)."""
    env = "\0".join(os.environ.get(v, "") for v in ("FA_ISA", "OMP_NUM_THREADS", "FA_BWD_SCHEDULE"))
    if not options.threads and _omp_max_threads is not None:
        env += f"\0{_omp_max_threads()}"  # a plan cached before torch.set_num_threads(1) kept its 2
    key = _plan_key(problem) + bytes(options) + env.encode()
    mask = problem.mask or 0
    with _PLAN_CACHE_LOCK:
        handle = _PLAN_CACHE.get(key)
    if handle is None:
        handle = plan_handle(problem, options)
        with _PLAN_CACHE_LOCK:
            while len(_PLAN_CACHE) >= _PLAN_CACHE_SIZE:
                _drop(next(iter(_PLAN_CACHE)))
            handle = _PLAN_CACHE.setdefault(key, handle)  # another thread's, if it got here first
            if mask:
                _PLANS_OF_MASK.setdefault(mask, set()).add(key)
                _MASK_OF_PLAN[key] = mask
    return handle


def _drop(key):
    """Removes one cache entry (under the lock), and its place in _PLANS_OF_MASK."""
    _PLAN_CACHE.pop(key, None)
    mask = _MASK_OF_PLAN.pop(key, None)
    keys = _PLANS_OF_MASK.get(mask)
    if keys is not None:
        keys.discard(key)
        if not keys:
            del _PLANS_OF_MASK[mask]


def forget_mask(ptr):
    """Drops the cached plans that hold the library mask at ptr, whose owner is being
    destroyed: each plan keeps its own reference to its mask, so a cached plan kept a mask
    the user had let go of (up to the cache's 256 plans: gigabytes of bitmaps at S = 4096).
    At interpreter exit, with this module's globals already cleared, there is nothing to
    drop (it raised TypeError from every mask's __del__ then)."""
    if _PLAN_CACHE_LOCK is None or _PLANS_OF_MASK is None:
        return
    with _PLAN_CACHE_LOCK:
        for key in _PLANS_OF_MASK.pop(ptr, ()):
            _PLAN_CACHE.pop(key, None)
            _MASK_OF_PLAN.pop(key, None)

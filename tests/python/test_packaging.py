"""Packaging: the version, the build requirements and extras against what the code needs, a
library that does not match the package, and the JAX handler's FFI API version."""
import ctypes
import os
import pathlib
import re
import shutil
import subprocess
import sys
import types

import pytest

import flashattn
from flashattn import _native

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYPROJECT = (ROOT / "pyproject.toml").read_text()


def _pyproject_list(key):
    """The strings of a one-line TOML list `key = [...]` in pyproject.toml."""
    m = re.search(rf"^{key} = \[(.*)\]$", PYPROJECT, re.M)
    assert m, key
    return re.findall(r'"([^"]*)"', m.group(1))


def test_version_is_the_one_of_pyproject_and_cmake():
    project = re.search(r'^\[project\]$.*?^version = "([^"]+)"', PYPROJECT, re.M | re.S).group(1)
    cmake = re.search(r"set\(FA_VERSION (\S+)\)", (ROOT / "cmake" / "install.cmake").read_text()).group(1)
    assert flashattn.__version__ == project == cmake


def test_jaxlib_is_a_build_requirement_only_where_it_has_wheels():
    """jaxlib 0.5 on (the first whose FFI headers are C) exists for Python 3.10 on; the
    package itself (numpy front) installs on requires-python's oldest, without it."""
    lowest = tuple(map(int, re.search(r'^requires-python = ">=(\d+)\.(\d+)"', PYPROJECT, re.M).groups()))
    jaxlib = [r for r in _pyproject_list("requires") if r.startswith("jaxlib")]
    assert len(jaxlib) == 1, jaxlib
    m = re.fullmatch(r"jaxlib>=([\d.]+); python_version >= '(\d+)\.(\d+)'", jaxlib[0])
    assert m, jaxlib[0]
    assert tuple(int(x) for x in m.group(1).split(".")) >= (0, 5)
    assert (int(m.group(2)), int(m.group(3))) >= (3, 10) > lowest


def _lower_bound(extra):
    (req,) = _pyproject_list(extra)
    return tuple(int(x) for x in re.fullmatch(r"[a-z]+>=([\d.]+)", req).group(1).split("."))


def test_torch_extra_allows_only_torches_with_what_the_front_calls():
    # torch.compiler.disable(reason=) (flashattn/_torch_decode.py) is torch 2.8's
    assert _lower_bound("torch") >= (2, 8)


def _run(code, **env):
    """code in a fresh interpreter that imports this flashattn (its folder first on the path)."""
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(flashattn.__file__)), **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


IMPORT = """
try:
    import flashattn
    print("imported")
except ImportError as e:
    print("ImportError:", e)
"""


def _libm():
    with open("/proc/self/maps") as f:
        found = re.findall(r"(/\S*/libm\.so\.6)$", f.read(), re.M)
    if not found:
        pytest.skip("no libm.so.6 mapped into this process")
    return found[0]


@pytest.mark.parametrize("what", ["another library", "not a library"])
def test_libdir_with_a_foreign_library_is_an_import_error_naming_it(tmp_path, what):
    lib = tmp_path / _native.LIB_NAME
    if what == "another library":
        shutil.copy(_libm(), lib)
    else:
        lib.write_text("not an ELF file\n")
    r = _run(IMPORT, FLASHATTN_LIBDIR=str(tmp_path))
    out = r.stdout + r.stderr
    assert r.returncode == 0 and out.startswith("ImportError:"), out
    assert str(lib) in out and f"FLASHATTN_LIBDIR={str(tmp_path)!r}" in out, out
    assert "does not match this package" in out, out


class _OlderLibrary:
    """A ctypes library as an older libflashattn.so looks: without one function."""

    _name = "/somewhere/build/libflashattn.so"

    def __getattr__(self, name):
        if name == "fa_plan_cost_lengths":
            raise AttributeError(name)
        return types.SimpleNamespace()


def test_older_library_is_an_import_error_naming_it(monkeypatch):
    monkeypatch.setenv("FLASHATTN_LIBDIR", "/somewhere/build")
    with pytest.raises(ImportError, match="fa_plan_cost_lengths") as e:
        _native._declare(_OlderLibrary())
    assert "/somewhere/build/libflashattn.so (from FLASHATTN_LIBDIR='/somewhere/build')" in str(e.value)
    assert "does not match this package" in str(e.value)


def test_library_of_other_structs_is_an_import_error_naming_it(monkeypatch):
    monkeypatch.delenv("FLASHATTN_LIBDIR", raising=False)

    class OldProblem(ctypes.Structure):  # an fa_problem of an older header
        _fields_ = _native.Problem._fields_[:-2]
    monkeypatch.setattr(_native, "MIRRORS", (("fa_problem", OldProblem),) + _native.MIRRORS[1:])
    with pytest.raises(ImportError, match="fa_problem") as e:
        _native._check_mirrors(_native.lib)
    assert f"the library {_native.lib._name} does not match this package" in str(e.value)
    assert "reinstall the package" in str(e.value)


# ---- flashattn.jax: the JAX versions it runs on, the FFI API version its handlers answer


def _jax_ffi():
    pytest.importorskip("jax")
    try:
        from flashattn.jax import _ffi
    except ImportError as e:  # a build without the handler: nothing of it to check
        pytest.skip(str(e))
    return _ffi


def test_jax_extra_and_import_check_agree():
    assert _lower_bound("jax") == _jax_ffi().MIN_JAX


@pytest.mark.parametrize("old", ["0.4.38", "0.6.2"])
def test_older_jax_is_refused_at_import_naming_the_versions(old):
    """jax 0.4 has no jax.ffi (AttributeError at import); under 0.5 and 0.6 parts of the front fail."""
    need = ".".join(map(str, _jax_ffi().MIN_JAX))
    code = (f"import jax; jax.__version__ = {old!r}\n"
            "try:\n    import flashattn.jax\n    print('imported')\n"
            "except ImportError as e:\n    print('ImportError:', e)\n")
    r = _run(code)
    out = r.stdout + r.stderr
    assert f"ImportError: flashattn.jax needs jax>={need}; this is jax {old}" in out, out


class _Base(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("type", ctypes.c_int), ("next", ctypes.c_void_p)]


class _ApiVersion(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("major_version", ctypes.c_int), ("minor_version", ctypes.c_int)]


class _Metadata(ctypes.Structure):  # as jaxlib 0.8 on have it (state_type_id last)
    _fields_ = [("struct_size", ctypes.c_size_t), ("api_version", _ApiVersion), ("traits", ctypes.c_uint32),
                ("state_type_id", ctypes.c_int64)]


class _MetadataExtension(ctypes.Structure):
    _fields_ = [("extension_base", _Base), ("metadata", ctypes.POINTER(_Metadata))]


class _List(ctypes.Structure):  # XLA_FFI_Args, XLA_FFI_Rets
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p), ("size", ctypes.c_int64),
                ("types", ctypes.c_void_p), ("items", ctypes.c_void_p)]


class _Attrs(ctypes.Structure):
    _fields_ = _List._fields_ + [("attrs", ctypes.c_void_p)]


class _CallFrame(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.POINTER(_Base)),
                ("api", ctypes.c_void_p), ("ctx", ctypes.c_void_p), ("stage", ctypes.c_int),
                ("args", _List), ("rets", _List), ("attrs", _Attrs), ("future", ctypes.c_void_p)]


def test_handlers_answer_the_lowest_ffi_api_version():
    """XLA asks each handler its FFI API version at registration and refuses one it does not
    take, failing its CPU backend with it: jaxlib 0.5 to 0.8 take 0.1 only. The handlers,
    built against whichever jaxlib's headers, answer 0.1 (they answered the headers' own:
    jaxlib 0.10's 0.3 broke every JAX from 0.5 to 0.9)."""
    _ffi = _jax_ffi()
    lib = ctypes.CDLL(_ffi._find_library())
    assert _ffi.handler_ffi_api(lib) == (0, 1)
    for symbol in ["fa_jax_forward_cpu", "fa_jax_backward_cpu"] + [s for _, s in _ffi.INFERENCE_TARGETS]:
        metadata = _Metadata(struct_size=ctypes.sizeof(_Metadata), state_type_id=-1,
                             api_version=_ApiVersion(struct_size=ctypes.sizeof(_ApiVersion)))
        ext = _MetadataExtension(_Base(ctypes.sizeof(_MetadataExtension), 1, None), ctypes.pointer(metadata))
        frame = _CallFrame(struct_size=ctypes.sizeof(_CallFrame),
                           extension_start=ctypes.cast(ctypes.pointer(ext), ctypes.POINTER(_Base)))
        handler = getattr(lib, symbol)
        handler.restype, handler.argtypes = ctypes.c_void_p, [ctypes.POINTER(_CallFrame)]
        assert handler(ctypes.byref(frame)) is None, symbol  # no error
        version = (metadata.api_version.major_version, metadata.api_version.minor_version)
        assert version == (0, 1) and metadata.traits == 0 and metadata.state_type_id == 0, (symbol, version)


def test_refused_registration_is_an_import_error_naming_the_versions(monkeypatch):
    _ffi = _jax_ffi()
    import jax
    monkeypatch.setattr(_ffi, "_registered", False)
    monkeypatch.setattr(_ffi, "handler_ffi_api", lambda lib: (0, 1))  # as this package's handlers say
    monkeypatch.setattr(_ffi, "framework_ffi_api", lambda: (1, 0))
    with pytest.raises(ImportError, match=r"does not support this jaxlib: jax .*XLA FFI API 1\.0.*speak XLA FFI API 0\.1"):
        _ffi.register()

    def refuse(*args, **kwargs):
        raise RuntimeError("INVALID_ARGUMENT: the handler's API version (0.1) is incompatible")
    monkeypatch.setattr(_ffi, "framework_ffi_api", lambda: (0, 9))
    monkeypatch.setattr(jax.ffi, "register_ffi_target", refuse)
    with pytest.raises(ImportError, match=r"XLA refused its handlers: jax .*XLA FFI API 0\.9.*incompatible"):
        _ffi.register()

"""import flashattn.jax without libflashattn_jax.so beside the core library: the ImportError
names the path and, where FLASHATTN_LIBDIR was its source, FLASHATTN_LIBDIR and the build
option (docs/python.md, "Installing"); it once blamed the package's build (jaxlib missing
from the build environment) in both cases."""
import os
import subprocess
import sys

import pytest

import flashattn
from flashattn import _native

pytest.importorskip("jax")

CODE = """
try:
    import flashattn.jax
    print("imported")
except ImportError as e:
    print("ImportError:", e)
"""


def _ffi():
    try:
        from flashattn.jax import _ffi
    except ImportError as e:  # a build without the handler: nothing to compare with
        pytest.skip(str(e))
    return _ffi


def test_a_libdir_without_the_handler_names_libdir_and_the_build_option(tmp_path):
    os.symlink(_native.LIB_PATH, tmp_path / _native.LIB_NAME)  # the core library, and no handler
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(flashattn.__file__)),
           "FLASHATTN_LIBDIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=120)
    out = r.stdout + r.stderr
    assert out.startswith("ImportError:"), out
    assert f"{tmp_path / 'libflashattn_jax.so'} does not exist (from FLASHATTN_LIBDIR={str(tmp_path)!r})" in out, out
    assert "-DFA_JAX_FFI=ON" in out and "built without jaxlib" not in out, out


def test_a_package_without_the_handler_says_it_was_built_without_it(tmp_path, monkeypatch):
    ffi = _ffi()
    monkeypatch.delenv("FLASHATTN_LIBDIR", raising=False)
    monkeypatch.setattr(_native, "LIB_PATH", str(tmp_path / _native.LIB_NAME))
    with pytest.raises(ImportError) as e:
        ffi._find_library()
    assert f"{tmp_path / 'libflashattn_jax.so'} does not exist: the package was built without jaxlib" in str(e.value)
    assert "FLASHATTN_LIBDIR=" not in str(e.value)

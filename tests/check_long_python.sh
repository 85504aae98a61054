#!/usr/bin/env bash
# The Python drop-ins against their frameworks on 600 random cases each, forward and
# gradients (make check-long, after the C sweep): flashattn.torch.scaled_dot_product_attention
# against torch's SDPA, flashattn.jax.dot_product_attention against jax.nn's. They test the
# package installed in the test environment (make test installs it), or a dev build with
# FLASHATTN_LIBDIR and PYTHONPATH set. FA_TEST_SEED replays a printed seed.
set -u
PY="${FA_VENV:-$HOME/.cache/flashattn/venv}/bin/python"
[ -x "$PY" ] || { echo "check-long: no test environment at $PY (make test-deps makes it)"; exit 2; }
cd "$(dirname "$0")/python"
rc=0
FA_SDPA_CASES=${FA_SDPA_CASES:-600} "$PY" -m pytest -q -p no:cacheprovider test_sdpa.py || rc=1
FA_JAX_NN_CASES=${FA_JAX_NN_CASES:-600} "$PY" -m pytest -q -p no:cacheprovider test_jax_nn.py || rc=1
exit $rc

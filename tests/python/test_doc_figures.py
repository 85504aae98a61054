"""The cost figures printed in README.md (examples/seed_jax.py's sample output) and
docs/semantics.md, parsed from those files and compared with flashattn.plan of the shapes
they state, so that a change to the tile schedule or the cost model cannot leave them
stale. A failure names the file, the figure and what the plan now says: rerun
examples/seed_jax.py --seed-only and paste its lines, or edit the figure."""
import os
import re

import pytest

import flashattn

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
THREADS = 2  # the documents' figures are from a 2-core machine (peak memory has a slice per thread)


def _read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def _num(text):
    return int(text.replace(",", ""))


def _gib(n):
    """examples/seed_jax.py's human() for sizes in GiB."""
    return f"{n / 2**30:.1f} GiB"


def _readme_seed():
    text = _read("README.md")
    m = re.search(r"== seed problem: q, k, v \[B=(\d+), S=(\d+), H=(\d+), D=(\d+)\] (\w+), causal=(\w+)", text)
    assert m, "README.md: the seed's sample output (examples/seed_jax.py) is gone or reworded"
    B, S, H, D = (int(x) for x in m.groups()[:4])
    return text, dict(B=B, S=S, H=H, D=D, dtype=m.group(5), causal=m.group(6) == "True")


def _plan(B, S, H, D, dtype, causal=False):
    dt = {"bf16": "bf16", "f16": "f16", "f32": "f32"}[dtype]
    return flashattn.plan(batch=B, heads=H, seq_q=S, head_dim=D, dtype=dt, causal=causal, backend="cpu",
                          threads=THREADS)


def test_example_states_the_readme_shapes():
    _, seed = _readme_seed()
    m = re.search(r"B, S, H, D = (\d+), (\d+), (\d+), (\d+)", _read("examples/seed_jax.py"))
    assert m, "examples/seed_jax.py no longer sets B, S, H, D in one line"
    assert tuple(int(x) for x in m.groups()) == (seed["B"], seed["S"], seed["H"], seed["D"])


def test_readme_seed_figures():
    text, seed = _readme_seed()
    p = _plan(**seed)
    f, b = p.forward, p.backward
    m = re.search(r"cost_estimate \(.*?(\w+) plan, (\w+) kernels\): flops=([\d,]+) transcendentals=([\d,]+) "
                  r"bytes_accessed=([\d,]+)", text)
    assert m, "README.md: the cost_estimate line is gone or reworded"
    assert m.group(1) == "cpu"
    got = dict(flops=_num(m.group(3)), transcendentals=_num(m.group(4)), bytes_accessed=_num(m.group(5)))
    # the transcendentals follow the kernel set's tiles (the rescale's exps, one per row and key
    # block), so they are exact on the kernels the line names and within 1% on the others
    exact = ["flops", "bytes_accessed"] + (["transcendentals"] if flashattn.cpu_isa() == m.group(2) else [])
    assert {n: got[n] for n in exact} == {n: f[n] for n in exact}, f"README.md cost_estimate line: plan says " \
        f"{', '.join(f'{n}={f[n]:,}' for n in got)} on the {flashattn.cpu_isa()} kernels"
    assert abs(got["transcendentals"] - f["transcendentals"]) <= 0.01 * f["transcendentals"]
    m = re.search(r"useful flops ([\d,]+) forward, ([\d,]+) backward; peak memory ([\d.]+ GiB) forward, "
                  r"([\d.]+ GiB) backward; the naive reference ([\d.]+ GiB)", text)
    assert m, "README.md: the useful-flops line is gone or reworded"
    want = (f"{f['flops_useful']:,}", f"{b['flops_useful']:,}", _gib(f["peak_bytes"]), _gib(b["peak_bytes"]),
            _gib(f["naive_peak_bytes"]))
    assert m.groups() == want, f"README.md useful-flops line: the plan gives {want}"


def test_semantics_seed_figures():
    text = _read("docs/semantics.md")
    m = re.search(r"batch (\d+), (\d+) heads, (\d+) tokens, head dim (\d+), (\w+)", text)
    assert m, "docs/semantics.md: the seed problem's statement is gone or reworded"
    B, H, S, D = (int(x) for x in m.groups()[:4])
    p = _plan(B, S, H, D, m.group(5))
    scores = re.search(r"B x H x S x S x 4 B = [\d x]+=\s+([\d,]+) B", text)
    assert scores and _num(scores.group(1)) == B * H * S * S * 4
    naive = re.search(r"`naive_peak_bytes` \(([\d,]+) B", text)
    assert naive and _num(naive.group(1)) == p.forward["naive_peak_bytes"], \
        f"docs/semantics.md naive_peak_bytes: the plan gives {p.forward['naive_peak_bytes']:,}"
    peak = re.search(r"`peak_bytes` of ([\d,]+) B \(([\d.]+) GiB with (\d+) CPU threads on the (\w+) kernels\)", text)
    assert peak, "docs/semantics.md: the peak_bytes figure is gone or reworded"
    assert int(peak.group(3)) == THREADS
    # the workspace follows the ISA's tiles (a forward item's run of q tiles: isa.h,
    # fwd_run_bytes), so the bytes are exact on the kernels the figure names; the GiB
    # figure holds on every ISA (they differ by a few MB)
    if flashattn.cpu_isa() == peak.group(4):
        assert _num(peak.group(1)) == p.forward["peak_bytes"], \
            f"docs/semantics.md peak_bytes: the plan gives {p.forward['peak_bytes']:,}"
    assert peak.group(2) == f"{p.forward['peak_bytes'] / 2**30:.2f}"
    q_bytes = re.search(r"each [\d x]+ bf16 values =\s+([\d,]+) B", text)
    assert q_bytes and _num(q_bytes.group(1)) == B * H * S * D * 2


@pytest.mark.parametrize("path", ["README.md", "docs/semantics.md"])
def test_figures_parse_as_numbers(path):
    """Guard against a figure edited into something the checks above would not read."""
    assert re.search(r"\d{1,3}(,\d{3}){3,}", _read(path))

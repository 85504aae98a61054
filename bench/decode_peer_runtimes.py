"""The inference runtimes' decode steps for bench/decode_peers.py: OpenVINO's fused SDPA in
the stateful pattern, ggml's flash_attn_ext (ggml-python), ONNX Runtime's
GroupQueryAttention. Each is one worker process (decode_data.serve):

    bench-venv/bin/python bench/decode_peer_runtimes.py IMPL [--cache-len N] [--threads T]

IMPL: openvino-bf16, openvino-u8, ggml-f16, ggml-q8_0, ort-f32, ort-f16.
What each peer holds and how its bytes are counted is in its class.
"""
import ctypes
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_data import TOLERANCE, Problem, huge_copy, huge_empty, huge_page_bytes, log, serve  # noqa: E402


class OpenVINO:
    """A one-layer stateful model in the pattern OpenVINO's CPU plugin fuses
    (StatefulSDPAFusion): ReadValue(past) -> Gather(beam_idx) -> Concat(new k/v, axis 2) ->
    Assign, and Concat -> Unsqueeze -> Broadcast -> Reshape (the GQA broadcast) ->
    ScaledDotProductAttention. The plugin then holds the cache itself, in the precision of
    the KV_CACHE_PRECISION hint (and KEY_/VALUE_CACHE_PRECISION): bf16, or u8 with a scale
    and a zero point (f32 each) per token and kv head (KEY_/VALUE_CACHE_GROUP_SIZE 0: one
    group per head). The past (S - 1 rows) goes in through the state (set_state); each step
    appends the new token's row, so reset() sets the past again before a round's steps.
    Its allocations are the plugin's: madvise is not ours to call; the worker runs with
    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (malloc's mmapped chunks madvised to huge pages),
    and the huge page bytes it reports say what that gave."""

    def __init__(self, p, threads, precision):
        import openvino as ov
        import openvino.opset13 as op
        import openvino.opset3 as op3
        import openvino.opset6 as op6
        from openvino.op.util import Variable, VariableInfo

        self.problem, self.ov = p, ov
        Hq, Hk, D, G = p.Hq, p.Hk, p.D, p.G
        q = op.parameter([1, Hq, 1, D], np.float32, name="q")
        kn = op.parameter([1, Hk, 1, D], np.float32, name="k_new")
        vn = op.parameter([1, Hk, 1, D], np.float32, name="v_new")
        beam = op.parameter([-1], np.int32, name="beam_idx")
        sinks, present = [], []
        for name, new in (("past_k", kn), ("past_v", vn)):
            info = VariableInfo()
            info.data_shape, info.data_type, info.variable_id = ov.PartialShape([-1, Hk, -1, D]), ov.Type.f32, name
            var = Variable(info)
            # the initial value (an empty past), as exported LLMs have it
            empty = op.broadcast(op.constant(np.float32(0)), op.constant(np.array([1, Hk, 0, D], np.int64)))
            past = op6.read_value(empty, var)
            cat = op.concat([op.gather(past, beam, 0), new], 2)
            sinks.append(op6.assign(cat, var))
            b = op3.broadcast(op.unsqueeze(cat, 2), op.constant(np.array([1, 1, G, 1, 1], np.int64)),
                              broadcast_spec="BIDIRECTIONAL")
            present.append(op.reshape(b, op.constant(np.array([0, Hq, -1, D], np.int64)), True))
        sdpa = op.scaled_dot_product_attention(q, present[0], present[1], causal=False)
        model = ov.Model([op.result(sdpa)], sinks, [q, kn, vn, beam], "decode")
        prec = ov.Type.bf16 if precision == "bf16" else ov.Type.u8
        cfg = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "INFERENCE_PRECISION_HINT": ov.Type.bf16,
               "KV_CACHE_PRECISION": prec, "KEY_CACHE_PRECISION": prec, "VALUE_CACHE_PRECISION": prec,
               "KEY_CACHE_GROUP_SIZE": 0, "VALUE_CACHE_GROUP_SIZE": 0}
        cm = ov.Core().compile_model(model, "CPU", cfg)
        ops = cm.get_runtime_model().get_ops()
        fused = sorted({o.get_rt_info()["layerType"].astype(str) for o in ops})
        # fused: the plugin's SDPA node has the present k and v as its outputs 1 and 2 (the
        # Concat, Gather and broadcast are gone into it)
        if "Concat" in fused or not any(o.get_rt_info()["layerType"].astype(str) == "ScaledDotProductAttention"
                                        and o.get_output_size() == 3 for o in ops):
            raise RuntimeError(f"the SDPA was not fused with its cache (runtime ops {fused})")
        self.req = cm.create_infer_request()
        S = p.S
        self.inputs = [huge_copy(p.q.reshape(1, Hq, 1, D)),
                       huge_copy(p.k[S - 1].reshape(1, Hk, 1, D)), huge_copy(p.v[S - 1].reshape(1, Hk, 1, D)),
                       np.zeros(1, np.int32)]
        for i, a in enumerate(self.inputs):
            self.req.set_input_tensor(i, ov.Tensor(a, shared_memory=True))
        # the past in the state's user layout [1, Hk, S - 1, D], f32: the plugin converts
        self.past = [np.ascontiguousarray(x[:S - 1].transpose(1, 0, 2)[None]) for x in (p.k, p.v)]
        before = huge_page_bytes()
        self.reset()
        self.req.infer()  # the plugin's cache exists from here on
        self.plugin_huge = huge_page_bytes() - before
        self.reset()  # that step appended a row: back to S - 1 for the check's step
        elem, scales = (2, 0) if precision == "bf16" else (1, 8)
        self.bytes = p.kv_bytes(elem, scales)
        self.tol = TOLERANCE["16bit" if precision == "bf16" else "int8"]
        self.info = dict(version=ov.__version__, runtime_ops=[t for t in fused if t not in ("Parameter", "Result")],
                         cache="plugin-held, " + prec.get_type_name(), cache_huge_page_bytes=self.plugin_huge)

    def reset(self):
        states = {s.name: s for s in self.req.query_state()}
        for name, x in zip(("past_k", "past_v"), self.past):
            states[name].state = self.ov.Tensor(x)

    def step(self):
        self.req.infer()

    def output(self):
        return self.req.get_output_tensor(0).data.reshape(self.problem.Hq, self.problem.D)


class GGML:
    """ggml_flash_attn_ext on ggml's CPU backend through ggml-python: q f32 [D, 1, Hq],
    k and v [D, S, Hk] in f16 or q8_0 (blocks of 32 elements with one f16 scale: 34 bytes per
    32, so 8 bytes of scales per row of 128), no mask. The context's memory is ours (one
    buffer on 2 MiB pages), so the caches are too."""

    def __init__(self, p, threads, kind):
        import ggml

        self.problem, self.g, self.threads = p, ggml, threads
        Hq, Hk, D, S = p.Hq, p.Hk, p.D, p.S
        qtype = ggml.GGML_TYPE_F16 if kind == "f16" else ggml.GGML_TYPE_Q8_0
        row = ggml.ggml_row_size(qtype, D)
        size = 2 * S * Hk * row + 4 * Hq * D * 2 + (64 << 20)  # caches, q, o, graph and work
        self.mem = huge_empty((size,), np.uint8)
        params = ggml.ggml_init_params(mem_size=size, mem_buffer=ctypes.c_void_p(self.mem.ctypes.data), no_alloc=False)
        self.ctx = ggml.ggml_init(params)
        q = ggml.ggml_new_tensor_3d(self.ctx, ggml.GGML_TYPE_F32, D, 1, Hq)
        k = ggml.ggml_new_tensor_3d(self.ctx, qtype, D, S, Hk)
        v = ggml.ggml_new_tensor_3d(self.ctx, qtype, D, S, Hk)
        q32 = np.ascontiguousarray(p.q, np.float32)
        ctypes.memmove(ggml.ggml_get_data(q), q32.ctypes.data, q32.nbytes)
        for t, x in ((k, p.k), (v, p.v)):
            src = np.ascontiguousarray(x.transpose(1, 0, 2), np.float32)  # [Hk, S, D]
            if kind == "f16":
                half = src.astype(np.float16)  # held: memmove reads it after .ctypes.data is taken
                ctypes.memmove(ggml.ggml_get_data(t), half.ctypes.data, half.nbytes)
            else:
                ggml.ggml_quantize_chunk(qtype, ctypes.cast(src.ctypes.data, ctypes.POINTER(ctypes.c_float)),
                                         ggml.ggml_get_data(t), 0, S * Hk, D, None)
        self.out = ggml.ggml_flash_attn_ext(self.ctx, q, k, v, None, float(p.scale), 0.0, 0.0)
        ggml.ggml_flash_attn_ext_set_prec(self.out, ggml.GGML_PREC_F32)
        self.graph = ggml.ggml_new_graph(self.ctx)
        ggml.ggml_build_forward_expand(self.graph, self.out)
        self.bytes = p.kv_bytes(2, 0) if kind == "f16" else 2 * S * Hk * row
        self.tol = TOLERANCE["16bit" if kind == "f16" else "int8"]
        self.info = dict(version=getattr(ggml, "__version__", "?"), cache=kind, row_bytes=int(row))

    def step(self):
        self.g.ggml_graph_compute_with_ctx(self.ctx, self.graph, self.threads)

    def output(self):
        p = self.problem
        o = np.ctypeslib.as_array(ctypes.cast(self.g.ggml_get_data(self.out), ctypes.POINTER(ctypes.c_float)),
                                  shape=(p.Hq * p.D,))
        return o.reshape(p.Hq, p.D).copy()  # res [D, Hq, 1]: head-major rows of D


class ORT:
    """com.microsoft GroupQueryAttention on ONNX Runtime's CPU provider, f32 or f16: query
    [1, 1, Hq D], the new token's key and value [1, 1, Hk D], past_key/past_value
    [1, Hk, S, D] (BNSH) bound with I/O binding to our buffers (2 MiB pages) and bound again as
    present_key/present_value (the op's shared past-present buffer: it writes the new row at
    seqlens_k = S - 1 in place, the cache's last row, which holds the same values), so no
    copy of the cache per step."""

    def __init__(self, p, threads, kind):
        import onnxruntime as ort
        from onnx import TensorProto, helper

        self.problem = p
        Hq, Hk, D, S = p.Hq, p.Hk, p.D, p.S
        dt, tp = (np.float32, TensorProto.FLOAT) if kind == "f32" else (np.float16, TensorProto.FLOAT16)
        node = helper.make_node("GroupQueryAttention",
                                ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_seq"],
                                ["output", "present_key", "present_value"], domain="com.microsoft",
                                num_heads=Hq, kv_num_heads=Hk, scale=float(p.scale))
        vi = helper.make_tensor_value_info
        cache_shape = [1, Hk, S, D]
        graph = helper.make_graph([node], "decode",
                                  [vi("query", tp, [1, 1, Hq * D]), vi("key", tp, [1, 1, Hk * D]),
                                   vi("value", tp, [1, 1, Hk * D]), vi("past_key", tp, cache_shape),
                                   vi("past_value", tp, cache_shape), vi("seqlens_k", TensorProto.INT32, [1]),
                                   vi("total_seq", TensorProto.INT32, [1])],
                                  [vi("output", tp, [1, 1, Hq * D]), vi("present_key", tp, cache_shape),
                                   vi("present_value", tp, cache_shape)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("com.microsoft", 1)])
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        self.kc = huge_copy(p.k.transpose(1, 0, 2)[None], dt)
        self.vc = huge_copy(p.v.transpose(1, 0, 2)[None], dt)
        self.arrays = dict(query=p.q.reshape(1, 1, Hq * D).astype(dt), key=p.k[S - 1].reshape(1, 1, Hk * D).astype(dt),
                           value=p.v[S - 1].reshape(1, 1, Hk * D).astype(dt),
                           seqlens_k=np.array([S - 1], np.int32), total_seq=np.array([S], np.int32))
        self.o = np.zeros((1, 1, Hq * D), dt)
        io = self.sess.io_binding()
        for name, a in self.arrays.items():
            io.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(a))
        for name, a in (("past_key", self.kc), ("past_value", self.vc)):
            io.bind_input(name, "cpu", 0, dt, list(a.shape), a.ctypes.data)
        for name, a in (("output", self.o), ("present_key", self.kc), ("present_value", self.vc)):
            io.bind_output(name, "cpu", 0, dt, list(a.shape), a.ctypes.data)
        self.io = io
        self.bytes = p.kv_bytes(np.dtype(dt).itemsize)
        self.tol = TOLERANCE["16bit"]
        self.info = dict(version=ort.__version__, cache=kind)

    def step(self):
        self.sess.run_with_iobinding(self.io)

    def output(self):
        return self.o.reshape(self.problem.Hq, self.problem.D)


def make(a):
    p = Problem(a.cache_len)
    kind, _, variant = a.impl.partition("-")
    try:
        if kind == "openvino":
            return OpenVINO(p, a.threads, variant)
        if kind == "ggml":
            return GGML(p, a.threads, variant)
        if kind == "ort":
            return ORT(p, a.threads, variant)
    except ImportError as e:
        return f"not installed ({e}); run bench/setup.sh"
    return f"unknown peer {a.impl}"


if __name__ == "__main__":
    log(f"decode peer {sys.argv[1:]}")
    serve(make)

#!/usr/bin/env python3
"""What a model computes comes from the model, and what kiln cannot compute
or should not trust is refused by name: GGUF files written by the `gguf`
package (Gemma's GELU FFN and its post-FFN norm, Qwen2's q/k/v biases, an
architecture kiln does not model, NaN and infinity in norm weights, GGML
block scales and rms_norm_eps) and safetensors checkpoints (an NVFP4 global
scale of NaN, a Gemma config.json whose norm weights are stored as w - 1).
"""
import ctypes
import json
import os
import sys
import tempfile
import unittest

try:
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as T
    from safetensors.numpy import save_file
except ImportError as e:  # the oracle is required, never skipped
    sys.exit(f"test_model_checks: {e}; install tests/oracle/requirements.txt")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kilnlib  # noqa: E402
from kilnlib import KILN_OK  # noqa: E402

lib = kilnlib.load()
VP = ctypes.c_void_p
D, F = 64, 128
OP_SILU, OP_GELU, OP_RMS_NORM, OP_LINEAR, OP_PARAM = 6, 7, 8, 3, 2
KILN_ERR_MALFORMED, KILN_ERR_UNSUPPORTED = 4, 5
rng = np.random.default_rng(7)


def gguf_file(path, arch, extra=(), eps=1e-5, norm=None, q8_scale=None):
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(1)
    w.add_embedding_length(D)
    w.add_feed_forward_length(F)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(eps)
    n = np.ones(D, np.float32) if norm is None else norm
    w.add_tensor("blk.0.ffn_norm.weight", n)
    for name, shape in (("ffn_gate", (F, D)), ("ffn_up", (F, D)), ("ffn_down", (D, F))):
        a = rng.standard_normal(shape).astype(np.float32)
        if name == "ffn_up" and q8_scale is not None:
            q = gguf.quants.quantize(a, T.Q8_0)
            d = np.array([q8_scale], np.float16).view(np.uint8)
            q.view(np.uint8).reshape(-1, 34)[5, 0:2] = d
            w.add_tensor(f"blk.0.{name}.weight", q, raw_dtype=T.Q8_0)
        else:
            w.add_tensor(f"blk.0.{name}.weight", a)
    for name, arr, *raw_dtype in extra:
        w.add_tensor(name, arr, raw_dtype=raw_dtype[0] if raw_dtype else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


class ModelChecks(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="kiln-checks-")
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def p(self, name):
        return os.path.join(self.dir, name)

    def open(self, path, allow_nonfinite=0, allow_partial=0):
        h = VP()
        opts = (ctypes.c_int * 2)(allow_nonfinite, allow_partial)
        st = lib.kiln_model_open_with(path.encode(), ctypes.byref(opts), ctypes.byref(h))
        return st, h

    def build(self, path, kind="ffn", **kw):
        """(status, message, ops {name: op}, warnings) of building kind."""
        st, h = self.open(path, **kw)
        if st != KILN_OK:
            return st, kilnlib.last_error(lib), {}, []
        g = VP()
        self.assertEqual(lib.kiln_graph_create(ctypes.byref(g)), KILN_OK)
        build = lib.kiln_model_build_ffn if kind == "ffn" else lib.kiln_model_build_linears
        st = build(h, g, 0)
        msg = kilnlib.last_error(lib) if st != KILN_OK else ""
        ops = {}
        for i in range(lib.kiln_graph_n_tensors(g)):
            t = lib.kiln_graph_tensor(g, i)
            ops[lib.kiln_tensor_name(t).decode()] = (lib.kiln_tensor_op(t), t)
        warns, w = [], lib.kiln_model_warnings(h)
        while w[len(warns)]:
            warns.append(w[len(warns)].decode())
        lib.kiln_graph_destroy(g)
        lib.kiln_model_close(h)
        return st, msg, ops, warns

    def test_gemma_ffn_is_gelu_with_its_post_norm(self):
        post = [("blk.0.post_ffw_norm.weight", np.ones(D, np.float32))]
        gguf_file(self.p("g.gguf"), "gemma2", extra=post)
        st, msg, ops, _ = self.build(self.p("g.gguf"))
        self.assertEqual(st, KILN_OK, msg)
        kinds = [op for op, _ in ops.values()]
        self.assertIn(OP_GELU, kinds)
        self.assertNotIn(OP_SILU, kinds)
        self.assertEqual(ops["blk.0.ffn_post_norm"][0], OP_RMS_NORM)
        gguf_file(self.p("l.gguf"), "llama")
        st, msg, ops, _ = self.build(self.p("l.gguf"))
        self.assertIn(OP_SILU, [op for op, _ in ops.values()])

    def test_gemma2_without_its_post_norm_is_refused(self):
        gguf_file(self.p("g.gguf"), "gemma2")
        st, msg, _, _ = self.build(self.p("g.gguf"))
        self.assertNotEqual(st, KILN_OK)
        self.assertIn("blk.0.post_ffw_norm.weight", msg)

    def test_qwen2_qkv_biases_are_fused(self):
        extra = [("blk.0.attn_q.weight", np.ones((D, D), np.float32)),
                 ("blk.0.attn_q.bias", np.full(D, 0.5, np.float32)),
                 ("blk.0.attn_k.weight", np.ones((D, D), np.float32)),
                 ("blk.0.attn_k.bias", np.full(D, 0.25, np.float32)),
                 ("blk.0.attn_v.weight", np.ones((D, D), np.float32)),
                 ("blk.0.attn_v.bias", np.full(D, 0.125, np.float32)),
                 ("blk.0.attn_output.weight", np.ones((D, D), np.float32)),
                 ("output.weight", np.ones((32, D), np.float32))]
        gguf_file(self.p("q.gguf"), "qwen2", extra=extra)
        st, msg, ops, _ = self.build(self.p("q.gguf"), kind="linears")
        self.assertEqual(st, KILN_OK, msg)
        for r in "qkv":
            op, t = ops[f"blk.0.attn_{r}.weight.out"]
            self.assertEqual(op, OP_LINEAR)
            bias = lib.kiln_tensor_src(t, 2)
            self.assertTrue(bias, f"attn_{r} has no bias")
            self.assertEqual(lib.kiln_tensor_name(bias), f"blk.0.attn_{r}.bias".encode())
        self.assertFalse(lib.kiln_tensor_src(ops["blk.0.attn_output.weight.out"][1], 2))

    def test_an_architecture_kiln_does_not_model(self):
        gguf_file(self.p("m.gguf"), "mamba")
        st, msg, _, _ = self.build(self.p("m.gguf"))
        self.assertEqual(st, KILN_ERR_UNSUPPORTED)
        self.assertIn("architecture mamba: kiln models the FFN of llama", msg)
        st, msg, _, warns = self.build(self.p("m.gguf"), allow_partial=1)
        self.assertEqual(st, KILN_OK, msg)
        self.assertEqual(len(warns), 1)
        self.assertIn("architecture mamba", warns[0])

    def test_nonfinite_values_are_refused_by_name(self):
        norm = np.ones(D, np.float32)
        norm[17] = np.nan
        gguf_file(self.p("n.gguf"), "llama", norm=norm)
        st, h = self.open(self.p("n.gguf"))
        self.assertEqual(st, KILN_ERR_MALFORMED)
        self.assertIn("tensor blk.0.ffn_norm.weight: element 17 is NaN", kilnlib.last_error(lib))
        st, h = self.open(self.p("n.gguf"), allow_nonfinite=1)
        self.assertEqual(st, KILN_OK)
        lib.kiln_model_close(h)

        gguf_file(self.p("e.gguf"), "llama", eps=float("nan"))
        st, _ = self.open(self.p("e.gguf"))
        self.assertEqual(st, KILN_ERR_MALFORMED)
        self.assertIn("rms_norm_eps is nan", kilnlib.last_error(lib))

        gguf_file(self.p("q.gguf"), "llama", q8_scale=np.inf)
        st, _ = self.open(self.p("q.gguf"))
        self.assertEqual(st, KILN_ERR_MALFORMED)
        self.assertIn("tensor blk.0.ffn_up.weight: block scale (d) of block 5 is +inf",
                      kilnlib.last_error(lib))

    def test_nonfinite_ggml_block_scales_are_refused_by_tensor_and_block(self):
        # (type, f16 field offsets: d first, then dmin / m where the type has one)
        fields = [(T.Q5_0, [0]), (T.Q5_1, [0, 2]), (T.Q2_K, [80, 82]), (T.Q3_K, [108]),
                  (T.Q5_K, [0, 2]), (T.IQ4_NL, [0]), (T.IQ4_XS, [0]), (T.Q4_1, [0, 2])]
        bad = [(np.nan, "NaN"), (np.inf, "+inf"), (-np.inf, "-inf")]
        for i, (qtype, offs) in enumerate(fields):
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            for j, off in enumerate(offs):
                value, text = bad[(i + j) % 3]
                with self.subTest(type=qtype.name, offset=off):
                    raw = rng.integers(0, 256, (4 * 512 // block, size), dtype=np.uint8)
                    for o in offs:
                        raw[:, o:o + 2] = np.full((raw.shape[0], 1), 0.01, np.float16).view(np.uint8)
                    raw[3, off:off + 2] = np.array([value], np.float16).view(np.uint8)
                    path = self.p(f"{qtype.name}_{off}.gguf")
                    gguf_file(path, "llama", extra=[("extra.weight", raw.reshape(4, -1), qtype)])
                    st, _ = self.open(path)
                    self.assertEqual(st, KILN_ERR_MALFORMED)
                    what = "block min scale (dmin)" if j else "block scale (d)"
                    self.assertIn(f"tensor extra.weight: {what} of block 3 is {text}",
                                  kilnlib.last_error(lib))
                    st, h = self.open(path, allow_nonfinite=1)
                    self.assertEqual(st, KILN_OK, kilnlib.last_error(lib))
                    lib.kiln_model_close(h)

    def test_nvfp4_global_scale_of_nan(self):
        save_file({"l.weight": np.zeros((2, 8), np.uint8),
                   "l.weight_scale": np.full((2, 1), 0x38, np.uint8),
                   "l.weight_scale_2": np.array(np.nan, np.float32)}, self.p("model.safetensors"))
        with open(self.p("model.safetensors"), "rb") as f:  # weight_scale is F8_E4M3
            blob = f.read()
        n = int.from_bytes(blob[:8], "little")
        header = json.loads(blob[8:8 + n])
        header["l.weight_scale"]["dtype"] = "F8_E4M3"
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        with open(self.p("model.safetensors"), "wb") as f:
            f.write(len(text).to_bytes(8, "little") + text + blob[8 + n:])
        with open(self.p("config.json"), "w") as f:
            json.dump({"quantization_config": {"quant_method": "modelopt",
                                               "quant_algo": "NVFP4"}}, f)
        st, _ = self.open(self.dir)
        self.assertEqual(st, KILN_ERR_MALFORMED)
        self.assertRegex(kilnlib.last_error(lib),
                         r"tensor (l.weight: global scale|l.weight_scale_2: element) 0 is NaN")

    def test_gemma_config_json_norm_weights_are_one_plus_w(self):
        arrays = {"model.layers.0.pre_feedforward_layernorm.weight": np.full(D, 0.5, np.float32),
                  "model.layers.0.post_feedforward_layernorm.weight": np.full(D, -0.25, np.float32),
                  "model.layers.0.post_attention_layernorm.weight": np.full(D, 9, np.float32)}
        for name, shape in (("gate_proj", (F, D)), ("up_proj", (F, D)), ("down_proj", (D, F))):
            a = rng.standard_normal(shape).astype(np.float32)
            arrays[f"model.layers.0.mlp.{name}.weight"] = a
        save_file(arrays, self.p("model.safetensors"))
        with open(self.p("config.json"), "w") as f:
            json.dump({"architectures": ["Gemma2ForCausalLM"], "num_hidden_layers": 1,
                       "hidden_size": D, "intermediate_size": F, "hidden_act": "gelu",
                       "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6}, f)
        st, h = self.open(self.dir)
        self.assertEqual(st, KILN_OK, kilnlib.last_error(lib))
        g = VP()
        lib.kiln_graph_create(ctypes.byref(g))
        self.assertEqual(lib.kiln_model_build_ffn(h, g, 0), KILN_OK, kilnlib.last_error(lib))
        names = {}
        for i in range(lib.kiln_graph_n_tensors(g)):
            t = lib.kiln_graph_tensor(g, i)
            names[lib.kiln_tensor_name(t).decode()] = t
        self.assertNotIn("model.layers.0.post_attention_layernorm.weight", names)
        lib.kiln_graph_destroy(g)
        lib.kiln_model_close(h)

        # silu where the config says so; GELU with erf is no kiln op.
        cfg = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1, "hidden_size": D,
               "intermediate_size": F, "hidden_act": "gelu"}
        with open(self.p("config.json"), "w") as f:
            json.dump(cfg, f)
        st, msg, _, _ = self.build(self.dir)
        self.assertEqual(st, KILN_ERR_UNSUPPORTED)
        self.assertIn("hidden activation gelu", msg)


if __name__ == "__main__":
    result = unittest.main(verbosity=2, exit=False).result
    if result.testsRun == 0:
        sys.exit("no test ran")
    sys.exit(0 if result.wasSuccessful() else 1)

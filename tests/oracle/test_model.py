#!/usr/bin/env python3
"""Model graphs built from files, against a float64 reference.

Small Llama-family models are written the way real ones are: a GGUF file
with gguf-py's GGUFWriter (llama.* keys, blk.N.* names, Q8_0 / Q4_0 weights
quantized by gguf.quants) and a Hugging Face directory (config.json +
model.safetensors with model.layers.N.* names, BF16 and block-FP8 weights).
kiln builds the FFN stack of each, runs it on the CPU executor, and must
match x + down(silu(gate(rms(x))) * up(rms(x))) computed in float64 from the
writer's own dequantized weights. The linears graph must hold every linear of
every layer plus the head; `kiln inspect` must describe both files and write
a tensor's dequantized bytes; unsupported and missing tensors are clear
errors that name the tensor.
"""
import ctypes
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

try:
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as T
except ImportError as e:  # the oracle is required, never skipped
    sys.exit(f"test_model: {e}; install tests/oracle/requirements.txt")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kilnlib  # noqa: E402

# The Python package (python/) on the same library, for what the public API
# covers; kilnlib for the checks that look inside a graph a build refused.
sys.path.insert(0, os.path.join(HERE, os.pardir, os.pardir, "python"))
os.environ.setdefault("KILN_LIBRARY", os.environ.get("KILN_LIB", ""))
import kiln  # noqa: E402

SEED = int(os.environ.get("KILN_TEST_SEED", "0")) or int.from_bytes(os.urandom(4), "little")
print(f"test seed: KILN_TEST_SEED={SEED}", file=sys.stderr)
rng = np.random.default_rng(SEED)
lib = kilnlib.load()
CLI = os.environ.get("KILN_CLI", "kiln")

D, F, LAYERS, EPS = 256, 512, 2, 1e-5


def err():
    return lib.kiln_last_error().decode()


# -------------------------------------------------------------- writers


def gguf_model(path, ffn_types, extra=None):
    """A llama GGUF; ffn_types[l] is the GGML type of layer l's FFN weights.
    Returns {name: float64 array} of the dequantized weights as gguf-py reads them."""
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(LAYERS)
    w.add_embedding_length(D)
    w.add_feed_forward_length(F)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_context_length(128)
    w.add_layer_norm_rms_eps(EPS)
    ref = {}

    def put(name, arr, typ):
        arr = arr.astype(np.float32)
        if typ in (T.F32, T.F16):
            data = arr.astype(np.float16) if typ == T.F16 else arr
            w.add_tensor(name, data)
            ref[name] = data.astype(np.float64)
        else:
            try:
                q = gguf.quants.quantize(arr, typ)
            except NotImplementedError:  # gguf-py has no K-quant or IQ4 quantizer: kiln's
                q = kiln.quantize(arr, typ.name.lower()).data.reshape(arr.shape[0], -1)
            w.add_tensor(name, q, raw_dtype=typ)
            ref[name] = gguf.quants.dequantize(q, typ).astype(np.float64).reshape(arr.shape)

    for l in range(LAYERS):
        put(f"blk.{l}.ffn_norm.weight", 1 + 0.1 * rng.standard_normal(D), T.F32)
        put(f"blk.{l}.attn_norm.weight", 1 + 0.1 * rng.standard_normal(D), T.F32)
        for role, (n, k) in (("attn_q", (D, D)), ("attn_k", (D // 2, D)), ("attn_v", (D // 2, D)),
                             ("attn_output", (D, D)), ("ffn_gate", (F, D)), ("ffn_up", (F, D)),
                             ("ffn_down", (D, F))):
            typ = ffn_types[l] if role.startswith("ffn") else T.Q8_0
            put(f"blk.{l}.{role}.weight", rng.standard_normal((n, k)) / np.sqrt(k), typ)
    put("output.weight", rng.standard_normal((64, D)) / np.sqrt(D), T.Q8_0)
    for name, (raw, typ) in (extra or {}).items():
        w.add_tensor(name, raw, raw_dtype=typ)  # raw: the bytes, shape [N, row bytes]
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return ref


E4M3 = None


def e4m3_table():
    global E4M3
    if E4M3 is None:
        t = np.zeros(256)
        for c in range(256):
            s, e, m = c >> 7, (c >> 3) & 15, c & 7
            v = (m / 8) * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
            t[c] = np.nan if (e == 15 and m == 7) else (-v if s else v)
        E4M3 = t
    return E4M3


def to_e4m3(x):
    """Nearest E4M3 code (ties to even), saturating: via the decode table."""
    t = e4m3_table()
    finite = np.array([c for c in range(256) if not np.isnan(t[c])])
    vals = t[finite]
    idx = np.abs(np.clip(x, -448, 448)[..., None] - vals).argmin(axis=-1)
    return finite[idx].astype(np.uint8)


def safetensors_file(path, tensors):
    """tensors: {name: (dtype string, shape, raw bytes)}, written per the spec."""
    header, off, blobs = {}, 0, []
    for name, (dt, shape, raw) in tensors.items():
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def bf16(x):
    """float64 -> (raw BF16 bytes, the values they hold), round to nearest even."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return u.tobytes(), (u.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def hf_model(d):
    """A HF Llama directory: layer 0 BF16, layer 1 FP8 128x128 blocks."""
    cfg = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": LAYERS, "hidden_size": D,
           "intermediate_size": F, "num_attention_heads": 4, "num_key_value_heads": 2,
           "vocab_size": 64, "max_position_embeddings": 128, "rms_norm_eps": EPS,
           "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    tensors, ref = {}, {}
    for l in range(LAYERS):
        p = f"model.layers.{l}."
        raw, val = bf16(1 + 0.1 * rng.standard_normal(D))
        tensors[p + "post_attention_layernorm.weight"] = ("BF16", (D,), raw)
        ref[p + "post_attention_layernorm.weight"] = val
        for role, (n, k) in (("mlp.gate_proj", (F, D)), ("mlp.up_proj", (F, D)),
                             ("mlp.down_proj", (D, F))):
            x = rng.standard_normal((n, k)) / np.sqrt(k)
            name = p + role + ".weight"
            if l == 0:
                raw, val = bf16(x)
                tensors[name] = ("BF16", (n, k), raw)
                ref[name] = val.reshape(n, k)
            else:
                s = np.abs(x).reshape(n // 128, 128, k // 128, 128).max(axis=(1, 3)) / 448
                s = s.astype(np.float32)
                q = to_e4m3(x / np.repeat(np.repeat(s, 128, 0), 128, 1))
                tensors[name] = ("F8_E4M3", (n, k), q.tobytes())
                tensors[name[:-len("weight")] + "weight_scale_inv"] = ("F32", s.shape, s.tobytes())
                ref[name] = e4m3_table()[q] * np.repeat(np.repeat(s.astype(np.float64), 128, 0), 128, 1)
    safetensors_file(os.path.join(d, "model.safetensors"), tensors)
    return ref


# ------------------------------------------------------------ reference


def ffn_reference(x, ref, names, eps=EPS):
    x = x.astype(np.float64)
    for norm, gate, up, down in names:
        h = x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * ref[norm]
        g = h @ ref[gate].T
        u = h @ ref[up].T
        x = x + (g / (1 + np.exp(-g)) * u) @ ref[down].T
    return x


def run_ffn(path, m):
    with kiln.Model.open(path) as model:
        x = rng.standard_normal((m, D)).astype(np.float32)
        y = kiln.Session(model.graph("ffn"), device="cpu").run(x)
    return x, y


def count_linears(path):
    with kiln.Model.open(path) as model:
        try:
            g = model.graph("linears")
        except kiln.Error as e:
            return e.status, e.message, 0
        return 0, "", sum(t.op == "linear" for t in g.tensors)


def assert_close(tc, got, want):
    # f32 arithmetic over K <= 512 terms: |error| well under 1e-4 of the scale
    scale = np.abs(want).max()
    tc.assertLess(np.abs(got - want).max(), 1e-4 * scale, "kiln differs from the float64 reference")


class Model(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def test_gguf_ffn_stack_matches_float64(self):
        path = os.path.join(self.dir, "llama.gguf")
        ref = gguf_model(path, [T.Q8_0, T.Q4_0])
        names = [(f"blk.{l}.ffn_norm.weight", f"blk.{l}.ffn_gate.weight", f"blk.{l}.ffn_up.weight",
                  f"blk.{l}.ffn_down.weight") for l in range(LAYERS)]
        for m in (1, 5):
            x, y = run_ffn(path, m)
            assert_close(self, y, ffn_reference(x, ref, names))
        print(f"gguf FFN stack (q8_0, q4_0): matches float64 for M = 1, 5")

    def test_gguf_ffn_stacks_of_the_common_download_types_match_float64(self):
        # the FFN types of Q2_K, Q3_K_M, Q5_K_M, IQ4_XS, Q5_0 / Q5_1 / IQ4_NL and Q4_1 files
        mixes = [(T.Q2_K, T.Q3_K), (T.Q3_K, T.Q5_K), (T.Q5_K, T.Q6_K), (T.IQ4_XS, T.Q4_K),
                 (T.Q5_0, T.Q5_1), (T.IQ4_NL, T.Q8_0), (T.Q4_1, T.Q4_1)]
        names = [(f"blk.{l}.ffn_norm.weight", f"blk.{l}.ffn_gate.weight", f"blk.{l}.ffn_up.weight",
                  f"blk.{l}.ffn_down.weight") for l in range(LAYERS)]
        for mix in mixes:
            with self.subTest(types=[t.name for t in mix]):
                path = os.path.join(self.dir, "_".join(t.name for t in mix) + ".gguf")
                ref = gguf_model(path, list(mix))
                for m in (1, 5):
                    x, y = run_ffn(path, m)
                    assert_close(self, y, ffn_reference(x, ref, names))
        print("gguf FFN stacks (" + "; ".join(", ".join(t.name.lower() for t in mix) for mix in mixes)
              + "): match float64 for M = 1, 5")

    def test_hf_ffn_stack_matches_float64(self):
        ref = hf_model(self.dir)
        names = [(f"model.layers.{l}.post_attention_layernorm.weight",
                  f"model.layers.{l}.mlp.gate_proj.weight", f"model.layers.{l}.mlp.up_proj.weight",
                  f"model.layers.{l}.mlp.down_proj.weight") for l in range(LAYERS)]
        for m in (1, 3):
            x, y = run_ffn(self.dir, m)
            assert_close(self, y, ffn_reference(x, ref, names))
        print("safetensors FFN stack (bf16, fp8 128x128): matches float64 for M = 1, 3")

    def test_linears_graph_has_every_linear_and_the_head(self):
        path = os.path.join(self.dir, "llama.gguf")
        gguf_model(path, [T.Q8_0, T.Q8_0])
        st, msg, n = count_linears(path)
        self.assertEqual(st, 0, msg)
        self.assertEqual(n, 7 * LAYERS + 1)

    def test_unsupported_type_is_an_error_only_when_used(self):
        path = os.path.join(self.dir, "q8k.gguf")
        raw = rng.integers(0, 256, size=(4, 292), dtype=np.uint8)  # Q8_K: 292 bytes per 256
        raw[:, 0:4] = np.frombuffer(np.array([0.01], np.float32).tobytes(), np.uint8)
        gguf_model(path, [T.Q8_0, T.Q8_0], extra={"unused.weight": (raw, T.Q8_K)})
        x, y = run_ffn(path, 2)  # unused: the FFN stack builds and runs
        self.assertTrue(np.isfinite(y).all())
        out = subprocess.run([CLI, "inspect", path], capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("Q8_K (unsupported)", out.stdout)
        out = subprocess.run([CLI, "inspect", path, "--tensor", "unused.weight", "--dequant",
                              os.path.join(self.dir, "o.bin")], capture_output=True, text=True)
        self.assertEqual(out.returncode, 1)
        self.assertIn("unused.weight", out.stderr)
        self.assertIn("Q8_K", out.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "o.bin")))

    def test_used_unsupported_or_missing_tensor_names_it(self):
        path = os.path.join(self.dir, "bad.gguf")
        w = gguf.GGUFWriter(path, "llama")
        w.add_block_count(1)
        w.add_embedding_length(D)
        w.add_feed_forward_length(F)
        w.add_tensor("blk.0.ffn_norm.weight", np.ones(D, np.float32))
        raw = np.zeros((F, 292), np.uint8)  # one Q8_K block per row: K = 256 = D
        w.add_tensor("blk.0.ffn_gate.weight", raw, raw_dtype=T.Q8_K)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with kiln.Model.open(path) as model:
            with self.assertRaises(kiln.Error) as cm:
                model.graph("ffn")
            self.assertEqual(cm.exception.status, kiln.Status.ERR_UNSUPPORTED)
            for part in ("blk.0.ffn_gate.weight", "Q8_K", path):
                self.assertIn(part, cm.exception.message)
            with self.assertRaises(kiln.Error) as cm:
                model.graph("linears")
            self.assertEqual(cm.exception.status, kiln.Status.ERR_NOT_FOUND)
            self.assertIn("layer 0 has no blk.0.attn_q.weight "
                          "(nor model.layers.0.self_attn.q_proj.weight)", cm.exception.message)

    def test_a_layer_count_no_file_could_back_is_refused(self):
        path = os.path.join(self.dir, "huge.gguf")
        w = gguf.GGUFWriter(path, "llama")
        w.add_block_count(2**31)  # an int would wrap to a negative count: an empty graph
        w.add_embedding_length(D)
        w.add_tensor("blk.0.ffn_norm.weight", np.ones(D, np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        model, g = ctypes.c_void_p(), ctypes.c_void_p()
        self.assertEqual(lib.kiln_model_open(path.encode(), ctypes.byref(model)), 0, err())
        lib.kiln_graph_create(ctypes.byref(g))
        for build in (lib.kiln_model_build_linears, lib.kiln_model_build_ffn):
            self.assertEqual(build(model, g, 0), kilnlib.KILN_ERR_MALFORMED)
            self.assertIn(f"{path}: the model says it has 2147483648 layers, more than its 1 "
                          "tensors could hold", err())
        self.assertEqual(lib.kiln_graph_n_tensors(g), 0, "nothing was added to the graph")
        lib.kiln_graph_destroy(g)
        lib.kiln_model_close(model)
        out = subprocess.run([CLI, "plan", path], capture_output=True, text=True)
        self.assertEqual(out.returncode, 1, out.stdout)
        self.assertIn("2147483648 layers", out.stderr)

    def test_model_without_a_layer_count_is_an_error_naming_the_file(self):
        path = os.path.join(self.dir, "nolayers.gguf")
        w = gguf.GGUFWriter(path, "llama")  # no llama.block_count
        w.add_embedding_length(D)
        w.add_tensor("blk.0.ffn_norm.weight", np.ones(D, np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        model, g = ctypes.c_void_p(), ctypes.c_void_p()
        self.assertEqual(lib.kiln_model_open(path.encode(), ctypes.byref(model)), 0, err())
        lib.kiln_graph_create(ctypes.byref(g))
        self.assertEqual(lib.kiln_model_build_linears(model, g, 0), kilnlib.KILN_ERR_MALFORMED)
        self.assertIn(f"{path}: the model does not say how many layers it has", err())
        self.assertEqual(lib.kiln_model_build_ffn(model, g, 0), kilnlib.KILN_ERR_MALFORMED)
        self.assertIn(f"{path}: the model does not give its layer count and width", err())
        self.assertEqual(lib.kiln_graph_n_tensors(g), 0, "nothing was added to the graph")
        lib.kiln_graph_destroy(g)
        lib.kiln_model_close(model)

    def test_inspect_and_dequant(self):
        path = os.path.join(self.dir, "llama.gguf")
        ref = gguf_model(path, [T.Q4_0, T.Q8_0])
        out = subprocess.run([CLI, "inspect", path], capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("architecture:  llama", out.stdout)
        self.assertIn("layers 2, width 256, ffn 512", out.stdout)
        self.assertRegex(out.stdout, r"blk\.0\.ffn_up\.weight\s+q4_0\s+\[512, 256\]\s+72\.0 KiB")
        out = subprocess.run([CLI, "inspect", path, "--json"], capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        up = [t for t in json.loads(out.stdout)["tensors"] if t["name"] == "blk.0.ffn_up.weight"]
        self.assertEqual(up, [{"name": "blk.0.ffn_up.weight", "type": "Q4_0", "format": "q4_0",
                               "supported": True, "shape": [512, 256], "bytes": 73728}])
        dst = os.path.join(self.dir, "up.f32")
        out = subprocess.run([CLI, "inspect", path, "--tensor", "blk.0.ffn_up.weight", "--dequant", dst],
                             capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        got = np.fromfile(dst, "<f4").reshape(F, D)
        self.assertTrue(np.array_equal(got, ref["blk.0.ffn_up.weight"].astype(np.float32)))

        ref = hf_model(self.dir)
        out = subprocess.run([CLI, "inspect", self.dir], capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("LlamaForCausalLM", out.stdout)
        self.assertRegex(out.stdout, r"model\.layers\.1\.mlp\.down_proj\.weight\s+fp8_block\s+\[256, 512\]")
        name = "model.layers.1.mlp.gate_proj.weight"
        out = subprocess.run([CLI, "inspect", self.dir, "--tensor", name, "--dequant", dst],
                             capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        got = np.fromfile(dst, "<f4").reshape(F, D)
        self.assertTrue(np.array_equal(got, ref[name].astype(np.float32)))

    def test_inspect_usage_errors(self):
        for args in ([], ["a", "b"], ["x", "--tensor", "t"], ["x", "--bogus"]):
            out = subprocess.run([CLI, "inspect"] + args, capture_output=True, text=True)
            self.assertEqual(out.returncode, 2, args)
            self.assertIn("usage: kiln inspect", out.stderr)
        out = subprocess.run([CLI, "inspect", os.path.join(self.dir, "none.gguf")],
                             capture_output=True, text=True)
        self.assertEqual(out.returncode, 1)
        self.assertIn("none.gguf", out.stderr)


if __name__ == "__main__":
    # unittest before Python 3.12 exits 0 when no test ran (a -k that matches
    # nothing): a run that checked nothing fails.
    result = unittest.main(verbosity=2, exit=False).result
    if result.testsRun == 0:
        sys.exit("no test ran")
    sys.exit(0 if result.wasSuccessful() else 1)

#!/usr/bin/env python3
"""kiln's safetensors reader against the reference writer (PyPI `safetensors`).

Each fixture is a checkpoint in a real convention (FP8 per-tensor and
per-channel, DeepSeek block FP8, ModelOpt NVFP4, gpt-oss MXFP4, BF16),
written by safetensors.numpy.save_file. numpy has no float8 or bfloat16, so
those tensors are saved as uint8 / uint16 and their dtype is then renamed in
the header; the bytes stay where the reference writer put them, which the
test checks. kiln opens the checkpoint, joins each weight with its scales,
and kiln_dequantize must give exactly the values the writer meant, computed
here independently from the element definitions (E4M3, E2M1, UE4M3, E8M0).
"""
import ctypes
import json
import os
import struct
import sys
import tempfile
import unittest

try:
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import save_file
except ImportError as e:  # the oracle is required, never skipped
    sys.exit(f"test_safetensors_reader: {e}; install tests/oracle/requirements.txt")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kilnlib  # noqa: E402
from kilnlib import KILN_ERR_UNSUPPORTED, KILN_OK, ModelInfo, QTensor  # noqa: E402

SEED = int(os.environ.get("KILN_TEST_SEED", "0")) or int.from_bytes(os.urandom(4), "little")
print(f"test seed: KILN_TEST_SEED={SEED}", file=sys.stderr)

# ------------------------------------------------------------- the library

lib = kilnlib.load()
FMT = {"f32": 0, "f16": 1, "bf16": 2, "fp8": 3, "fp8_channel": 4, "fp8_block": 5, "mxfp8": 6,
       "nvfp4": 7, "mxfp4": 8}


class Model(kilnlib.Model):
    def __init__(self, path):
        super().__init__(lib, path, opener="kiln_safetensors_open")

    def weight(self, name):
        qt = QTensor()
        st = lib.kiln_model_weight(self.h, name.encode(), ctypes.byref(qt))
        if st != KILN_OK:
            raise AssertionError(f"{name}: {lib.kiln_last_error().decode()}")
        return qt

    def dequantize(self, name):
        qt = self.weight(name)
        out = np.empty((qt.n, qt.k), dtype=np.float32)
        st = lib.kiln_dequantize(ctypes.byref(qt), out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))
        assert st == KILN_OK, lib.kiln_last_error().decode()
        return qt, out


# ------------------------------------------------- element definitions (OCP)


def e4m3_table():
    """float8_e4m3fn: s.eeee.mmm, bias 7, no infinities, s.1111.111 NaN."""
    t = np.empty(256, dtype=np.float32)
    for c in range(256):
        s, e, m = c >> 7, (c >> 3) & 0xF, c & 7
        if e == 0xF and m == 7:
            v = float("nan")
        elif e == 0:
            v = m / 8 * 2.0 ** -6
        else:
            v = (1 + m / 8) * 2.0 ** (e - 7)
        t[c] = -v if s else v
    return t


E4M3 = e4m3_table()
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)


def e8m0(e):
    return np.ldexp(np.float32(1), e.astype(np.int32) - 127).astype(np.float32)


def bf16_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)


def unpack_fp4(packed):
    """Two E2M1 codes per byte, the even element in the low nibble."""
    out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=np.uint8)
    out[..., 0::2] = packed & 0xF
    out[..., 1::2] = packed >> 4
    return out


# ------------------------------------------------------------- the writer

RENAME = {"F8_E4M3": np.uint8, "BF16": np.uint16, "F8_E8M0": np.uint8}


def save(path, tensors, metadata=None):
    """tensors: name -> (dtype, array). F8_E4M3 / BF16 arrays hold the raw
    codes (uint8 / uint16); the reference writer stores them as U8 / U16 and
    the header is rewritten with the real dtype name."""
    save_file({n: np.array(a, order="C") for n, (_, a) in tensors.items()}, str(path), metadata=metadata)
    with open(path, "rb") as f:
        blob = f.read()
    (hlen,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + hlen])
    data = blob[8 + hlen:]
    for name, (dtype, arr) in tensors.items():
        entry = header[name]
        if dtype in RENAME:
            assert arr.dtype == RENAME[dtype] and entry["dtype"] in ("U8", "U16"), (name, entry)
            entry["dtype"] = dtype
        b, e = entry["data_offsets"]
        assert data[b:e] == arr.tobytes(), f"{name}: bytes moved"
        assert entry["shape"] == list(arr.shape), (name, entry["shape"])
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the reference writer's padding
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
    # What the reference reader can still read (no float8 / bfloat16 in
    # numpy) must read back unchanged.
    with safe_open(str(path), framework="np") as f:
        for name, (dtype, arr) in tensors.items():
            if dtype not in RENAME:
                assert np.array_equal(f.get_tensor(name), arr), name


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)


LLAMA = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
         "intermediate_size": 192, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
         "max_position_embeddings": 2048, "rms_norm_eps": 1e-06, "torch_dtype": "bfloat16"}


class Rng:
    def __init__(self, salt):
        self.r = np.random.default_rng([SEED, salt])

    def e4m3(self, shape):
        """Finite E4M3 codes (0x7F and 0xFF are NaN)."""
        q = self.r.integers(0, 256, size=shape, dtype=np.uint8)
        q[(q & 0x7F) == 0x7F] ^= 1
        return q

    def ue4m3(self, shape):
        """Positive, finite, non-zero block scales."""
        return self.r.integers(1, 0x7F, size=shape, dtype=np.uint8)

    def bytes(self, shape):
        return self.r.integers(0, 256, size=shape, dtype=np.uint8)

    def f32(self, shape, lo, hi):
        return self.r.uniform(lo, hi, size=shape).astype(np.float32)


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


class SafetensorsReader(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="kiln-st-oracle-")
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def p(self, name):
        return os.path.join(self.dir, name)

    def open(self, path=None):
        m = Model(path or self.dir)
        self.addCleanup(m.close)
        return m

    def assert_exact(self, m, name, fmt, expected):
        qt, got = m.dequantize(name)
        self.assertEqual(qt.format, FMT[fmt], name)
        self.assertEqual((qt.n, qt.k), expected.shape, name)
        mismatch = np.flatnonzero(bits(got) != bits(expected))
        self.assertEqual(mismatch.size, 0, f"{name}: {mismatch.size} values differ, first at "
                         f"{mismatch[:1]}: kiln {got.ravel()[mismatch[:1]]} != {expected.ravel()[mismatch[:1]]}")

    def test_fp8_per_tensor(self):
        r = Rng(1)
        n, k = 48, 96
        q, s, a = r.e4m3((n, k)), r.f32((), 1e-3, 1e-1), r.f32((), 1e-2, 1)
        save(self.p("model.safetensors"), {
            "model.layers.0.mlp.up_proj.weight": ("F8_E4M3", q),
            "model.layers.0.mlp.up_proj.weight_scale": ("F32", s),
            "model.layers.0.mlp.up_proj.input_scale": ("F32", a),
        }, metadata={"format": "pt"})
        write_json(self.p("config.json"), dict(LLAMA, quantization_config={
            "quant_method": "fp8", "activation_scheme": "static"}))
        m = self.open()
        self.assert_exact(m, "model.layers.0.mlp.up_proj.weight", "fp8", E4M3[q] * s)
        qt = m.weight("model.layers.0.mlp.up_proj.input_scale")
        self.assertEqual(ctypes.cast(qt.data, ctypes.POINTER(ctypes.c_float))[0], float(a))

        info = ModelInfo()
        lib.kiln_model_get_info(m.h, ctypes.byref(info))
        self.assertEqual(lib.kiln_model_arch(m.h), b"LlamaForCausalLM")
        self.assertEqual(lib.kiln_model_container(m.h), b"safetensors")
        for key, field in (("num_hidden_layers", "n_layers"), ("hidden_size", "d_model"),
                           ("intermediate_size", "d_ffn"), ("num_attention_heads", "n_heads"),
                           ("num_key_value_heads", "n_kv_heads"), ("vocab_size", "vocab"),
                           ("max_position_embeddings", "ctx")):
            self.assertEqual(getattr(info, field), LLAMA[key], key)
        self.assertEqual(info.rms_eps, np.float32(1e-6))

    def test_fp8_per_channel(self):
        r = Rng(2)
        n, k = 40, 64
        q1, q2 = r.e4m3((n, k)), r.e4m3((n, k))
        s1, s2 = r.f32((n,), 1e-3, 1e-1), r.f32((n, 1), 1e-3, 1e-1)
        # compressed-tensors stores [N, 1]; other writers [N].
        save(self.p("model.safetensors"), {
            "a.weight": ("F8_E4M3", q1), "a.weight_scale": ("F32", s1),
            "b.weight": ("F8_E4M3", q2), "b.weight_scale": ("F32", s2),
        })
        m = self.open()
        self.assert_exact(m, "a.weight", "fp8_channel", E4M3[q1] * s1[:, None])
        self.assert_exact(m, "b.weight", "fp8_channel", E4M3[q2] * s2)

    def test_fp8_block_deepseek(self):
        r = Rng(3)
        n, k = 200, 300  # partial tiles on both edges
        q = r.e4m3((n, k))
        s = r.f32((2, 3), 1e-4, 1e-2)
        save(self.p("model.safetensors"), {
            "model.layers.0.self_attn.o_proj.weight": ("F8_E4M3", q),
            "model.layers.0.self_attn.o_proj.weight_scale_inv": ("F32", s),
        })
        write_json(self.p("config.json"), dict(LLAMA, quantization_config={
            "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
            "weight_block_size": [128, 128]}))
        m = self.open()
        tiles = np.repeat(np.repeat(s, 128, axis=0), 128, axis=1)[:n, :k]
        self.assert_exact(m, "model.layers.0.self_attn.o_proj.weight", "fp8_block", E4M3[q] * tiles)

    def check_nvfp4(self, m, name, q, sc, g):
        codes = unpack_fp4(q)
        d = (E4M3[sc] * g).astype(np.float32)
        self.assert_exact(m, name, "nvfp4", E2M1[codes] * np.repeat(d, 16, axis=1))
        self.assertEqual(m.weight(name).global_scale, g)

    def nvfp4_tensors(self, r, prefix, n, k):
        q, sc = r.bytes((n, k // 2)), r.ue4m3((n, k // 16))
        g, a = r.f32((), 1e-4, 1e-2), r.f32((), 1e-2, 1)
        return (q, sc, g), {
            f"{prefix}.weight": ("U8", q), f"{prefix}.weight_scale": ("F8_E4M3", sc),
            f"{prefix}.weight_scale_2": ("F32", g), f"{prefix}.input_scale": ("F32", a),
        }

    def test_modelopt_nvfp4_config_json(self):
        r = Rng(4)
        parts, tensors = self.nvfp4_tensors(r, "model.layers.0.mlp.gate_proj", 32, 128)
        save(self.p("model.safetensors"), tensors)
        write_json(self.p("config.json"), dict(LLAMA, quantization_config={
            "quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
            "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]}))
        m = self.open()
        self.check_nvfp4(m, "model.layers.0.mlp.gate_proj.weight", *parts)
        byname = {t.name.decode(): t for t in m.tensors()}
        w = byname["model.layers.0.mlp.gate_proj.weight"]
        self.assertEqual((w.ne[0], w.ne[1]), (128, 32))
        self.assertEqual(byname["model.layers.0.mlp.gate_proj.weight_scale"].supported, 0)

    def test_modelopt_nvfp4_hf_quant_config(self):
        r = Rng(5)
        parts, tensors = self.nvfp4_tensors(r, "model.layers.1.self_attn.q_proj", 16, 64)
        save(self.p("model.safetensors"), tensors)
        write_json(self.p("config.json"), LLAMA)
        write_json(self.p("hf_quant_config.json"), {
            "producer": {"name": "modelopt", "version": "0.29.0"},
            "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                             "exclude_modules": ["lm_head"]}})
        m = self.open()
        self.check_nvfp4(m, "model.layers.1.self_attn.q_proj.weight", *parts)

    def test_gpt_oss_mxfp4(self):
        r = Rng(6)
        n, groups, experts = 24, 3, 4
        blocks, scales = r.bytes((n, groups, 16)), r.r.integers(100, 150, (n, groups), dtype=np.uint8)
        eb, es = r.bytes((experts, n, groups, 16)), r.bytes((experts, n, groups))
        bias = r.f32((n,), -1, 1)
        save(self.p("model.safetensors"), {
            "model.layers.0.mlp.experts.down_proj_bias": ("F32", bias),
            "model.layers.0.mlp.experts.down_proj_blocks": ("U8", blocks),
            "model.layers.0.mlp.experts.down_proj_scales": ("U8", scales),
            "model.layers.0.mlp.experts.gate_up_proj_blocks": ("U8", eb),
            "model.layers.0.mlp.experts.gate_up_proj_scales": ("U8", es),
        })
        write_json(self.p("config.json"), {"architectures": ["GptOssForCausalLM"], "num_hidden_layers": 1,
                                           "quantization_config": {"quant_method": "mxfp4"}})
        m = self.open()
        # The gpt-oss reference dequantization: lut[low nibble] is element
        # 2i, lut[high nibble] element 2i + 1, times 2^(scale - 127).
        codes = unpack_fp4(blocks).reshape(n, groups * 32)
        x = np.repeat(e8m0(scales), 32, axis=1)
        self.assert_exact(m, "model.layers.0.mlp.experts.down_proj", "mxfp4", E2M1[codes] * x)
        byname = {t.name.decode(): t for t in m.tensors()}
        stacked = byname["model.layers.0.mlp.experts.gate_up_proj"]
        self.assertEqual(stacked.supported, 0)
        self.assertEqual((stacked.n_dims, stacked.ne[0], stacked.ne[1], stacked.ne[2]),
                         (3, groups * 32, n, experts))
        qt = QTensor()
        st = lib.kiln_model_weight(m.h, b"model.layers.0.mlp.experts.gate_up_proj", ctypes.byref(qt))
        self.assertEqual(st, KILN_ERR_UNSUPPORTED)
        self.assertIn(b"expert tensors are 3-D", lib.kiln_last_error())

    def test_fp8_scales_as_checkpoints_ship_them(self):
        """BF16 and F16 per-channel and block scales, E8M0 block scales
        (UE8M0), each read as the F32 value it is."""
        r = Rng(9)
        n, k = 136, 200
        tensors, expect = {}, {}
        for i, dt in enumerate(("BF16", "F16", "F8_E8M0")):
            q = r.e4m3((n, k))
            if dt == "BF16":
                ch = bits(r.f32((n, 1), 1e-3, 1e-1)) >> 16
                blk = bits(r.f32((2, 2), 1e-4, 1e-2)) >> 16
                ch, blk = ch.astype(np.uint16), blk.astype(np.uint16)
                fch, fblk = bf16_to_f32(ch), bf16_to_f32(blk)
            elif dt == "F16":
                ch, blk = r.f32((n, 1), 1e-3, 1e-1).astype(np.float16), r.f32((2, 2), 1e-4, 1e-2).astype(np.float16)
                fch, fblk = ch.astype(np.float32), blk.astype(np.float32)
            else:
                ch, blk = r.r.integers(110, 125, (n, 1), dtype=np.uint8), r.r.integers(110, 125, (2, 2), dtype=np.uint8)
                fch, fblk = e8m0(ch), e8m0(blk)
            tensors[f"c{i}.weight"] = ("F8_E4M3", q)
            tensors[f"c{i}.weight_scale"] = (dt, ch)
            tensors[f"b{i}.weight"] = ("F8_E4M3", q)
            tensors[f"b{i}.weight_scale_inv"] = (dt, blk)
            expect[f"c{i}.weight"] = ("fp8_channel", E4M3[q] * fch)
            expect[f"b{i}.weight"] = ("fp8_block", E4M3[q] * np.repeat(np.repeat(fblk, 128, 0), 128, 1)[:n, :k])
        save(self.p("model.safetensors"), tensors)
        m = self.open()
        for name, (fmt, want) in expect.items():
            self.assert_exact(m, name, fmt, want)

    def test_modelopt_mxfp8(self):
        r = Rng(10)
        n, k = 24, 160
        q, sc = r.e4m3((n, k)), r.r.integers(100, 140, (n, k // 32), dtype=np.uint8)
        save(self.p("model.safetensors"), {
            "model.layers.0.mlp.up_proj.weight": ("F8_E4M3", q),
            "model.layers.0.mlp.up_proj.weight_scale": ("F8_E8M0", sc),
            "model.layers.0.mlp.down_proj.weight": ("F8_E4M3", q),
            "model.layers.0.mlp.down_proj.weight_scale": ("U8", sc),
        })
        write_json(self.p("config.json"), dict(LLAMA, quantization_config={
            "quant_method": "modelopt", "quant_algo": "MXFP8", "exclude_modules": ["lm_head"]}))
        m = self.open()
        want = E4M3[q] * np.repeat(e8m0(sc), 32, axis=1)
        self.assert_exact(m, "model.layers.0.mlp.up_proj.weight", "mxfp8", want)
        self.assert_exact(m, "model.layers.0.mlp.down_proj.weight", "mxfp8", want)

    def test_compressed_tensors_fp8(self):
        """llm-compressor's FP8 checkpoints: the layout its float-quantized
        compressor writes (weight F8_E4M3, weight_scale in the model's dtype,
        [1] per tensor, [N, 1] per channel, [N/128, K/128] per block, input_scale
        for static activations) and the quantization_config its
        QuantizationConfig serialises. The compressed-tensors package itself
        needs torch and transformers, which the oracle does not install."""
        r = Rng(11)
        n, k = 200, 256

        def args(strategy, block=None, dynamic=False, kind="weights"):
            a = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None,
                 "strategy": strategy, "block_structure": block, "dynamic": dynamic,
                 "actorder": None, "observer": "minmax" if kind == "weights" else None,
                 "observer_kwargs": {}}
            return a

        def bf16(a):
            return (bits(a) >> 16).astype(np.uint16)

        qt, qc, qb = r.e4m3((n, k)), r.e4m3((n, k)), r.e4m3((n, k))
        st, sc, sb = bf16(r.f32((1,), 1e-3, 1e-1)), bf16(r.f32((n, 1), 1e-3, 1e-1)), bf16(r.f32((2, 2), 1e-4, 1e-2))
        a = bf16(r.f32((1,), 1e-2, 1))
        head = bf16(r.f32((8, k), -1, 1))
        save(self.p("model.safetensors"), {
            "model.layers.0.self_attn.q_proj.weight": ("F8_E4M3", qt),
            "model.layers.0.self_attn.q_proj.weight_scale": ("BF16", st),
            "model.layers.0.self_attn.q_proj.input_scale": ("BF16", a),
            "model.layers.0.self_attn.o_proj.weight": ("F8_E4M3", qc),
            "model.layers.0.self_attn.o_proj.weight_scale": ("BF16", sc),
            "model.layers.0.mlp.down_proj.weight": ("F8_E4M3", qb),
            "model.layers.0.mlp.down_proj.weight_scale": ("BF16", sb),
            "lm_head.weight": ("BF16", head),
        }, metadata={"format": "pt"})
        write_json(self.p("config.json"), dict(LLAMA, quantization_config={
            "config_groups": {
                "group_0": {"targets": ["re:.*q_proj$"], "weights": args("tensor"),
                            "input_activations": args("tensor", kind="input"),
                            "output_activations": None, "format": "float-quantized"},
                "group_1": {"targets": ["re:.*mlp.*"], "weights": args("block", [128, 128]),
                            "input_activations": dict(args("group", dynamic=True, kind="input"),
                                                      group_size=128),
                            "output_activations": None, "format": "float-quantized"},
                "group_2": {"targets": ["Linear"], "weights": args("channel"),
                            "input_activations": args("token", dynamic=True, kind="input"),
                            "output_activations": None, "format": "float-quantized"},
            },
            "format": "float-quantized", "global_compression_ratio": None, "ignore": ["lm_head"],
            "kv_cache_scheme": None, "quant_method": "compressed-tensors",
            "quantization_status": "compressed", "sparsity_config": {}, "transform_config": {},
            "version": "0.12.2"}))
        m = self.open()
        self.assert_exact(m, "model.layers.0.self_attn.q_proj.weight", "fp8", E4M3[qt] * bf16_to_f32(st))
        self.assert_exact(m, "model.layers.0.self_attn.o_proj.weight", "fp8_channel", E4M3[qc] * bf16_to_f32(sc))
        tiles = np.repeat(np.repeat(bf16_to_f32(sb), 128, axis=0), 128, axis=1)[:n, :k]
        self.assert_exact(m, "model.layers.0.mlp.down_proj.weight", "fp8_block", E4M3[qb] * tiles)
        self.assert_exact(m, "lm_head.weight", "bf16", bf16_to_f32(head))

    def test_bf16_and_plain_types(self):
        r = Rng(7)
        bf = r.bytes((8, 32)).view(np.uint16)
        bf[(bf & 0x7F80) == 0x7F80] &= 0xBFFF  # finite: no all-ones exponent
        h = r.f32((4, 16), -4, 4).astype(np.float16)
        f = r.f32((3, 5), -4, 4)
        save(self.p("model.safetensors"), {
            "model.embed_tokens.weight": ("BF16", bf), "model.norm.weight": ("F16", h), "lm_head.weight": ("F32", f),
        })
        m = self.open()
        self.assert_exact(m, "model.embed_tokens.weight", "bf16", bf16_to_f32(bf))
        self.assert_exact(m, "model.norm.weight", "f16", h.astype(np.float32))
        self.assert_exact(m, "lm_head.weight", "f32", f)

    def test_sharded_weight_and_scale_in_different_shards(self):
        r = Rng(8)
        n, k = 16, 256
        q, s = r.e4m3((n, k)), r.f32((1, 2), 1e-3, 1e-2)
        bf = r.bytes((k, 2)).view(np.uint16).ravel() & 0x3FFF
        shard1, shard2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
        save(self.p(shard1), {"model.layers.0.mlp.down_proj.weight": ("F8_E4M3", q),
                              "model.norm.weight": ("BF16", bf)})
        save(self.p(shard2), {"model.layers.0.mlp.down_proj.weight_scale_inv": ("F32", s)})
        write_json(self.p("model.safetensors.index.json"), {
            "metadata": {"total_size": q.nbytes + bf.nbytes + s.nbytes},
            "weight_map": {"model.layers.0.mlp.down_proj.weight": shard1,
                           "model.layers.0.mlp.down_proj.weight_scale_inv": shard2,
                           "model.norm.weight": shard1}})
        write_json(self.p("config.json"), dict(LLAMA, quantization_config={
            "quant_method": "fp8", "weight_block_size": [128, 128]}))
        m = self.open()
        self.assertEqual(lib.kiln_model_container(m.h), b"safetensors (2 shards)")
        self.assert_exact(m, "model.layers.0.mlp.down_proj.weight", "fp8_block",
                          E4M3[q] * np.repeat(np.repeat(s, 128, axis=0), 128, axis=1)[:n, :k])
        self.assert_exact(m, "model.norm.weight", "bf16", bf16_to_f32(bf)[None, :])
        self.assertEqual(len(m.tensors()), 3)


if __name__ == "__main__":
    # unittest before Python 3.12 exits 0 when no test ran (a -k that matches
    # nothing): a run that checked nothing fails.
    result = unittest.main(verbosity=2, exit=False).result
    if result.testsRun == 0:
        sys.exit("no test ran")
    sys.exit(0 if result.wasSuccessful() else 1)

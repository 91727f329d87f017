#!/usr/bin/env python3
"""Static activation scales (input_scale) against a numpy model of their
meaning.

FP8 checkpoints with static activations carry one input_scale per linear;
the linear then computes y = (x_q · s) · Wᵀ with x_q = e4m3(clamp(x / s,
±448)), the quotient and the product in f32. Each fixture is a one-layer
Llama checkpoint in one convention (quant_method fp8 with
activation_scheme static, ModelOpt's hf_quant_config.json quant_algo FP8,
compressed-tensors with input_activations.dynamic false), its scales in
F32, BF16 and F16, written by the reference writer (PyPI `safetensors`;
numpy has no float8 or bfloat16, so those tensors are saved as uint8 /
uint16 and their dtype renamed in the header). kiln's CPU executor runs
every linear of the model on its own input, and must match the numpy
model: E4M3 rounding here is an independent nearest-even search over the
code table. The compressed-tensors package needs torch, which the oracle
does not install, so its config is written as its QuantizationConfig
serialises.
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
    from safetensors.numpy import save_file
except ImportError as e:  # the oracle is required, never skipped
    sys.exit(f"test_input_scale: {e}; install tests/oracle/requirements.txt")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kilnlib  # noqa: E402
from kilnlib import KILN_ERR_MALFORMED, KILN_OK, VP  # noqa: E402

SEED = int(os.environ.get("KILN_TEST_SEED", "0")) or int.from_bytes(os.urandom(4), "little")
print(f"test seed: KILN_TEST_SEED={SEED}", file=sys.stderr)

lib = kilnlib.load()
for _name, _args, _res in [
    ("kiln_graph_n_inputs", [VP], ctypes.c_int),
    ("kiln_graph_input_at", [VP, ctypes.c_int], VP),
    ("kiln_graph_n_outputs", [VP], ctypes.c_int),
    ("kiln_graph_output_at", [VP, ctypes.c_int], VP),
    ("kiln_tensor_ne", [VP, ctypes.c_int], ctypes.c_int64),
    ("kiln_tensor_input_scale", [VP], ctypes.c_float),
]:
    _f = getattr(lib, _name)
    _f.argtypes, _f.restype = _args, _res

D, F, VOCAB = 64, 128, 32
ROLES = {"self_attn.q_proj": (D, D), "self_attn.k_proj": (D // 2, D), "self_attn.v_proj": (D // 2, D),
         "self_attn.o_proj": (D, D), "mlp.gate_proj": (F, D), "mlp.up_proj": (F, D),
         "mlp.down_proj": (D, F)}
LLAMA = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1, "hidden_size": D,
         "intermediate_size": F, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": VOCAB, "max_position_embeddings": 128, "rms_norm_eps": 1e-6}
RENAME = {"F8_E4M3": np.uint8, "BF16": np.uint16}

# ------------------------------------------------------------ E4M3, by table


def e4m3_table():
    t = np.empty(256)
    for c in range(256):
        s, e, m = c >> 7, (c >> 3) & 15, c & 7
        v = m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        t[c] = np.nan if (e == 15 and m == 7) else (-v if s else v)
    return t


E4M3 = e4m3_table()
POS = E4M3[:0x7F]  # codes 0..0x7E: 0 to 448, ascending


def to_e4m3(v):
    """Codes of the E4M3 values nearest v (float64), ties to the even code,
    saturating at ±448."""
    v = np.asarray(v, dtype=np.float64)
    a = np.minimum(np.abs(v), 448.0)
    hi = np.clip(np.searchsorted(POS, a), 1, 0x7E)
    lo = hi - 1
    dlo, dhi = a - POS[lo], POS[hi] - a
    code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    return (code | np.where(np.signbit(v), 0x80, 0)).astype(np.uint8)


def static_quantize(x, s):
    """x (f32) as a linear with static scale s (f32) reads it."""
    q = to_e4m3((np.float32(x) / np.float32(s)).astype(np.float64))
    return (E4M3[q].astype(np.float32) * np.float32(s)).astype(np.float64)


def f32_to_bf16_bits(a):
    """Round to nearest even, as a BF16 checkpoint stores it."""
    u = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(b):
    return (np.asarray(b, np.uint32) << 16).view(np.float32)


# ------------------------------------------------------------ checkpoints


def save(path, tensors):
    """tensors: name -> (dtype, array), F8_E4M3 / BF16 as their raw codes."""
    save_file({n: np.array(a, order="C") for n, (_, a) in tensors.items()}, str(path))
    with open(path, "rb") as f:
        blob = f.read()
    (hlen,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + hlen])
    for name, (dtype, arr) in tensors.items():
        if dtype in RENAME:
            assert arr.dtype == RENAME[dtype] and header[name]["dtype"] in ("U8", "U16")
            header[name]["dtype"] = dtype
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + blob[8 + hlen:])


def scale_tensor(dtype, value):
    """(dtype, array, the f32 value kiln must read) of a scalar scale."""
    if dtype == "F32":
        a = np.array(value, np.float32)
        return dtype, a, float(a)
    if dtype == "F16":
        a = np.array(value, np.float16)
        return dtype, a, float(a)
    b = f32_to_bf16_bits(np.array([value]))
    return dtype, b, float(bf16_value(b)[0])


def checkpoint(d, rng, scale_dtype, config, hf_quant=None, stray=False):
    """One layer of FP8 linears (per tensor, and per channel for the MLP)
    with static input scales; an lm_head in BF16 without one. Returns the
    weights (float64) and input scales (f32 values, 0 for none) by
    weight name."""
    tensors, weights, scales = {}, {}, {}
    for i, (role, (n, k)) in enumerate(ROLES.items()):
        p = f"model.layers.0.{role}"
        q = rng.integers(0, 256, size=(n, k), dtype=np.uint8)
        q[(q & 0x7F) == 0x7F] ^= 1
        per_channel = role.startswith("mlp")
        ws = rng.uniform(1e-3, 1e-2, size=(n, 1) if per_channel else (1,)).astype(np.float32)
        tensors[p + ".weight"] = ("F8_E4M3", q)
        tensors[p + ".weight_scale"] = ("F32", ws)
        weights[p + ".weight"] = E4M3[q] * ws.astype(np.float64)
        # calibrated amax of 1.5 to 3.5 for inputs of unit variance: some saturate
        dt, arr, val = scale_tensor(scale_dtype[i % len(scale_dtype)], (1.5 + 0.3 * i) / 448)
        tensors[p + ".input_scale"] = (dt, arr)
        scales[p + ".weight"] = 0.0 if stray else val
    head = rng.standard_normal((VOCAB, D)).astype(np.float32)
    tensors["lm_head.weight"] = ("BF16", f32_to_bf16_bits(head))
    weights["lm_head.weight"] = bf16_value(f32_to_bf16_bits(head)).astype(np.float64)
    scales["lm_head.weight"] = 0.0
    save(os.path.join(d, "model.safetensors"), tensors)
    cfg = dict(LLAMA)
    if config is not None:
        cfg["quantization_config"] = config
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    if hf_quant is not None:
        with open(os.path.join(d, "hf_quant_config.json"), "w") as f:
            json.dump(hf_quant, f)
    return weights, scales


def ct_args(strategy, dynamic):
    return {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None,
            "strategy": strategy, "block_structure": None, "dynamic": dynamic, "actorder": None,
            "observer": "minmax", "observer_kwargs": {}}


def ct_config(dynamic):
    return {"config_groups": {"group_0": {
                "targets": ["re:.*self_attn.*"], "weights": ct_args("tensor", False),
                "input_activations": ct_args("tensor", dynamic), "output_activations": None,
                "format": "float-quantized"},
            "group_1": {
                "targets": ["re:.*mlp.*"], "weights": ct_args("channel", False),
                "input_activations": ct_args("tensor", dynamic), "output_activations": None,
                "format": "float-quantized"}},
            "format": "float-quantized", "global_compression_ratio": None, "ignore": ["lm_head"],
            "kv_cache_scheme": None, "quant_method": "compressed-tensors",
            "quantization_status": "compressed", "sparsity_config": {}, "version": "0.12.2"}


CONVENTIONS = {
    "fp8 static": ({"quant_method": "fp8", "activation_scheme": "static"}, None),
    "modelopt FP8": (None, {"producer": {"name": "modelopt", "version": "0.29.0"},
                            "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None,
                                             "exclude_modules": ["lm_head"]}}),
    "compressed-tensors static": (ct_config(False), None),
}

# ------------------------------------------------------------ running kiln


def run_linears(d, m, rng):
    """Every linear of the model on its own input of m tokens, on the CPU:
    {weight name: (x, y, the node's input scale)}."""
    model, g, cpu = VP(), VP(), VP()
    st = lib.kiln_model_open(d.encode(), ctypes.byref(model))
    if st != KILN_OK:
        raise AssertionError(kilnlib.last_error(lib))
    try:
        assert lib.kiln_graph_create(ctypes.byref(g)) == KILN_OK
        assert lib.kiln_model_build_linears(model, g, 0) == KILN_OK, kilnlib.last_error(lib)
        assert lib.kiln_cpu_create(g, None, ctypes.byref(cpu)) == KILN_OK, kilnlib.last_error(lib)
        xs, ys, names = [], [], []
        for i in range(lib.kiln_graph_n_inputs(g)):
            t = lib.kiln_graph_input_at(g, i)
            x = rng.standard_normal((m, lib.kiln_tensor_ne(t, 0))).astype(np.float32)
            x[0, 0], x[-1, -1] = 10, -10  # past every scale's clamp
            xs.append(x)
        for i in range(lib.kiln_graph_n_outputs(g)):
            t = lib.kiln_graph_output_at(g, i)
            names.append(lib.kiln_tensor_name(t).decode()[:-len(".out")])
            ys.append(np.empty((m, lib.kiln_tensor_ne(t, 0)), np.float32))
        scales = []
        for i in range(lib.kiln_graph_n_outputs(g)):
            scales.append(lib.kiln_tensor_input_scale(lib.kiln_graph_output_at(g, i)))
        ins = (VP * len(xs))(*[x.ctypes.data for x in xs])
        outs = (VP * len(ys))(*[y.ctypes.data for y in ys])
        assert lib.kiln_cpu_run(cpu, m, ins, outs) == KILN_OK, kilnlib.last_error(lib)
        return {n: (x, y, s) for n, x, y, s in zip(names, xs, ys, scales)}
    finally:
        lib.kiln_cpu_destroy(cpu)
        lib.kiln_graph_destroy(g)
        lib.kiln_model_close(model)


class InputScale(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="kiln-iscale-oracle-")
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def check(self, weights, scales, got, quantized):
        for name, w in weights.items():
            x, y, s = got[name]
            self.assertEqual(s, np.float32(scales[name]), f"{name}: input scale read")
            xin = static_quantize(x, s) if s > 0 else x.astype(np.float64)
            want = xin @ w.T
            tol = 1e-5 * np.abs(want).max()
            self.assertLess(np.abs(y - want).max(), tol, f"{name}: kiln differs from numpy")
            if s > 0:
                saturated = np.sum(np.abs(x / s) > 448)
                self.assertGreater(saturated, 0, f"{name}: the input reaches the clamp")
                # the quantization is visible: the unquantized product is far off
                plain = x.astype(np.float64) @ w.T
                self.assertGreater(np.abs(plain - want).max(), 100 * tol, name)
            self.assertEqual(s > 0, quantized and name != "lm_head.weight", name)

    def test_every_convention_and_scale_dtype_matches_numpy(self):
        rng = np.random.default_rng([SEED, 1])
        for conv, (config, hf_quant) in CONVENTIONS.items():
            for dtypes in (["F32"], ["BF16"], ["F16"], ["F32", "BF16", "F16"]):
                with self.subTest(convention=conv, dtypes=dtypes), \
                        tempfile.TemporaryDirectory(dir=self.dir) as d:
                    weights, scales = checkpoint(d, rng, dtypes, config, hf_quant)
                    for m in (1, 7):
                        self.check(weights, scales, run_linears(d, m, rng), True)
        print("static input scales: fp8, ModelOpt and compressed-tensors, F32/BF16/F16 scales, "
              "match numpy at M = 1, 7")

    def test_a_dynamic_scheme_does_not_read_a_stray_input_scale(self):
        rng = np.random.default_rng([SEED, 2])
        for conv, config in (("fp8 dynamic", {"quant_method": "fp8", "activation_scheme": "dynamic"}),
                             ("compressed-tensors dynamic", ct_config(True))):
            with self.subTest(convention=conv), tempfile.TemporaryDirectory(dir=self.dir) as d:
                weights, scales = checkpoint(d, rng, ["F32"], config, stray=True)
                self.check(weights, scales, run_linears(d, 3, rng), False)

    def test_a_static_scheme_without_a_scale_names_the_linear(self):
        rng = np.random.default_rng([SEED, 3])
        checkpoint(self.dir, rng, ["F32"], CONVENTIONS["fp8 static"][0])
        path = os.path.join(self.dir, "model.safetensors")
        # the same file without up_proj's scale
        with open(path, "rb") as f:
            blob = f.read()
        (hlen,) = struct.unpack("<Q", blob[:8])
        header = json.loads(blob[8:8 + hlen])
        del header["model.layers.0.mlp.up_proj.input_scale"]
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text + blob[8 + hlen:])
        h = VP()
        self.assertEqual(lib.kiln_model_open(self.dir.encode(), ctypes.byref(h)), KILN_ERR_MALFORMED)
        msg = kilnlib.last_error(lib)
        self.assertIn("linear model.layers.0.mlp.up_proj", msg)
        self.assertIn("no tensor model.layers.0.mlp.up_proj.input_scale", msg)


if __name__ == "__main__":
    # unittest before Python 3.12 exits 0 when no test ran (a -k that matches
    # nothing): a run that checked nothing fails.
    result = unittest.main(verbosity=2, exit=False).result
    if result.testsRun == 0:
        sys.exit("no test ran")
    sys.exit(0 if result.wasSuccessful() else 1)

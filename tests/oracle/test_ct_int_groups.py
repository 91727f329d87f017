#!/usr/bin/env python3
"""compressed-tensors W4A16 / W8A16 (pack-quantized integer groups) against
kiln's reader, CPU dequantization and CPU executor.

The compressed-tensors package needs torch, which the oracle does not
install, so the checkpoints are written here in numpy following its
layout (compressors/pack_quantized: pack_to_int32, and quantization's
min-max qparams): codes q in [-2^(b-1), 2^(b-1) - 1] stored as q + 2^(b-1),
densely packed into little-endian int32 words along K (weight_packed
[N, ceil(K b / 32)]), zero points packed the same way along N
(weight_zero_point [ceil(N b / 32), G]), weight_scale BF16 [N, G],
weight_shape I64 [2]. The files themselves are written by the PyPI
safetensors writer. Expected values are computed here in float64,
w = (q - zp) * s, which kiln's f32 must equal exactly.
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
    from safetensors.numpy import save_file
except ImportError as e:  # the oracle is required, never skipped
    sys.exit(f"test_ct_int_groups: {e}; install tests/oracle/requirements.txt")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kilnlib  # noqa: E402
from kilnlib import KILN_OK, VP, QTensor  # noqa: E402

SEED = int(os.environ.get("KILN_TEST_SEED", "0")) or int.from_bytes(os.urandom(4), "little")
print(f"test seed: KILN_TEST_SEED={SEED}", file=sys.stderr)

lib = kilnlib.load()
for name, args, res in [
        ("kiln_graph_input", [VP, ctypes.c_char_p, ctypes.c_int64, ctypes.POINTER(VP)], ctypes.c_int),
        ("kiln_graph_weight", [VP, ctypes.c_char_p, ctypes.POINTER(QTensor), ctypes.POINTER(VP)],
         ctypes.c_int),
        ("kiln_graph_linear", [VP, ctypes.c_char_p, VP, VP, VP, ctypes.POINTER(VP)], ctypes.c_int),
        ("kiln_graph_output", [VP, VP], ctypes.c_int)]:
    f = getattr(lib, name)
    f.argtypes, f.restype = args, res


def fmt_id(name):
    out = ctypes.c_int()
    assert lib.kiln_format_from_name(name.encode(), ctypes.byref(out)) == KILN_OK, name
    return out.value


def pack_to_int32(q, bits, packed_dim=1):
    """compressed-tensors' dense packing: element i of a row (along
    packed_dim) at bit i * bits of the row's bit string, offset to unsigned,
    the last word zero-padded."""
    u = (q.astype(np.int64) + (1 << (bits - 1))).astype(np.uint64)
    if packed_dim == 0:
        u = u.T
    rows, cols = u.shape
    words = -(-cols * bits // 32)
    out = np.zeros((rows, words), dtype=np.uint64)
    for i in range(cols):
        bit = i * bits
        out[:, bit // 32] |= (u[:, i] << np.uint64(bit % 32)) & np.uint64(0xFFFFFFFF)
        if bit % 32 + bits > 32:
            out[:, bit // 32 + 1] |= u[:, i] >> np.uint64(32 - bit % 32)
    out = out.astype(np.uint32).view(np.int32)
    return np.ascontiguousarray(out.T if packed_dim == 0 else out)


def bf16_round(x):
    """x (float32) to the nearest BF16, as uint16 codes (round half to even)."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return b.astype(np.uint16)


def bf16_to_f64(u):
    return (u.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def quantize(w, bits, group, symmetric):
    """compressed-tensors' min-max observer and quantize, with the scale
    rounded to BF16 first (the model's dtype), as llm-compressor stores it."""
    n, k = w.shape
    g = group if 0 < group < k else k
    x = w.reshape(n, k // g, g).astype(np.float32)
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    mn = np.minimum(x.min(axis=2), 0)
    mx = np.maximum(x.max(axis=2), 0)
    if symmetric:
        s = np.maximum(-mn, mx) / ((qmax - qmin) / 2)
    else:
        s = (mx - mn) / (qmax - qmin)
    s = bf16_round(np.where(s == 0, np.float32(1e-3), s))
    sf = bf16_to_f64(s).astype(np.float32)
    zp = np.zeros_like(sf) if symmetric else np.clip(np.round(qmin - mn / sf), qmin, qmax)
    q = np.clip(np.round(x / sf[:, :, None] + zp[:, :, None]), qmin, qmax)
    return q.reshape(n, k).astype(np.int8), s, zp.astype(np.int8)


def save(path, tensors):
    """tensors: name -> (dtype, array); BF16 arrays hold uint16 codes, which
    the reference writer stores as U16 and the header then names BF16."""
    save_file({n: np.ascontiguousarray(a) for n, (_, a) in tensors.items()}, str(path),
              metadata={"format": "pt"})
    with open(path, "rb") as f:
        blob = f.read()
    (hlen,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + hlen])
    for name, (dtype, _) in tensors.items():
        header[name]["dtype"] = dtype
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + blob[8 + hlen:])


def scheme(bits, group, symmetric, **extra):
    w = {"num_bits": bits, "type": "int", "symmetric": symmetric,
         "group_size": group if group else None, "strategy": "group" if group else "channel",
         "block_structure": None, "dynamic": False, "actorder": None, "observer": "minmax",
         "observer_kwargs": {}}
    w.update(extra)
    return {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "quantization_status": "compressed", "ignore": ["lm_head"], "version": "0.12.2",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": w,
                                          "input_activations": None, "output_activations": None,
                                          "format": "pack-quantized"}}}


MODULE = "model.layers.0.mlp.down_proj"


class IntGroups(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.rng = np.random.default_rng(SEED)

    def tearDown(self):
        self.tmp.cleanup()

    def p(self, name):
        return os.path.join(self.tmp.name, name)

    def write(self, n, k, bits, group, symmetric, cfg_extra=None, mutate=None):
        w = self.rng.normal(0, 0.05, (n, k)).astype(np.float32)
        q, s, zp = quantize(w, bits, group, symmetric)
        t = {MODULE + ".weight_packed": ("I32", pack_to_int32(q, bits)),
             MODULE + ".weight_scale": ("BF16", s),
             MODULE + ".weight_shape": ("I64", np.array([n, k], dtype=np.int64))}
        if not symmetric:
            t[MODULE + ".weight_zero_point"] = ("I32", pack_to_int32(zp, bits, packed_dim=0))
        if mutate:
            mutate(t)
        save(self.p("model.safetensors"), t)
        with open(self.p("config.json"), "w") as f:
            json.dump({"num_hidden_layers": 1,
                       "quantization_config": scheme(bits, group, symmetric, **(cfg_extra or {}))}, f)
        g = group if 0 < group < k else k
        expect = ((q.astype(np.float64).reshape(n, k // g, g) - zp[:, :, None]) *
                  bf16_to_f64(s)[:, :, None]).reshape(n, k)
        return expect

    def open_error(self):
        h = VP()
        st = lib.kiln_model_open(self.tmp.name.encode(), ctypes.byref(h))
        if st == KILN_OK:
            lib.kiln_model_close(h)
            return None
        return lib.kiln_last_error().decode()

    def check(self, n, k, bits, group, symmetric):
        expect = self.write(n, k, bits, group, symmetric)
        m = kilnlib.Model(lib, self.tmp.name)
        try:
            qt = QTensor()
            st = lib.kiln_model_weight(m.h, (MODULE + ".weight").encode(), ctypes.byref(qt))
            self.assertEqual(st, KILN_OK, lib.kiln_last_error().decode())
            name = f"int{bits}_group" + ("" if symmetric else "_zp")
            self.assertEqual(qt.format, fmt_id(name))
            self.assertEqual((qt.n, qt.k, qt.group), (n, k, group if group < k else 0))
            out = np.empty((n, k), dtype=np.float32)
            self.assertEqual(lib.kiln_dequantize(ctypes.byref(qt), out.ctypes.data_as(VP)), KILN_OK)
            np.testing.assert_array_equal(out.astype(np.float64), expect, err_msg=name)
            self.run_linear(qt, expect)
        finally:
            m.close()
        self.inspect_shows_group(name, group if group < k else 0)

    def inspect_shows_group(self, name, group):
        """kiln inspect names the format with its group, in text and JSON."""
        cli = os.environ.get("KILN_CLI")
        if not cli:
            return
        out = subprocess.run([cli, "inspect", self.tmp.name, "--json"], capture_output=True,
                             text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        t = {e["name"]: e for e in json.loads(out.stdout)["tensors"]}[MODULE + ".weight"]
        self.assertEqual((t["format"], t["group"]), (name, group))
        out = subprocess.run([cli, "inspect", self.tmp.name], capture_output=True, text=True)
        self.assertIn(f"{name}/g{group}" if group else f"{name}/row", out.stdout)

    def run_linear(self, qt, expect):
        """The CPU executor's y = x · wᵀ against float64 numpy."""
        g, x_t, w_t, y_t, cpu = VP(), VP(), VP(), VP(), VP()
        self.assertEqual(lib.kiln_graph_create(ctypes.byref(g)), KILN_OK)
        try:
            self.assertEqual(lib.kiln_graph_input(g, b"x", qt.k, ctypes.byref(x_t)), KILN_OK)
            self.assertEqual(lib.kiln_graph_weight(g, b"w", ctypes.byref(qt), ctypes.byref(w_t)), KILN_OK,
                             lib.kiln_last_error().decode())
            self.assertEqual(lib.kiln_graph_linear(g, b"y", x_t, w_t, None, ctypes.byref(y_t)), KILN_OK)
            self.assertEqual(lib.kiln_graph_output(g, y_t), KILN_OK)
            self.assertEqual(lib.kiln_cpu_create(g, None, ctypes.byref(cpu)), KILN_OK,
                             lib.kiln_last_error().decode())
            m = 3
            x = self.rng.normal(0, 1, (m, qt.k)).astype(np.float32)
            y = np.empty((m, qt.n), dtype=np.float32)
            ins, outs = (VP * 1)(x.ctypes.data), (VP * 1)(y.ctypes.data)
            self.assertEqual(lib.kiln_cpu_run(cpu, m, ins, outs), KILN_OK, lib.kiln_last_error().decode())
            want = x.astype(np.float64) @ expect.T
            tol = 1e-5 * (np.abs(x).astype(np.float64) @ np.abs(expect).T) + 1e-30
            self.assertTrue(np.all(np.abs(y - want) <= tol), np.max(np.abs(y - want)))
        finally:
            lib.kiln_cpu_destroy(cpu)
            lib.kiln_graph_destroy(g)

    def test_int4_symmetric_groups(self):
        for group in (32, 64, 128):
            self.check(37, 256, 4, group, True)

    def test_int4_asymmetric_groups_odd_n(self):
        for n, group in ((13, 32), (37, 128), (9, 64)):
            self.check(n, 256, 4, group, False)

    def test_int8_groups_and_channels(self):
        self.check(37, 192, 8, 64, True)
        self.check(11, 192, 8, 32, False)
        self.check(5, 96, 8, 0, True)
        self.check(7, 96, 8, 0, False)

    def test_int4_channel_and_group_past_k(self):
        self.check(19, 64, 4, 0, False)
        self.check(3, 64, 4, 128, True)  # one group: compressed-tensors' columns < group_size

    def test_hostile_files_name_the_tensor(self):
        def shrink_scale(t):
            t[MODULE + ".weight_scale"] = ("BF16", t[MODULE + ".weight_scale"][1][:, :1].copy())

        def wrong_shape(t):
            t[MODULE + ".weight_shape"] = ("I64", np.array([8, 512], dtype=np.int64))

        def zp_unpacked_out_of_range(t):
            zp = np.full((8, 2), 9, dtype=np.int8)
            t[MODULE + ".weight_zero_point"] = ("I8", zp)

        def zp_wrong_rows(t):
            t[MODULE + ".weight_zero_point"] = ("I32", np.zeros((3, 2), dtype=np.int32))

        def packed_short(t):
            t[MODULE + ".weight_packed"] = ("I32", t[MODULE + ".weight_packed"][1][:, :-1].copy())

        cases = [
            (True, shrink_scale, "weight_scale"),
            (True, wrong_shape, "weight_shape [8, 512] does not fit"),
            (False, zp_unpacked_out_of_range, "zero point 0 is 9, outside int4's [-8, 7]"),
            (False, zp_wrong_rows, "weight_zero_point"),
            (True, packed_short, "weight_shape [8, 64] does not fit weight_packed"),
        ]
        for symmetric, mutate, want in cases:
            self.write(8, 64, 4, 32, symmetric, mutate=mutate)
            err = self.open_error()
            self.assertIsNotNone(err, want)
            self.assertIn(want, err)
            self.assertIn(MODULE, err)

    def test_group_not_dividing_k_is_named(self):
        self.write(8, 96, 4, 32, True)
        with open(self.p("config.json")) as f:
            cfg = json.load(f)
        cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 40
        with open(self.p("config.json"), "w") as f:
            json.dump(cfg, f)
        err = self.open_error()
        self.assertIsNotNone(err)
        self.assertIn("group_size 40 does not divide K = 96", err)
        self.assertIn(MODULE + ".weight_packed", err)

    def test_nonfinite_scale_is_named_with_its_index(self):
        def nan_scale(t):
            s = t[MODULE + ".weight_scale"][1].copy()
            s[1, 1] = 0x7FC0
            t[MODULE + ".weight_scale"] = ("BF16", s)
        self.write(4, 64, 4, 32, False, mutate=nan_scale)
        err = self.open_error()
        self.assertIsNotNone(err)
        self.assertIn(MODULE + ".weight: scale 3 is NaN", err)


if __name__ == "__main__":
    result = unittest.main(verbosity=2, exit=False).result
    if result.testsRun == 0:
        sys.exit("no test ran")
    sys.exit(0 if result.wasSuccessful() else 1)

#!/usr/bin/env python3
"""kiln's GGUF reader against the reference writer and reader (PyPI `gguf`).

GGUFWriter writes Llama-style files: the llama.* keys, metadata of every
value type (arrays of strings, arrays of arrays), and tensors in F32, F16,
BF16, Q8_0, Q4_0, MXFP4 (quantized by gguf.quants), Q4_K, Q6_K, Q5_0, Q5_1,
Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS and Q4_1 (random blocks with finite scales,
as raw bytes), plus a type kiln does not use (IQ3_S).
kiln opens them through the public model API and must report the same
names, shapes, types and sizes as GGUFReader, point each weight at the very
bytes the writer stored, and dequantize them bit for bit as
gguf.quants.dequantize does. The metadata is compared rendering by
rendering with what was written. Versions 2 and 3 and custom alignments are
covered; a truncated copy must fail cleanly.
"""
import ctypes
import os
import sys
import tempfile
import unittest

try:
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFValueType as V
except ImportError as e:  # the oracle is required, never skipped
    sys.exit(f"test_gguf_reader: {e}; install tests/oracle/requirements.txt")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kilnlib  # noqa: E402
from kilnlib import KILN_ERR_MALFORMED, KILN_ERR_UNSUPPORTED, KILN_OK, VP, ModelInfo, QTensor  # noqa: E402

SEED = int(os.environ.get("KILN_TEST_SEED", "0")) or int.from_bytes(os.urandom(4), "little")
print(f"test seed: KILN_TEST_SEED={SEED}", file=sys.stderr)

# ------------------------------------------------------------- the library

lib = kilnlib.load()
# kiln_format values of the GGML types kiln reads (include/kiln.h).
KILN_FORMAT = {T.F32: 0, T.F16: 1, T.BF16: 2, T.Q8_0: 9, T.Q4_0: 10, T.Q4_K: 11, T.Q6_K: 12, T.MXFP4: 13,
               T.Q5_0: 14, T.Q5_1: 15, T.Q2_K: 16, T.Q3_K: 17, T.Q5_K: 18, T.IQ4_NL: 19, T.IQ4_XS: 20,
               T.Q4_1: 21}


def last_error():
    return kilnlib.last_error(lib)


class Model(kilnlib.Model):
    def __init__(self, path):
        super().__init__(lib, path)

    def metadata(self):
        """[(key, summary)] in file order, every array item shown."""
        out = []
        buf = ctypes.create_string_buffer(1 << 16)
        for i in range(lib.kiln_gguf_n_kv(self.h)):
            v = VP()
            key = lib.kiln_gguf_kv_at(self.h, i, ctypes.byref(v))
            lib.kiln_gguf_value_summary(v, 1 << 20, buf, len(buf))
            out.append((key.decode(), buf.value.decode("utf-8", errors="surrogateescape")))
        return out


# ------------------------------------------------- what the metadata should say


def render(value, vtype, sub=None):
    """kiln_gguf_value_summary's rendering of a value the writer was given."""
    if vtype == V.ARRAY:
        sub = sub if sub is not None else V.get_type(value[0])
        items = [render(x, sub) for x in value]
        return f"array<{sub.name.lower()}>[{len(value)}] [" + ", ".join(items) + "]"
    if vtype == V.BOOL:
        return "true" if value else "false"
    if vtype == V.FLOAT32:
        return "%.9g" % float(np.float32(value))
    if vtype == V.FLOAT64:
        return "%.17g" % value
    if vtype == V.STRING:
        raw = value.encode()
        assert len(raw) <= 64, "the summary cuts longer strings"
        out = ""
        for b in raw:
            if b in (0x22, 0x5C):
                out += "\\" + chr(b)
            elif b < 0x20 or b == 0x7F:
                out += "\\x%02x" % b
            else:
                out += bytes([b]).decode("latin-1")
        return '"' + out.encode("latin-1").decode("utf-8") + '"'
    return str(int(value))


METADATA = [
    ("llama.block_count", 2, V.UINT32, None),
    ("llama.embedding_length", 64, V.UINT64, None),
    ("llama.feed_forward_length", 512, V.INT32, None),
    ("llama.attention.head_count", 8, V.UINT32, None),
    ("llama.attention.head_count_kv", 2, V.UINT16, None),
    ("llama.context_length", 8192, V.UINT32, None),
    ("llama.attention.layer_norm_rms_epsilon", 1e-6, V.FLOAT32, None),
    ("t.u8", 250, V.UINT8, None),
    ("t.i8", -128, V.INT8, None),
    ("t.i16", -32768, V.INT16, None),
    ("t.u64", 2**64 - 1, V.UINT64, None),
    ("t.i64", -2**63, V.INT64, None),
    ("t.f64", 1 / 3, V.FLOAT64, None),
    ("t.bool", False, V.BOOL, None),
    ("t.str", 'quote " back \\ tab \t é', V.STRING, None),
    ("t.arr_u16", [1, 65535, 7], V.ARRAY, V.UINT16),
    ("t.arr_f32", [0.1, -2.5, 3e38], V.ARRAY, V.FLOAT32),
    ("t.arr_bool", [True, False, True], V.ARRAY, V.BOOL),
    ("t.arr_arr", [["a", "bc"], ["d"]], V.ARRAY, None),
    ("t.arr_deep", [[[1, 2], [3]], [[4]]], V.ARRAY, None),
    ("tokenizer.ggml.tokens", ["<unk>", "<s>", "</s>"] + [f"tok{i}" for i in range(37)], V.ARRAY, None),
]

# ------------------------------------------------------------- the fixtures


def raw_blocks(rng, qtype, n, k, scale_offsets):
    """Random blocks of qtype with finite f16 scales at the given offsets."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n * k // block, size), dtype=np.uint8)
    for off in scale_offsets:
        d = rng.uniform(-0.02, 0.02, size=blocks.shape[0]).astype(np.float16)
        blocks[:, off:off + 2] = d.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(n, k // block * size)


def tensors(rng):
    """name -> (array to write, raw_dtype or None, GGML type)."""
    x = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    return {
        "token_embd.weight": (x(40, 64), None, T.F32),
        "blk.0.attn_norm.weight": (x(64), None, T.F32),
        "blk.0.attn_q.weight": (x(64, 64).astype(np.float16), None, T.F16),
        "blk.0.attn_k.weight": (gguf.quants.quantize(x(16, 64), T.BF16), T.BF16, T.BF16),
        "blk.0.attn_v.weight": (gguf.quants.quantize(x(16, 64), T.Q8_0), T.Q8_0, T.Q8_0),
        "blk.0.attn_output.weight": (gguf.quants.quantize(x(64, 64), T.Q4_0), T.Q4_0, T.Q4_0),
        "blk.0.ffn_gate.weight": (gguf.quants.quantize(x(512, 64), T.MXFP4), T.MXFP4, T.MXFP4),
        "blk.0.ffn_up.weight": (raw_blocks(rng, T.Q4_K, 4, 512, [0, 2]), T.Q4_K, T.Q4_K),
        "blk.0.ffn_down.weight": (raw_blocks(rng, T.Q6_K, 3, 768, [208]), T.Q6_K, T.Q6_K),
        "blk.1.ffn_down.weight": (raw_blocks(rng, T.Q5_K, 2, 256, [0, 2]), T.Q5_K, T.Q5_K),
        "blk.1.ffn_up.weight": (raw_blocks(rng, T.Q5_0, 2, 64, [0]), T.Q5_0, T.Q5_0),
        "blk.1.ffn_gate.weight": (raw_blocks(rng, T.Q5_1, 2, 64, [0, 2]), T.Q5_1, T.Q5_1),
        "blk.1.attn_q.weight": (raw_blocks(rng, T.Q2_K, 2, 256, [80, 82]), T.Q2_K, T.Q2_K),
        "blk.1.attn_k.weight": (raw_blocks(rng, T.Q3_K, 2, 512, [108]), T.Q3_K, T.Q3_K),
        "blk.1.attn_v.weight": (raw_blocks(rng, T.IQ4_NL, 3, 96, [0]), T.IQ4_NL, T.IQ4_NL),
        "blk.1.attn_output.weight": (raw_blocks(rng, T.IQ4_XS, 2, 256, [0]), T.IQ4_XS, T.IQ4_XS),
        "blk.1.ffn_norm.weight": (raw_blocks(rng, T.IQ3_S, 2, 256, [0]), T.IQ3_S, T.IQ3_S),
        "output.weight": (raw_blocks(rng, T.Q4_1, 40, 64, [0, 2]), T.Q4_1, T.Q4_1),
        "blk.1.experts.weight": (gguf.quants.quantize(x(2, 3, 64), T.Q8_0), T.Q8_0, T.Q8_0),
    }


def write_gguf(path, rng, alignment=None, version=None):
    w = gguf.GGUFWriter(path, "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, value, vtype, sub in METADATA:
        w.add_key_value(key, value, vtype, sub_type=sub)
    fixture = tensors(rng)
    for name, (array, raw_dtype, _) in fixture.items():
        w.add_tensor(name, array, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if version is not None:
        with open(path, "r+b") as f:  # versions 2 and 3 share one layout
            f.seek(4)
            f.write(int(version).to_bytes(4, "little"))
    return fixture


# ---------------------------------------------------------------- the checks


class GGUFReaderTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.rng = np.random.default_rng(SEED)

    def tearDown(self):
        self.dir.cleanup()

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def check_file(self, path, fixture, version=3, alignment=32):
        ref = gguf.GGUFReader(path)
        self.assertEqual(ref.alignment, alignment)
        m = Model(path)
        try:
            self.assertEqual(lib.kiln_model_container(m.h).decode(), f"gguf v{version}")
            self.assertEqual(lib.kiln_model_arch(m.h).decode(), "llama")
            info = ModelInfo()
            lib.kiln_model_get_info(m.h, ctypes.byref(info))
            self.assertEqual((info.n_layers, info.d_model, info.d_ffn, info.n_heads, info.n_kv_heads,
                              info.vocab, info.ctx), (2, 64, 512, 8, 2, 40, 8192))
            self.assertEqual(info.rms_eps, np.float32(1e-6))
            self.check_metadata(m, alignment)
            self.check_tensors(m, ref, fixture)
        finally:
            m.close()

    def check_metadata(self, m, alignment):
        want = [("general.architecture", render("llama", V.STRING))]
        if alignment != 32:
            want.append(("general.alignment", render(alignment, V.UINT32)))
        want += [(key, render(value, vtype, sub)) for key, value, vtype, sub in METADATA]
        self.assertEqual(m.metadata(), want)

    def check_tensors(self, m, ref, fixture):
        got = m.tensors()
        self.assertEqual([t.name.decode() for t in got], [t.name for t in ref.tensors])
        for t, r in zip(got, ref.tensors):
            name = t.name.decode()
            with self.subTest(tensor=name):
                qtype = fixture[name][2]
                self.assertEqual(r.tensor_type, qtype)
                self.assertEqual(t.type_name.decode(), qtype.name)
                self.assertEqual(t.n_dims, len(r.shape))
                self.assertEqual(list(t.ne[:t.n_dims]), [int(d) for d in r.shape])
                self.assertEqual(list(t.ne[t.n_dims:]), [1] * (4 - t.n_dims))
                self.assertEqual(t.bytes, r.n_bytes)
                self.assertEqual(bool(t.supported), qtype in KILN_FORMAT)
                if t.supported:
                    self.assertEqual(t.format, KILN_FORMAT[qtype])
                    self.check_weight(m, name, r)
                else:
                    qt = QTensor()
                    st = lib.kiln_model_weight(m.h, t.name, ctypes.byref(qt))
                    self.assertEqual(st, KILN_ERR_UNSUPPORTED)
                    self.assertIn(name, last_error())
                    self.assertIn(qtype.name, last_error())

    def check_weight(self, m, name, r):
        qt = QTensor()
        st = lib.kiln_model_weight(m.h, name.encode(), ctypes.byref(qt))
        self.assertEqual(st, KILN_OK, last_error())
        shape = [int(d) for d in r.shape]
        self.assertEqual(qt.k, shape[0])
        self.assertEqual(qt.n, int(np.prod(shape[1:])))
        stored = np.ascontiguousarray(r.data)
        # The weight is the file's bytes in place, not a copy of other bytes.
        self.assertEqual(ctypes.string_at(qt.data, r.n_bytes), stored.tobytes())
        out = np.empty((qt.n, qt.k), dtype=np.float32)
        st = lib.kiln_dequantize(ctypes.byref(qt), out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))
        self.assertEqual(st, KILN_OK, last_error())
        want = gguf.quants.dequantize(stored, r.tensor_type).astype(np.float32).reshape(qt.n, qt.k)
        diff = np.flatnonzero(out.view(np.uint32) != want.view(np.uint32))
        self.assertEqual(diff.size, 0, f"{name}: {diff.size} values differ, first at {diff[:1]}: "
                         f"kiln {out.flat[diff[:1]]} gguf {want.flat[diff[:1]]}")

    def test_v3(self):
        path = self.path("model.gguf")
        self.check_file(path, write_gguf(path, self.rng))

    def test_v2(self):
        path = self.path("model_v2.gguf")
        self.check_file(path, write_gguf(path, self.rng, version=2), version=2)

    def test_custom_alignments(self):
        for alignment in (64, 256, 4096):
            with self.subTest(alignment=alignment):
                path = self.path(f"model_a{alignment}.gguf")
                fixture = write_gguf(path, self.rng, alignment=alignment)
                self.check_file(path, fixture, alignment=alignment)

    def test_truncated_copy_fails_cleanly(self):
        path = self.path("model.gguf")
        write_gguf(path, self.rng)
        with open(path, "rb") as f:
            data = f.read()
        # The writer pads the last tensor; cutting only padding leaves a valid file.
        end = max(t.data_offset + t.n_bytes for t in gguf.GGUFReader(path).tensors)
        for cut in (len(data) // 3, end - 1 - int(self.rng.integers(0, 16))):
            with self.subTest(cut=cut):
                short = self.path("short.gguf")
                with open(short, "wb") as f:
                    f.write(data[:cut])
                h = VP()
                st = lib.kiln_model_open(short.encode(), ctypes.byref(h))
                self.assertEqual(st, KILN_ERR_MALFORMED, last_error())
                self.assertTrue(last_error().startswith(short), last_error())
                self.assertIn("(at byte offset ", last_error())

    def test_tensor_type_table_matches_gguf_py(self):
        for qtype in T:
            with self.subTest(type=qtype.name):
                row = lib.kiln_gguf_tensor_type_get(int(qtype))
                self.assertTrue(row, f"kiln does not know type {int(qtype)}")
                row = row.contents
                self.assertEqual(row.name.decode(), qtype.name)
                want = gguf.GGML_QUANT_SIZES[qtype]
                if qtype == T.Q8_1:
                    # gguf-py still lists the float d, s of old ggml (40 bytes);
                    # ggml-common.h has two halves and asserts 36. ggml defines
                    # the files; should gguf-py be fixed, this branch goes.
                    self.assertEqual(want, (32, 40))
                    want = (32, 36)
                self.assertEqual((row.block, row.type_size), want)


if __name__ == "__main__":
    # unittest before Python 3.12 exits 0 when no test ran (a -k that matches
    # nothing): a run that checked nothing fails.
    result = unittest.main(verbosity=2, exit=False).result
    if result.testsRun == 0:
        sys.exit("no test ran")
    sys.exit(0 if result.wasSuccessful() else 1)

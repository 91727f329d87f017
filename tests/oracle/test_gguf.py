"""kiln's GGML quantizers against gguf-py, the reference GGUF writers use.

Checks, each printing one summary line:
  - quantize is byte-identical for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and MXFP4 (and
    the plain BF16 and F16 conversions) on random tensors of several shapes:
    normal data,
    heavy-tailed data, rows of very different magnitudes, all-zero rows, and
    MXFP4 values placed exactly on ties between two E2M1 codes;
  - dequantize is bit-identical (float32 bit patterns) for Q8_0, Q4_0, Q4_1,
    Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS and MXFP4 on random
    blocks: random bytes with finite f16 scales of every exponent.
gguf-py has no quantizer for the K-quants and IQ4 types; tests/graph/
test_quant.c pins those to ggml's own bytes.

libkiln comes from $KILN_LIB. Exits non-zero on the first check that fails,
after printing where the first mismatch is.
"""
import ctypes
import os
import sys
import time

try:
    import numpy as np
    from gguf import GGMLQuantizationType as T
    from gguf import quants
except ImportError as e:
    print(f"FAIL: cannot import the oracle ({e}); run `pip install gguf numpy`", file=sys.stderr)
    sys.exit(1)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kilnlib  # noqa: E402
from kilnlib import QTensor  # noqa: E402

# Like tests/util/testutil.h: $KILN_TEST_SEED, else from the clock; printed.
SEED = int(os.environ.get("KILN_TEST_SEED", str(time.time_ns() & 0xFFFFFFFF)), 0)


LIB = kilnlib.load()


def kiln_format(name):
    fmt = ctypes.c_int()
    if LIB.kiln_format_from_name(name.encode(), ctypes.byref(fmt)) != 0:
        raise RuntimeError(LIB.kiln_last_error().decode())
    return fmt.value


def check_status(st, what):
    if st != 0:
        raise RuntimeError(f"{what}: status {st}: {LIB.kiln_last_error().decode()}")


def kiln_quantize(name, x):
    n, k = x.shape
    fmt = kiln_format(name)
    size = ctypes.c_size_t()
    check_status(LIB.kiln_format_data_bytes(fmt, n, k, ctypes.byref(size)), "kiln_format_data_bytes")
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros(size.value, dtype=np.uint8)
    t = QTensor(fmt, n, k, out.ctypes.data, None, 0.0)
    check_status(LIB.kiln_quantize(x.ctypes.data, ctypes.byref(t)), f"kiln_quantize {name}")
    return out.reshape(n, -1)


def kiln_dequantize(name, raw, n, k):
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    out = np.zeros((n, k), dtype=np.float32)
    t = QTensor(kiln_format(name), n, k, raw.ctypes.data, None, 0.0)
    check_status(LIB.kiln_dequantize(ctypes.byref(t), out.ctypes.data), f"kiln_dequantize {name}")
    return out


# kiln format name, gguf type, block elements, block bytes
GGML = {
    "q8_0": (T.Q8_0, 32, 34),
    "q4_0": (T.Q4_0, 32, 18),
    "q4_1": (T.Q4_1, 32, 20),
    "q5_0": (T.Q5_0, 32, 22),
    "q5_1": (T.Q5_1, 32, 24),
    "q2_k": (T.Q2_K, 256, 84),
    "q3_k": (T.Q3_K, 256, 110),
    "q5_k": (T.Q5_K, 256, 176),
    "iq4_nl": (T.IQ4_NL, 32, 18),
    "iq4_xs": (T.IQ4_XS, 256, 136),
    "q4_k": (T.Q4_K, 256, 144),
    "q6_k": (T.Q6_K, 256, 210),
    "ggml_mxfp4": (T.MXFP4, 32, 17),
    "bf16": (T.BF16, 1, 2),
    "f16": (T.F16, 1, 2),
}

SHAPES = [(1, 256), (4, 512), (16, 256), (33, 768), (7, 4096)]


def datasets(rng, n, k):
    """Named f32 [n, k] inputs. All-zero rows are +0.0: gguf-py and ggml
    disagree on the sign of Q4_0's scale for an all -0.0 block."""
    normal = rng.standard_normal((n, k)).astype(np.float32)
    heavy = (rng.standard_t(2.0, (n, k)) * 0.05).astype(np.float32)
    mixed = (rng.standard_normal((n, k)) * 10.0 ** rng.uniform(-4, 4, (n, 1))).astype(np.float32)
    zeros = normal.copy()
    zeros[:: 2] = 0.0
    zeros[:, : k // 4] = 0.0
    return {"normal": normal, "heavy-tailed": heavy, "mixed-magnitude": mixed, "zero-rows": zeros}


def mxfp4_ties(rng, n, k):
    """Values exactly halfway between neighbouring E2M1 codes, with each
    block's maximum fixed so that the block's scale is known."""
    kv = np.array([0, 1, 2, 3, 4, 6, 8, 12], dtype=np.float32)
    mids = (kv[:-1] + kv[1:]) / 2
    e = rng.integers(100, 150, (n, k // 32, 1))
    d = np.ldexp(np.float32(1.0), (e - 128)).astype(np.float32)
    pick = rng.integers(0, len(mids), (n, k // 32, 32))
    sign = rng.choice(np.array([-1.0, 1.0], dtype=np.float32), (n, k // 32, 32))
    x = (sign * mids[pick] * d).astype(np.float32)
    x[..., 0] = 8.0 * d[..., 0]  # amax in [8d, 16d): floor(log2(amax)) - 2 + 127 = e
    return x.reshape(n, k)


def first_mismatch_bytes(a, b, block_bytes):
    rows, cols = np.nonzero(a != b)
    r, c = int(rows[0]), int(cols[0])
    return (f"row {r}, byte {c} (block {c // block_bytes}, offset {c % block_bytes}): "
            f"kiln 0x{int(a[r, c]):02x}, gguf 0x{int(b[r, c]):02x}")


def first_mismatch_f32(a, b, block):
    ab, bb = a.view(np.uint32), b.view(np.uint32)
    rows, cols = np.nonzero(ab != bb)
    r, c = int(rows[0]), int(cols[0])
    return (f"row {r}, element {c} (block {c // block}, index {c % block}): "
            f"kiln {a[r, c]!r} (0x{int(ab[r, c]):08x}), gguf {b[r, c]!r} (0x{int(bb[r, c]):08x})")


CHECKS = []
FAILURES = []


def report(ok, line, detail=None):
    print(("PASS " if ok else "FAIL ") + line)
    CHECKS.append(line)
    if not ok:
        print("     first mismatch: " + detail)
        FAILURES.append(line)


def check_quantize(name):
    gtype, block, block_bytes = GGML[name]
    rng = np.random.default_rng(SEED + gtype)
    tensors = total = 0
    for n, k in SHAPES:
        cases = datasets(rng, n, k)
        if name == "ggml_mxfp4":
            cases["ties"] = mxfp4_ties(rng, n, k)
        for label, x in cases.items():
            ours = kiln_quantize(name, x)
            ref = np.asarray(quants.quantize(x, gtype)).view(np.uint8).reshape(n, -1)
            if ours.shape != ref.shape or not np.array_equal(ours, ref):
                detail = (f"shape {ours.shape} vs {ref.shape}" if ours.shape != ref.shape
                          else first_mismatch_bytes(ours, ref, block_bytes))
                report(False, f"quantize {name}: [{n}, {k}] {label} data differs from gguf", detail)
                return
            tensors += 1
            total += ours.size
    report(True, f"quantize {name}: byte-identical to gguf on {tensors} tensors ({total} bytes)")


def random_f16(rng, count):
    """Finite f16 bit patterns of every sign and exponent (no inf or NaN)."""
    bits = rng.integers(0, 1 << 16, count, dtype=np.uint32).astype(np.uint16)
    finite = (bits & 0x7C00) != 0x7C00
    bits[~finite] &= 0xBFFF  # clear the exponent's top bit: finite
    return bits


# byte offsets of the f16 fields in each block
F16_FIELDS = {"q8_0": [0], "q4_0": [0], "q4_1": [0, 2], "q4_k": [0, 2], "q6_k": [208], "ggml_mxfp4": [],
              "q5_0": [0], "q5_1": [0, 2], "q2_k": [80, 82], "q3_k": [108], "q5_k": [0, 2],
              "iq4_nl": [0], "iq4_xs": [0]}


def check_dequantize(name):
    gtype, block, block_bytes = GGML[name]
    rng = np.random.default_rng(SEED + 1000 + gtype)
    blocks = 0
    for n, k in SHAPES:
        nb = n * k // block
        raw = rng.integers(0, 256, (nb, block_bytes), dtype=np.uint16).astype(np.uint8)
        for off in F16_FIELDS[name]:
            raw[:, off:off + 2] = random_f16(rng, nb).view(np.uint8).reshape(nb, 2)
        raw = raw.reshape(n, -1)
        ours = kiln_dequantize(name, raw, n, k)
        with np.errstate(over="ignore"):  # MXFP4 e = 0xFF overflows to inf, in both
            ref = np.asarray(quants.dequantize(raw, gtype), dtype=np.float32).reshape(n, k)
        if not np.array_equal(ours.view(np.uint32), ref.view(np.uint32)):
            report(False, f"dequantize {name}: [{n}, {k}] differs from gguf", first_mismatch_f32(ours, ref, block))
            return
        blocks += nb
    report(True, f"dequantize {name}: bit-identical to gguf on {blocks} random blocks")


def main():
    print(f"gguf oracle, seed {SEED} (KILN_TEST_SEED to replay)")
    for name in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "ggml_mxfp4", "bf16", "f16"):
        check_quantize(name)
    for name in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl",
                 "iq4_xs", "ggml_mxfp4"):
        check_dequantize(name)
    if not CHECKS:
        print("no check ran", file=sys.stderr)
        return 1
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed", file=sys.stderr)
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Write the seed corpus of fuzz_gguf: a few small, valid GGUF files made with
the reference writer (PyPI `gguf`), covering every metadata type, nested
arrays, a custom alignment, version 2, and each tensor type kiln reads.
The output is deterministic; run it again after changing it and commit the
files. Usage: make_corpus.py [OUTDIR] (default: fuzz/corpus/gguf)."""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V


def write(path, writer_fn, arch="llama", alignment=None, version=None):
    w = gguf.GGUFWriter(path, arch)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    writer_fn(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if version is not None:
        # Versions 2 and 3 share one layout; only the field differs.
        with open(path, "r+b") as f:
            f.seek(4)
            f.write(int(version).to_bytes(4, "little"))


def quantized(rng, qtype, n, k):
    x = rng.standard_normal((n, k)).astype(np.float32)
    return gguf.quants.quantize(x, qtype)


def raw_blocks(rng, qtype, n, k, scale_offsets):
    """Random blocks with their f16 scales set to sane values."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n * k // block, size), dtype=np.uint8)
    for off in scale_offsets:
        d = rng.uniform(0.001, 0.01, size=blocks.shape[0]).astype(np.float16)
        blocks[:, off:off + 2] = d.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(n, k // block * size)


def llama(w):
    rng = np.random.default_rng(1)
    w.add_block_count(1)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_context_length(256)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>", "a", "b", "c"])
    w.add_token_scores([0.0, -1.0, -2.0, -3.0, -4.0, -5.0])
    w.add_tensor("token_embd.weight", rng.standard_normal((6, 64)).astype(np.float32))
    w.add_tensor("blk.0.attn_norm.weight", rng.standard_normal(64).astype(np.float16))
    w.add_tensor("blk.0.attn_q.weight", quantized(rng, T.Q8_0, 4, 64), raw_dtype=T.Q8_0)
    w.add_tensor("blk.0.attn_k.weight", quantized(rng, T.Q4_0, 2, 64), raw_dtype=T.Q4_0)


def every_value_type(w):
    w.add_key_value("t.u8", 200, V.UINT8)
    w.add_key_value("t.i8", -100, V.INT8)
    w.add_key_value("t.u16", 60000, V.UINT16)
    w.add_key_value("t.i16", -30000, V.INT16)
    w.add_key_value("t.u32", 4000000000, V.UINT32)
    w.add_key_value("t.i32", -2000000000, V.INT32)
    w.add_key_value("t.f32", 0.5, V.FLOAT32)
    w.add_key_value("t.bool", True, V.BOOL)
    w.add_key_value("t.str", "kiln", V.STRING)
    w.add_key_value("t.u64", 2**63, V.UINT64)
    w.add_key_value("t.i64", -2**62, V.INT64)
    w.add_key_value("t.f64", 0.25, V.FLOAT64)
    w.add_key_value("t.arr_i32", [1, -2, 3], V.ARRAY, sub_type=V.INT32)
    w.add_key_value("t.arr_bool", [True, False], V.ARRAY, sub_type=V.BOOL)
    w.add_key_value("t.arr_str", ["x", "", "yz"], V.ARRAY)
    w.add_key_value("t.arr_arr", [["a", "b"], ["c"]], V.ARRAY)
    w.add_key_value("t.arr_deep", [[[1.5, 2.5]], [[3.5]]], V.ARRAY)


def kquants(w):
    rng = np.random.default_rng(2)
    w.add_block_count(1)
    w.add_tensor("blk.0.ffn_up.weight", raw_blocks(rng, T.Q4_K, 2, 256, [0, 2]), raw_dtype=T.Q4_K)
    w.add_tensor("blk.0.ffn_down.weight", raw_blocks(rng, T.Q6_K, 2, 256, [208]), raw_dtype=T.Q6_K)
    w.add_tensor("blk.0.ffn_gate.weight", quantized(rng, T.MXFP4, 2, 64), raw_dtype=T.MXFP4)
    w.add_tensor("blk.0.ffn_norm.weight", gguf.quants.quantize(
        rng.standard_normal(64).astype(np.float32), T.BF16), raw_dtype=T.BF16)
    w.add_tensor("blk.0.ffn_other.weight", raw_blocks(rng, T.Q5_K, 1, 256, [0, 2]), raw_dtype=T.Q5_K)


def no_tensors(w):
    w.add_name("empty")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "corpus", "gguf")
    os.makedirs(out, exist_ok=True)
    write(os.path.join(out, "llama.gguf"), llama)
    write(os.path.join(out, "llama_v2.gguf"), llama, version=2)
    write(os.path.join(out, "values.gguf"), every_value_type, arch="test")
    write(os.path.join(out, "kquants_align64.gguf"), kquants, alignment=64)
    write(os.path.join(out, "no_tensors.gguf"), no_tensors)


if __name__ == "__main__":
    main()

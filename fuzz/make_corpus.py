#!/usr/bin/env python3
"""Write the seed corpora of the fuzzers.

fuzz_gguf: a few small, valid GGUF files made with the reference writer
(PyPI `gguf`), covering every metadata type, nested arrays, a custom
alignment, version 2, and each tensor type kiln reads.

fuzz_safetensors: every kind of tensor the reader knows, each in a file of
the harness's input format (a safetensors file, then sections a marker
opens: config.json, hf_quant_config.json, the shard index, a second shard):
plain dtypes, every dtype name, FP8 per tensor / per channel / block,
NVFP4 (config.json and hf_quant_config.json), gpt-oss MXFP4 pairs in both
spellings with and without an expert dimension, zero-byte tensors of every
kind, and sharded sets with config.json.

The output is deterministic; run it again after changing it and commit the
files. Usage: make_corpus.py [OUTDIR] (default: fuzz/corpus; the files go to
OUTDIR/gguf and OUTDIR/safetensors)."""
import json
import os
import struct
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


def later_ggml_types(w):
    """Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL and IQ4_XS, and IQ3_S, which kiln
    does not read."""
    rng = np.random.default_rng(3)
    w.add_block_count(1)
    w.add_tensor("blk.0.attn_q.weight", quantized(rng, T.Q5_0, 2, 64), raw_dtype=T.Q5_0)
    w.add_tensor("blk.0.attn_k.weight", quantized(rng, T.Q5_1, 2, 64), raw_dtype=T.Q5_1)
    w.add_tensor("blk.0.attn_v.weight", raw_blocks(rng, T.Q2_K, 2, 256, [80, 82]), raw_dtype=T.Q2_K)
    w.add_tensor("blk.0.attn_output.weight", raw_blocks(rng, T.Q3_K, 2, 256, [108]), raw_dtype=T.Q3_K)
    w.add_tensor("blk.0.ffn_up.weight", raw_blocks(rng, T.Q5_K, 2, 256, [0, 2]), raw_dtype=T.Q5_K)
    w.add_tensor("blk.0.ffn_gate.weight", raw_blocks(rng, T.IQ4_NL, 2, 64, [0]), raw_dtype=T.IQ4_NL)
    w.add_tensor("blk.0.ffn_down.weight", raw_blocks(rng, T.IQ4_XS, 2, 256, [0]), raw_dtype=T.IQ4_XS)
    w.add_tensor("blk.0.ffn_other.weight", raw_blocks(rng, T.IQ3_S, 1, 256, [0]), raw_dtype=T.IQ3_S)


def q4_1(w):
    """Q4_1 weights, as the FFN of a Q4_1 file: gguf.quants' blocks, one
    tensor of random bytes with finite d and m, and a Q8_0 embedding."""
    rng = np.random.default_rng(4)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", quantized(rng, T.Q8_0, 4, 64), raw_dtype=T.Q8_0)
    w.add_tensor("blk.0.ffn_gate.weight", quantized(rng, T.Q4_1, 2, 64), raw_dtype=T.Q4_1)
    w.add_tensor("blk.0.ffn_up.weight", quantized(rng, T.Q4_1, 2, 64), raw_dtype=T.Q4_1)
    w.add_tensor("blk.0.ffn_down.weight", raw_blocks(rng, T.Q4_1, 2, 64, [0, 2]), raw_dtype=T.Q4_1)


def no_tensors(w):
    w.add_name("empty")


# ------------------------------------------------------------ safetensors

MARKERS = {
    "config": b"\0KILNCFG",
    "hf_quant": b"\0KILNHFQ",
    "index": b"\0KILNIDX",
    "shard2": b"\0KILNSH2",
}


def st_file(tensors, metadata=None, pad=0):
    """A safetensors file of (name, dtype, shape, bytes) in order; pad spaces
    after the JSON move the data section off alignment."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode() + b" " * pad
    return struct.pack("<Q", len(text)) + text + data


def st_input(tensors, metadata=None, pad=0, **sections):
    out = st_file(tensors, metadata, pad)
    for key, body in sections.items():
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        out += MARKERS[key] + body
    return out


def rbytes(rng, n):
    return rng.integers(0, 256, size=n, dtype=np.uint8).tobytes()


def e4m3(rng, n):
    """Finite E4M3 codes (0x7f and 0xff are NaN)."""
    b = rng.integers(0, 256, size=n, dtype=np.uint8)
    b[(b & 0x7F) == 0x7F] = 0x38
    return b.tobytes()


def f32(*values):
    return struct.pack("<%df" % len(values), *values)


LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1, "hidden_size": 32,
    "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1,
    "vocab_size": 16, "max_position_embeddings": 128, "rms_norm_eps": 1e-05,
}

# Bits per element of every dtype name the reader knows.
DTYPE_BITS = {
    "F32": 32, "F16": 16, "BF16": 16, "F8_E4M3": 8, "U8": 8, "I8": 8, "F64": 64, "I64": 64,
    "U64": 64, "I32": 32, "U32": 32, "I16": 16, "U16": 16, "BOOL": 8, "F8_E5M2": 8,
    "F8_E8M0": 8, "F6_E2M3": 6, "F6_E3M2": 6, "F4": 4, "C64": 64,
}


def safetensors_corpus(out):
    rng = np.random.default_rng(3)
    seeds = {}
    seeds["empty"] = st_input([])
    seeds["plain"] = st_input(
        [("a", "F32", [2, 3], f32(*range(6))),
         ("h", "F16", [4], np.arange(4, dtype=np.float16).tobytes()),
         ("b", "BF16", [2, 2], rbytes(rng, 8)),
         ("i", "I64", [1], struct.pack("<q", 7))],
        metadata={"format": "pt"}, config=LLAMA_CONFIG)
    seeds["every_dtype"] = st_input(
        [("t_" + d.lower(), d, [8], rbytes(rng, bits)) for d, bits in DTYPE_BITS.items()])
    seeds["odd"] = st_input(
        [("o", "U8", [1], b"\1"), ("f", "F32", [2], f32(1, 2)),
         ("r5", "F16", [1, 1, 1, 1, 2], rbytes(rng, 4)), ("q", "F7_NEW", [3], rbytes(rng, 3)),
         ("z", "F32", [0, 4], b""), ("n", "F4", [2], b"\x12")], pad=3)
    seeds["fp8_tensor"] = st_input(
        [("l.weight", "F8_E4M3", [2, 16], e4m3(rng, 32)), ("l.weight_scale", "F32", [], f32(0.5)),
         ("l.input_scale", "F32", [1], f32(1))],
        config=dict(LLAMA_CONFIG, quantization_config={"quant_method": "fp8",
                                                       "activation_scheme": "static"}))
    seeds["fp8_channel"] = st_input(
        [("a.weight", "F8_E4M3", [2, 16], e4m3(rng, 32)), ("a.weight_scale", "F32", [2], f32(1, 2)),
         ("b.weight", "F8_E4M3", [2, 16], e4m3(rng, 32)),
         ("b.weight_scale", "F32", [2, 1], f32(1, 2))])
    seeds["fp8_block"] = st_input(
        [("d.weight", "F8_E4M3", [2, 130], e4m3(rng, 260)),
         ("d.weight_scale_inv", "F32", [1, 2], f32(1, 2))],
        config={"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}})
    nvfp4 = [("u.weight", "U8", [2, 16], rbytes(rng, 32)),
             ("u.weight_scale", "F8_E4M3", [2, 2], e4m3(rng, 4)),
             ("u.weight_scale_2", "F32", [], f32(0.25)), ("u.input_scale", "F32", [], f32(1))]
    seeds["nvfp4"] = st_input(nvfp4, config={"quantization_config": {
        "quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}})
    seeds["nvfp4_hf_quant"] = st_input(nvfp4, hf_quant={"quantization": {
        "quant_algo": "NVFP4", "group_size": 16}})
    scales = lambda n: rng.integers(110, 140, size=n, dtype=np.uint8).tobytes()
    seeds["mxfp4"] = st_input(
        [("m.down_proj_blocks", "U8", [2, 1, 16], rbytes(rng, 32)),
         ("m.down_proj_scales", "U8", [2, 1], scales(2)),
         ("m.gate_up_proj_blocks", "U8", [1, 2, 1, 16], rbytes(rng, 32)),
         ("m.gate_up_proj_scales", "U8", [1, 2, 1], scales(2)),
         ("e.gate_up_proj_blocks", "U8", [2, 2, 1, 16], rbytes(rng, 64)),
         ("e.gate_up_proj_scales", "U8", [2, 2, 1], scales(4)),
         ("b.mlp1_weight.blocks", "U8", [1, 1, 16], rbytes(rng, 16)),
         ("b.mlp1_weight.scales", "U8", [1, 1], scales(1))],
        config={"architectures": ["GptOssForCausalLM"],
                "quantization_config": {"quant_method": "mxfp4"}})
    seeds["zero_bytes"] = st_input(
        [("gptoss.down_proj_blocks", "U8", [0, 4, 2, 16], b""),
         ("gptoss.down_proj_scales", "U8", [0, 4, 2], b""),
         ("rows.down_proj_blocks", "U8", [0, 2, 16], b""),
         ("rows.down_proj_scales", "U8", [0, 2], b""),
         ("groups.down_proj_blocks", "U8", [4, 0, 16], b""),
         ("groups.down_proj_scales", "U8", [4, 0], b""),
         ("fp8.weight", "F8_E4M3", [0, 16], b""), ("fp8.weight_scale", "F32", [], f32(1)),
         ("fp8k.weight", "F8_E4M3", [4, 0], b""), ("fp8k.weight_scale", "F32", [4], f32(1, 1, 1, 1)),
         ("blk.weight", "F8_E4M3", [0, 128], b""), ("blk.weight_scale_inv", "F32", [0, 1], b""),
         ("nv.weight", "U8", [0, 16], b""), ("nv.weight_scale", "F8_E4M3", [0, 2], b""),
         ("nv.weight_scale_2", "F32", [], f32(1)),
         ("plain", "F32", [0], b""), ("plain2", "BF16", [3, 0], b"")],
        config={"architectures": ["GptOssForCausalLM"],
                "quantization_config": {"quant_method": "mxfp4"}})
    shard_s = [("x.weight", "F8_E4M3", [2, 16], e4m3(rng, 32)),
               ("x.weight_scale", "F32", [2], f32(1, 2)), ("n", "BF16", [2], rbytes(rng, 4))]
    shard_t = [("y_blocks", "U8", [2, 1, 16], rbytes(rng, 32)), ("y_scales", "U8", [2, 1], scales(2)),
               ("z.weight_scale", "F32", [], f32(0.5))]
    weight_map = {name: "s.safetensors" for name, *_ in shard_s}
    weight_map.update({name: "t.safetensors" for name, *_ in shard_t})
    seeds["sharded"] = st_input(
        shard_s, index={"metadata": {"total_size": 80}, "weight_map": weight_map},
        shard2=st_file(shard_t), config=LLAMA_CONFIG)
    # A weight in one shard, its scale in the other.
    seeds["sharded_split"] = st_input(
        [("z.weight", "F8_E4M3", [2, 16], e4m3(rng, 32))],
        index={"weight_map": {"z.weight": "s.safetensors", "z.weight_scale": "t.safetensors"}},
        shard2=st_file([("z.weight_scale", "F32", [], f32(0.5))]),
        config=dict(LLAMA_CONFIG, quantization_config={"quant_method": "fp8"}))
    os.makedirs(out, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(out, name + ".safetensors"), "wb") as f:
            f.write(data)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    top = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "corpus")
    safetensors_corpus(os.path.join(top, "safetensors"))
    out = os.path.join(top, "gguf")
    os.makedirs(out, exist_ok=True)
    write(os.path.join(out, "llama.gguf"), llama)
    write(os.path.join(out, "llama_v2.gguf"), llama, version=2)
    write(os.path.join(out, "values.gguf"), every_value_type, arch="test")
    write(os.path.join(out, "kquants_align64.gguf"), kquants, alignment=64)
    write(os.path.join(out, "no_tensors.gguf"), no_tensors)
    write(os.path.join(out, "later_ggml_types.gguf"), later_ggml_types)
    write(os.path.join(out, "q4_1.gguf"), q4_1)


if __name__ == "__main__":
    main()

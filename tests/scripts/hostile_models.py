#!/usr/bin/env python3
"""Write a directory of hostile model files, each what a file found in the
wild, a broken download or an attacker could hand kiln, next to a few that
are fine.

GGUF: truncated headers, a tensor or string count no file could hold, a
string of 2^63 bytes, arrays of arrays a hundred thousand deep, a tensor
past the end of the file, two tensors over the same bytes, dimensions whose
product overflows, a zero-sized tensor, an unknown type, an alignment of 0
and of 2^31, a layer count of 2^31, control characters in tensor names.

safetensors: a header length of 2^63 and one past the end of the file, a
header of 10 MB of integers, JSON nested a hundred thousand deep,
data_offsets past the end, reversed and overlapping, dimensions whose
product overflows, a negative dimension, zero-sized tensors and gpt-oss
MXFP4 pairs with a leading dimension of 0, control characters and a NUL in
names, a duplicate name, an unknown dtype.

Directories (model + config.json, or a sharded set): a FIFO as the model,
as config.json and as a shard; dangling symbolic links in each place; a
shard missing, one named outside the directory, an index nested a hundred
thousand deep; a config.json that is not an object, one whose layer count
is 2^31; an empty directory; compressed-tensors configs with a hundred
thousand patterns, with patterns that are no regular expression, an int4
W4A16 checkpoint (read), an int3 one kiln has no format for and an int4 one
whose group_size does not divide K. At the top: a FIFO, a dangling link and
a directory named like model files.

Usage: hostile_models.py OUTDIR (new or empty). Prints one line per entry: its name, then
what `kiln inspect`, `kiln plan` and `kiln compile --offline` (with an
empty cache) must do with it: "refused" (exit 1, the message names the
file), "ok" (exit 0) or "offline" (exit 1, the kernels are in no cache: the
file is fine). hostile_cli.py runs them.
"""
import json
import os
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from safetensors.numpy import save_file

DEEP = 100_000
D, F = 64, 128

# --------------------------------------------------------------------- GGUF

U32, STRING, ARRAY, U64 = 4, 8, 9, 10
GGML_F32, GGML_Q8_0 = 0, 8


def gg_str(s):
    b = s if isinstance(s, bytes) else s.encode()
    return struct.pack("<Q", len(b)) + b


def gg_kv_str(key, value):
    return gg_str(key) + struct.pack("<I", STRING) + gg_str(value)


def gg_kv_u32(key, value):
    return gg_str(key) + struct.pack("<II", U32, value)


def gg_tensor(name, ne, ttype, offset):
    return (gg_str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
            + struct.pack("<IQ", ttype, offset))


LLAMA_KV = [gg_kv_str("general.architecture", "llama"), gg_kv_u32("llama.block_count", 1),
            gg_kv_u32("llama.embedding_length", D), gg_kv_u32("llama.feed_forward_length", F),
            gg_kv_u32("llama.attention.head_count", 4), gg_kv_u32("llama.context_length", 128)]


def gg_file(kvs, tensors, data=b"", n_tensors=None, n_kv=None, align=32):
    """A GGUF v3 file written field by field, so that any field can lie."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors) if n_tensors is None else n_tensors,
                                len(kvs) if n_kv is None else n_kv)
    out += b"".join(kvs) + b"".join(tensors)
    out += b"\0" * (-len(out) % align)
    return out + data


def llama_tensors(names=None, ne=None, ttype=GGML_F32, offsets=None):
    """The FFN of one llama layer: F32 norm, F32 gate/up/down, back to back."""
    roles = [("blk.0.ffn_norm.weight", [D]), ("blk.0.ffn_gate.weight", [D, F]),
             ("blk.0.ffn_up.weight", [D, F]), ("blk.0.ffn_down.weight", [F, D])]
    tensors, off = [], 0
    for i, (name, shape) in enumerate(roles):
        shape = (ne or {}).get(name, shape)
        o = (offsets or {}).get(name, off)
        tensors.append(gg_tensor((names or {}).get(name, name), shape, ttype, o))
        off += 4 * int(np.prod(roles[i][1]))
        off += -off % 32
    return tensors, b"\0" * off


def gguf_valid(path):
    rng = np.random.default_rng(23)
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_embedding_length(D)
    w.add_feed_forward_length(F)
    w.add_head_count(4)
    w.add_context_length(128)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(D, np.float32))
    for role, shape in (("ffn_gate", (F, D)), ("ffn_up", (F, D)), ("ffn_down", (D, F))):
        x = rng.standard_normal(shape).astype(np.float32)
        w.add_tensor(f"blk.0.{role}.weight", gguf.quants.quantize(x, T.Q8_0), raw_dtype=T.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gguf_files():
    """name -> bytes of every hostile GGUF file."""
    t, data = llama_tensors()
    files = {}
    files["gguf_empty"] = b""
    files["gguf_magic_only"] = b"GGUF"
    files["gguf_truncated_header"] = gg_file(LLAMA_KV, t, data)[:40]
    files["gguf_tensor_count_2_63"] = gg_file(LLAMA_KV, t, data, n_tensors=2**63)
    files["gguf_kv_count_2_63"] = gg_file(LLAMA_KV, t, data, n_kv=2**63)
    files["gguf_string_2_63"] = gg_file(
        [gg_str("general.name") + struct.pack("<IQ", STRING, 2**63) + b"x" * 16], [], b"")
    # An array of one array of one array ...: a reader that recurses runs out of stack.
    deep = gg_str("t.deep") + struct.pack("<I", ARRAY) + struct.pack("<IQ", ARRAY, 1) * DEEP
    files["gguf_arrays_100000_deep"] = gg_file([deep + struct.pack("<IQ", U32, 1) + b"\0" * 4], [])
    files["gguf_tensor_past_end"] = gg_file(
        LLAMA_KV, llama_tensors(offsets={"blk.0.ffn_down.weight": 1 << 40})[0], data)
    files["gguf_tensors_overlap"] = gg_file(
        LLAMA_KV, llama_tensors(offsets={"blk.0.ffn_up.weight": 0})[0], data)
    files["gguf_dims_overflow"] = gg_file(
        LLAMA_KV, llama_tensors(ne={"blk.0.ffn_gate.weight": [2**32, 2**32, 2**33]})[0], data)
    files["gguf_dim_2_63"] = gg_file(
        LLAMA_KV, llama_tensors(ne={"blk.0.ffn_gate.weight": [2**63, 1]})[0], data)
    files["gguf_n_dims_1000"] = gg_file(LLAMA_KV, [gg_tensor("t", [1] * 1000, GGML_F32, 0)],
                                        b"\0" * 32)
    files["gguf_zero_sized_tensor"] = gg_file(
        LLAMA_KV, llama_tensors(ne={"blk.0.ffn_gate.weight": [D, 0]})[0], data)
    files["gguf_unknown_type"] = gg_file(LLAMA_KV, llama_tensors(ttype=1000)[0], data)
    files["gguf_alignment_0"] = gg_file(
        LLAMA_KV + [gg_kv_u32("general.alignment", 0)], t, data)
    files["gguf_alignment_2_31"] = gg_file(
        LLAMA_KV + [gg_kv_u32("general.alignment", 2**31)], t, data)
    layers = gg_kv_u32("llama.block_count", 2**31)
    files["gguf_block_count_2_31"] = gg_file(
        [layers if b"block_count" in kv else kv for kv in LLAMA_KV], t, data)
    escape = "blk.0.\x1b[2J\x1b]0;pwned\x07\r\n\b.w"
    files["gguf_control_chars_in_names"] = gg_file(
        LLAMA_KV, llama_tensors(names={"blk.0.ffn_gate.weight": escape})[0], data)
    files["gguf_control_chars_in_metadata"] = gg_file(
        LLAMA_KV + [gg_kv_str("general.name", "\x1b[31mred\x1b[0m\r\x00tail")], t, data)
    files["gguf_key_2_63"] = gg_file([struct.pack("<Q", 2**63) + b"general"], [])
    files["gguf_array_count_2_63"] = gg_file(
        [gg_str("t.a") + struct.pack("<IIQ", ARRAY, U64, 2**63)], [])
    # A download cut short: the header whole, the last tensor's bytes not.
    whole = gg_file(LLAMA_KV, t, data)
    files["gguf_cut_short"] = whole[:len(whole) - 1000]
    return files


# -------------------------------------------------------------- safetensors


def st_bytes(header, data=b"", raw_header=None, length=None):
    h = raw_header if raw_header is not None else json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h) if length is None else length) + h + data


def st_tensor(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1, "hidden_size": D,
                "intermediate_size": F, "num_attention_heads": 4, "num_key_value_heads": 4,
                "vocab_size": 32, "max_position_embeddings": 128, "rms_norm_eps": 1e-5}
GPTOSS_CONFIG = {"architectures": ["GptOssForCausalLM"], "num_hidden_layers": 1, "hidden_size": D,
                 "intermediate_size": F, "num_attention_heads": 4, "num_key_value_heads": 4,
                 "num_local_experts": 2, "vocab_size": 32, "max_position_embeddings": 128,
                 "quantization_config": {"quant_method": "mxfp4"}}


def llama_arrays():
    rng = np.random.default_rng(29)
    p = "model.layers.0."
    return {p + "post_attention_layernorm.weight": np.ones(D, np.float32),
            p + "mlp.gate_proj.weight": rng.standard_normal((F, D)).astype(np.float32),
            p + "mlp.up_proj.weight": rng.standard_normal((F, D)).astype(np.float32),
            p + "mlp.down_proj.weight": rng.standard_normal((D, F)).astype(np.float32)}


def safetensors_files():
    files = {}
    a = st_tensor("F32", [4], 0, 16)
    files["st_empty"] = b""
    files["st_header_length_2_63"] = st_bytes({"a": a}, b"\0" * 16, length=2**63)
    files["st_header_past_end"] = st_bytes({"a": a}, b"\0" * 16, length=1 << 20)
    ints = b"[" + b",".join([b"1234567"] * (10 * 1000 * 1000 // 8)) + b"]"
    files["st_header_10mb_of_integers"] = st_bytes(None, b"", raw_header=ints)
    shape = b",".join([b"1"] * 5_000_000)
    files["st_shape_of_10mb_integers"] = st_bytes(
        None, b"\0" * 4,
        raw_header=b'{"a":{"dtype":"F32","shape":[' + shape + b'],"data_offsets":[0,4]}}')
    deep = b'{"a":' * DEEP + b"1" + b"}" * DEEP
    files["st_json_100000_deep"] = st_bytes(None, b"", raw_header=deep)
    files["st_offsets_past_end"] = st_bytes({"a": st_tensor("F32", [4], 0, 1 << 40)}, b"\0" * 16)
    files["st_offsets_reversed"] = st_bytes({"a": st_tensor("F32", [1], 8, 4)}, b"\0" * 16)
    files["st_offsets_overlap"] = st_bytes(
        {"a": st_tensor("F32", [4], 0, 16), "b": st_tensor("F32", [4], 8, 24)}, b"\0" * 24)
    files["st_dims_overflow"] = st_bytes({"a": st_tensor("F32", [2**32] * 3, 0, 4)}, b"\0" * 4)
    files["st_dim_2_64"] = st_bytes({"a": st_tensor("F32", [2**64, 1], 0, 4)}, b"\0" * 4)
    files["st_negative_dim"] = st_bytes({"a": st_tensor("F32", [-1, 4], 0, 16)}, b"\0" * 16)
    files["st_unknown_dtype"] = st_bytes({"a": st_tensor("F7_E9M9", [4], 0, 4)}, b"\0" * 4)
    files["st_control_chars_in_names"] = st_bytes(
        {"\x1b[2J\x1b]0;pwned\x07\r\n": a, "\x7f\b\x1b[1A": st_tensor("F32", [4], 16, 32)},
        b"\0" * 32)
    files["st_nul_in_name"] = st_bytes({"a\x00b": a}, b"\0" * 16)
    files["st_duplicate_names"] = st_bytes(
        None, b"\0" * 32, raw_header=b'{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},'
        b'"a":{"dtype":"F32","shape":[4],"data_offsets":[16,32]}}')
    files["st_header_not_an_object"] = st_bytes(None, b"", raw_header=b"[1,2,3]")
    files["st_header_not_json"] = st_bytes(None, b"", raw_header=b"\xff\xfe{not json")
    whole = st_bytes({"a": st_tensor("F32", [4, 64], 0, 1024)}, b"\0" * 1024)
    files["st_cut_short"] = whole[:len(whole) - 100]
    files["st_zero_sized_tensors"] = st_bytes(
        {"a": st_tensor("F32", [0, 16], 0, 0), "b": st_tensor("BF16", [16, 0], 0, 0),
         "c": st_tensor("F8_E4M3", [0], 0, 0)})
    return files


def gptoss_zero_experts(d):
    """A gpt-oss MXFP4 checkpoint whose expert pairs have a leading dimension of 0."""
    p = "model.layers.0.mlp.experts."
    header = {p + "gate_up_proj_blocks": st_tensor("U8", [0, 2 * F, D // 32, 16], 0, 0),
              p + "gate_up_proj_scales": st_tensor("U8", [0, 2 * F, D // 32], 0, 0),
              p + "down_proj_blocks": st_tensor("U8", [0, D, F // 32, 16], 0, 0),
              p + "down_proj_scales": st_tensor("U8", [0, D, F // 32], 0, 0),
              "model.layers.0.post_attention_layernorm.weight": st_tensor("F32", [D], 0, 4 * D)}
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(st_bytes(header, b"\0" * (4 * D)))
    write_json(os.path.join(d, "config.json"), GPTOSS_CONFIG)


CT_W4A16 = {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                "group_size": 32, "dynamic": False}, "input_activations": None}}}


def ct_packed(d, bits=4, group_size=32):
    """compressed-tensors pack-quantized int groups in int32 words: int4 in
    groups of 32 is read and planned; int3 is listed, and a graph on it
    refused naming the field; a group_size that does not divide K is
    refused naming the tensor."""
    arrays = llama_arrays()
    p = "model.layers.0.mlp."
    for proj in ("gate_proj", "up_proj", "down_proj"):
        w = arrays.pop(p + proj + ".weight")
        words = -(-w.shape[1] * bits // 32)
        arrays[p + proj + ".weight_packed"] = np.zeros((w.shape[0], words), np.int32)
        arrays[p + proj + ".weight_scale"] = np.ones((w.shape[0], w.shape[1] // 32), np.float16)
        arrays[p + proj + ".weight_shape"] = np.array(w.shape, np.int64)
    save_file(arrays, os.path.join(d, "model.safetensors"))
    weights = dict(CT_W4A16["config_groups"]["group_0"]["weights"], num_bits=bits,
                   group_size=group_size)
    cfg = dict(CT_W4A16, config_groups={"group_0": {"targets": ["Linear"], "weights": weights,
                                                    "input_activations": None}})
    write_json(os.path.join(d, "config.json"), dict(LLAMA_CONFIG, quantization_config=cfg))


def fp8_static(scale=0.5, shape=(), drop=False):
    """A function filling a directory with a Llama FFN layer in FP8 with
    static activations (activation_scheme static), each linear's
    input_scale an F32 of the given shape holding scale (missing from up_proj
    with drop)."""
    def fill(d):
        header, blobs, at = {}, [], 0

        def put(name, dtype, shp, raw):
            nonlocal at
            header[name] = st_tensor(dtype, list(shp), at, at + len(raw))
            blobs.append(raw)
            at += len(raw)
        put("model.layers.0.post_attention_layernorm.weight", "F32", (D,), np.ones(D, np.float32).tobytes())
        for proj, (n, k) in (("gate_proj", (F, D)), ("up_proj", (F, D)), ("down_proj", (D, F))):
            p = "model.layers.0.mlp." + proj
            put(p + ".weight", "F8_E4M3", (n, k), bytes(n * k))
            put(p + ".weight_scale", "F32", (), np.float32(0.01).tobytes())
            if not (drop and proj == "up_proj"):
                put(p + ".input_scale", "F32", shape,
                    np.full(int(np.prod(shape)), scale, np.float32).tobytes())
        with open(os.path.join(d, "model.safetensors"), "wb") as f:
            f.write(st_bytes(header, b"".join(blobs)))
        write_json(os.path.join(d, "config.json"), dict(LLAMA_CONFIG, quantization_config={
            "quant_method": "fp8", "activation_scheme": "static"}))
    return fill


# -------------------------------------------------------------- directories


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)


def hf_dir(d, config=LLAMA_CONFIG):
    """A Llama FFN layer in F32: model.safetensors and config.json."""
    save_file(llama_arrays(), os.path.join(d, "model.safetensors"))
    write_json(os.path.join(d, "config.json"), config)


def inside(d, name):
    """The path of name in d, which must stay in d: a shard the index names
    outside its directory is never written, only named."""
    path = os.path.join(d, name)
    real, root = os.path.realpath(path), os.path.realpath(d)
    if os.path.basename(name) != name or os.path.dirname(real) != root:
        raise ValueError(f"{name!r} is not a file name in {d}")
    return path


SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
INDEX = "model.safetensors.index.json"


def sharded_dir(d, shards=SHARDS, write=(True, True)):
    """The HF model split in two shards (the ones write says) and an index."""
    arrays = llama_arrays()
    names = sorted(arrays)
    weight_map = {}
    for shard, half, w in zip(shards, (names[:2], names[2:]), write):
        weight_map.update({n: shard for n in half})
        if w:
            save_file({n: arrays[n] for n in half}, inside(d, shard))
    write_json(os.path.join(d, "config.json"), LLAMA_CONFIG)
    write_json(os.path.join(d, INDEX), {"weight_map": weight_map})


def fifo(path):
    os.remove(path)
    os.mkfifo(path)


def dangling(path):
    os.remove(path)
    os.symlink("nowhere/at/all", path)


def holding(data):
    def put(path):
        with open(path, "wb") as f:
            f.write(data)
    return put


def then(make, name, replace, **kw):
    """A directory make(d, **kw) fills, with its file name then replaced by
    replace(path)."""
    def fill(d):
        make(d, **kw)
        replace(os.path.join(d, name))
    return fill


def directories():
    """name -> a function that fills a new directory."""
    deep = b'{"a":' * DEEP + b"1" + b"}" * DEEP
    deep_index = b'{"weight_map":' + b"[" * DEEP + b"]" * DEEP + b"}"
    other = {"other": np.ones(4, np.float32)}
    outside = ("../../../../../../etc/passwd", "/etc/passwd")
    return {
        "dir_fifo_model": then(hf_dir, "model.safetensors", fifo),
        "dir_fifo_config": then(hf_dir, "config.json", fifo),
        "dir_fifo_shard": then(sharded_dir, SHARDS[1], fifo),
        "dir_fifo_index": then(sharded_dir, INDEX, fifo),
        "dir_dangling_model": then(hf_dir, "model.safetensors", dangling),
        "dir_dangling_config": then(hf_dir, "config.json", dangling),
        "dir_dangling_shard": then(sharded_dir, SHARDS[0], dangling),
        "dir_missing_shard": lambda d: sharded_dir(d, write=(True, False)),
        "dir_shard_lacks_tensor": then(sharded_dir, SHARDS[1], lambda p: save_file(other, p)),
        # The index names a file outside the directory, which is never written.
        "dir_shard_outside": lambda d: sharded_dir(d, (SHARDS[0], outside[0]), (True, False)),
        "dir_shard_absolute": lambda d: sharded_dir(d, (SHARDS[0], outside[1]), (True, False)),
        "dir_index_100000_deep": then(sharded_dir, INDEX, holding(deep_index)),
        "dir_index_not_object": then(sharded_dir, INDEX, holding(b"42")),
        "dir_config_not_object": then(hf_dir, "config.json", holding(b'["LlamaForCausalLM"]')),
        "dir_config_100000_deep": then(hf_dir, "config.json", holding(deep)),
        "dir_config_layers_2_31": lambda d: hf_dir(d, dict(LLAMA_CONFIG, num_hidden_layers=2**31)),
        "dir_config_huge_width": lambda d: hf_dir(d, dict(LLAMA_CONFIG, hidden_size=2**62,
                                                          intermediate_size=2**62)),
        "dir_gptoss_zero_experts": gptoss_zero_experts,
        "dir_ct_w4a16_packed": ct_packed,
        "dir_ct_w3a16_packed": lambda d: ct_packed(d, bits=3),
        "dir_ct_w4a16_group_40": lambda d: ct_packed(d, group_size=40),
        "dir_ct_pattern_flood": lambda d: hf_dir(d, dict(LLAMA_CONFIG, quantization_config=dict(
            CT_W4A16, ignore=["re:(a*)*b"] * 100000))),
        "dir_ct_bad_regex": lambda d: hf_dir(d, dict(LLAMA_CONFIG, quantization_config=dict(
            CT_W4A16, config_groups={"g": {"targets": ["re:((("], "weights": None}},
            ignore=["re:[", "re:\\"]))),
        "dir_fp8_static": fp8_static(),
        "dir_fp8_static_nan_scale": fp8_static(float("nan")),
        "dir_fp8_static_inf_scale": fp8_static(float("inf")),
        "dir_fp8_static_huge_scale": fp8_static(3.4e38),
        "dir_fp8_static_negative_scale": fp8_static(-0.5),
        "dir_fp8_static_zero_scale": fp8_static(0.0),
        "dir_fp8_static_scale_per_channel": fp8_static(shape=(4,)),
        "dir_fp8_static_scale_missing": fp8_static(drop=True),
        "dir_empty": lambda d: None,
        "dir_fine": hf_dir,
        "dir_fine_sharded": sharded_dir,
    }


# ------------------------------------------------------------- the table

R, OK, OFF = "refused", "ok", "offline"


def expectations():
    """name -> (inspect, plan, compile --offline)."""
    e = {}
    for name in gguf_files():
        e[name] = (R, R, R)
    for name in safetensors_files():
        e[name] = (R, R, R)
    for name in directories():
        e[name] = (R, R, R)
    e.update({
        # Names and values are data: the reader keeps them; the CLI escapes them when it prints.
        "gguf_control_chars_in_names": (OK, R, R),  # no blk.0.ffn_gate.weight: named as missing
        "gguf_control_chars_in_metadata": (OK, OK, OFF),
        "st_control_chars_in_names": (OK, R, R),    # no layers: the plan has nothing to build
        "st_unknown_dtype": (OK, R, R),             # listed as unsupported; nothing to build
        # A zero-sized safetensors tensor describes itself (a layer built on
        # one is refused); GGUF refuses a dimension of 0 outright.
        "st_zero_sized_tensors": (OK, R, R),
        "gguf_block_count_2_31": (OK, R, R),
        "dir_config_layers_2_31": (OK, R, R),
        "dir_config_huge_width": (OK, R, R),
        "dir_gptoss_zero_experts": (OK, R, R),
        "dir_ct_w4a16_packed": (OK, OK, OFF),
        "dir_ct_w3a16_packed": (OK, R, R),
        "dir_ct_bad_regex": (OK, OK, OFF),  # patterns that do not compile match nothing
        "gguf_valid": (OK, OK, OFF),
        "dir_fine": (OK, OK, OFF),
        "dir_fp8_static": (OK, OK, OFF),
        "dir_fine_sharded": (OK, OK, OFF),
        "fifo.gguf": (R, R, R),
        "dangling.safetensors": (R, R, R),
        "directory.gguf": (R, R, R),
    })
    return e


def make(out):
    """Write every entry under out, a new or empty directory (what a run
    left, FIFOs and links, is never written through); returns
    [(path, (inspect, plan, compile))]."""
    os.makedirs(out, exist_ok=True)
    if os.listdir(out):
        sys.exit(f"hostile_models.py: {out} is not empty; it writes into a new or empty directory")
    exp = expectations()
    made = []

    def put(name, ext, data):
        path = os.path.join(out, name + ext)
        with open(path, "wb") as f:
            f.write(data)
        made.append((path, exp[name]))

    for name, data in gguf_files().items():
        put(name, ".gguf", data)
    for name, data in safetensors_files().items():
        put(name, ".safetensors", data)
    path = os.path.join(out, "gguf_valid.gguf")
    gguf_valid(path)
    made.append((path, exp["gguf_valid"]))
    for name, fill in directories().items():
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        fill(d)
        made.append((d, exp[name]))
    os.mkfifo(os.path.join(out, "fifo.gguf"))
    os.symlink("nowhere/at/all", os.path.join(out, "dangling.safetensors"))
    os.makedirs(os.path.join(out, "directory.gguf"), exist_ok=True)
    for name in ("fifo.gguf", "dangling.safetensors", "directory.gguf"):
        made.append((os.path.join(out, name), exp[name]))
    return made


def main():
    if len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        sys.exit("usage: hostile_models.py OUTDIR (new or empty); --help says more")
    for path, (inspect, plan, compile_) in make(sys.argv[1]):
        print(f"{os.path.basename(path)} {inspect} {plan} {compile_}")


if __name__ == "__main__":
    main()

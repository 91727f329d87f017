"""Write a quantized copy of a BF16 safetensors checkpoint, for the load and
end-to-end benchmarks' FP8 and 4-bit variants: every 2-D *_proj.weight of
the decoder layers quantized, everything else copied as it is, the shards
and their index kept, config.json given the quantization_config kiln and
transformers read.

  fp8    per tensor: weight F8_E4M3 = rne(w / s), weight_scale F32 s =
         amax / 448; quantization_config {quant_method: fp8, activation_scheme:
         dynamic}
  nvfp4  ModelOpt: weight U8 [N, K/2] (E2M1 pairs, the even value in the low
         nibble), weight_scale F8_E4M3 [N, K/16] (block amax / 6 over the
         global scale), weight_scale_2 F32 (amax / (6 · 448));
         quantization_config {quant_method: modelopt, quant_algo: NVFP4,
         group_size: 16}

usage: python3 bench/quantize_checkpoint.py SRC DST --format fp8|nvfp4
Needs numpy only; reads and writes safetensors itself (BF16 and FP8 have no
numpy dtype)."""
import argparse
import json
import os
import shutil
import struct
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)


def read_safetensors(path):
    """{name: (dtype, shape, bytes)} in file order."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", None)
    out = {}
    for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        a, b = t["data_offsets"]
        out[name] = (t["dtype"], t["shape"], data[a:b])
    return out, meta


def write_safetensors(path, tensors, meta=None):
    header, at = {}, 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + len(raw)]}
        at += len(raw)
    if meta:
        header["__metadata__"] = meta
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, raw in tensors.values():
            f.write(raw)


def bf16_to_f32(raw, shape):
    u = np.frombuffer(raw, np.uint16).astype(np.uint32) << 16
    return u.view(np.float32).reshape(shape)


def f32_to_e4m3(x):
    """E4M3 (OCP, finite) codes of x, rounded to nearest even, saturating at
    448: a float32's mantissa rounded to 3 bits in its bits (round half to
    even), then its exponent rebased; below 2^-6, steps of 2^-9."""
    x = np.asarray(x, np.float32)
    a = np.minimum(np.abs(x), np.float32(448))
    u = a.view(np.uint32)
    r = (u + np.uint32(0x7FFFF) + ((u >> np.uint32(20)) & np.uint32(1))) & np.uint32(0xFFF00000)
    e = (r >> np.uint32(23)).astype(np.int32) - 127
    normal = ((e + 7) << 3) | ((r >> np.uint32(20)) & np.uint32(7)).astype(np.int32)
    code = np.where(a < np.float32(2.0 ** -6), np.rint(a * np.float32(512)).astype(np.int32),
                    normal)
    return (code.astype(np.uint8) | (np.signbit(x).astype(np.uint8) << 7)).astype(np.uint8)


def e4m3_to_f32(code):
    code = np.asarray(code, np.uint8)
    e = (code >> 3) & 15
    m = (code & 7).astype(np.float32)
    v = np.where(e == 0, m * 2.0 ** -9, (1 + m / 8) * np.exp2(e.astype(np.float32) - 7))
    return np.where(code & 0x80, -v, v).astype(np.float32)


E4M3 = e4m3_to_f32(np.arange(0x7F, dtype=np.uint8))  # codes 0..126: 0 to 448


def quantize_fp8(w):
    amax = float(np.abs(w).max())
    s = np.float32(amax / 448 if amax > 0 else 1.0)
    return {"": ("F8_E4M3", w.shape, f32_to_e4m3(w / s).tobytes()),
            "_scale": ("F32", [], np.array(s, np.float32).tobytes())}


def quantize_nvfp4(w):
    n, k = w.shape
    if k % 16:
        raise SystemExit(f"quantize_checkpoint: K = {k} is not a multiple of 16")
    amax = float(np.abs(w).max())
    g = np.float32(amax / (6 * 448) if amax > 0 else 1.0)
    blocks = w.reshape(n, k // 16, 16)
    bmax = np.abs(blocks).max(axis=2)
    sc = f32_to_e4m3(bmax / 6 / g)
    s = e4m3_to_f32(sc) * g
    y = np.where(s[..., None] > 0, blocks / np.where(s > 0, s, 1)[..., None], 0)
    # the nearest E2M1 value, the lower one on a tie
    idx = np.searchsorted((E2M1[:-1] + E2M1[1:]) / 2, np.abs(y), side="left").astype(np.uint8)
    nib = (idx | (np.signbit(y).astype(np.uint8) << 3) * (idx > 0)).reshape(n, k)
    packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8)
    return {"": ("U8", [n, k // 2], packed.tobytes()),
            "_scale": ("F8_E4M3", [n, k // 16], sc.tobytes()),
            "_scale_2": ("F32", [], np.array(g, np.float32).tobytes())}


def quantized(name):
    return (name.startswith("model.layers.") and name.endswith("_proj.weight"))


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", help="a BF16 checkpoint directory (config.json, *.safetensors)")
    ap.add_argument("dst", help="the directory to write")
    ap.add_argument("--format", required=True, choices=["fp8", "nvfp4"])
    a = ap.parse_args(argv)
    if os.path.abspath(a.src) == os.path.abspath(a.dst):
        ap.error("dst must not be src")
    shards = sorted(f for f in os.listdir(a.src) if f.endswith(".safetensors"))
    if not shards or not os.path.isfile(os.path.join(a.src, "config.json")):
        ap.error(f"{a.src}: no config.json and .safetensors shards")
    os.makedirs(a.dst, exist_ok=True)
    quant = quantize_fp8 if a.format == "fp8" else quantize_nvfp4
    weight_map = {}
    for shard in shards:
        tensors, meta = read_safetensors(os.path.join(a.src, shard))
        for name, (dtype, shape, _) in tensors.items():
            if quantized(name) and len(shape) == 2 and dtype != "BF16":
                raise SystemExit(f"quantize_checkpoint: {name} is {dtype}, not BF16")
        # numpy leaves the GIL in its loops: the tensors of a shard in threads
        with ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:
            done = {name: pool.submit(lambda r, s: quant(bf16_to_f32(r, s)), raw, shape)
                    for name, (dtype, shape, raw) in tensors.items()
                    if quantized(name) and len(shape) == 2}
        out = {}
        for name, (dtype, shape, raw) in tensors.items():
            if name in done:
                base = name[:-len(".weight")]
                for suffix, t in done[name].result().items():
                    out[f"{base}.weight{suffix}"] = t
            else:
                out[name] = (dtype, shape, raw)
        write_safetensors(os.path.join(a.dst, shard), out, meta)
        weight_map.update({name: shard for name in out})
        print(f"quantize_checkpoint: {shard}", file=sys.stderr)
    index = os.path.join(a.src, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            idx = json.load(f)
        idx["weight_map"] = weight_map
        with open(os.path.join(a.dst, "model.safetensors.index.json"), "w") as f:
            json.dump(idx, f, indent=1)
    with open(os.path.join(a.src, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = (
        {"quant_method": "fp8", "activation_scheme": "dynamic"} if a.format == "fp8" else
        {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16})
    with open(os.path.join(a.dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    for extra in ("generation_config.json",):
        if os.path.isfile(os.path.join(a.src, extra)):
            shutil.copy(os.path.join(a.src, extra), a.dst)
    print(f"quantize_checkpoint: {a.dst}: {a.format}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""What the tests share: model writers, float64 references, skips."""
import json
import os
import struct

import numpy as np
import pytest

import kiln

D, F, LAYERS, EPS, VOCAB = 64, 128, 2, 1e-5, 32


def write_safetensors(path, tensors):
    """tensors: {name: float32 array}, written per the safetensors spec."""
    header, off, blobs = {}, 0, []
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a, np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_llama(d, rng):
    """A 2-layer Llama directory with F32 weights in d; returns {name: array}."""
    cfg = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": LAYERS,
           "hidden_size": D, "intermediate_size": F, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": VOCAB, "max_position_embeddings": 128,
           "rms_norm_eps": EPS}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    t = {}

    def mat(n, k):
        return (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)

    for l in range(LAYERS):
        p = f"model.layers.{l}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            t[p + norm + ".weight"] = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
        for role, (n, k) in (("self_attn.q_proj", (D, D)), ("self_attn.k_proj", (D // 2, D)),
                             ("self_attn.v_proj", (D // 2, D)), ("self_attn.o_proj", (D, D)),
                             ("mlp.gate_proj", (F, D)), ("mlp.up_proj", (F, D)),
                             ("mlp.down_proj", (D, F))):
            t[p + role + ".weight"] = mat(n, k)
    t["model.embed_tokens.weight"] = mat(VOCAB, D)
    t["model.norm.weight"] = np.ones(D, np.float32)
    t["lm_head.weight"] = mat(VOCAB, D)
    write_safetensors(os.path.join(d, "model.safetensors"), t)
    return t


def ffn_reference(x, w, layers=LAYERS, eps=EPS):
    """x + down(silu(gate(rms(x))) * up(rms(x))) per layer, in float64."""
    x = x.astype(np.float64)
    for l in range(layers):
        p = f"model.layers.{l}."
        h = x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps)
        h = h * w[p + "post_attention_layernorm.weight"]
        g = h @ w[p + "mlp.gate_proj.weight"].T.astype(np.float64)
        u = h @ w[p + "mlp.up_proj.weight"].T.astype(np.float64)
        x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T.astype(np.float64)
    return x


def nvrtc_or_skip(e: "kiln.Error"):
    """Skip a compile test on a machine without NVRTC; re-raise anything else."""
    if e.status == kiln.Status.ERR_NOT_FOUND and "NVRTC" in e.message:
        pytest.skip(f"no NVRTC: {e.message}")
    raise e


def gpu_or_skip() -> None:
    """Skip, saying why, on a machine without a GPU or driver."""
    try:
        kiln.Target.live(0)
    except kiln.Error as e:
        pytest.skip(f"no GPU: {e.message}")

"""Write a Llama-3-8B-shaped checkpoint with random weights, as transformers
writes it (config.json, model-0000N-of-0000M.safetensors, index), for the
load and end-to-end benchmarks: hidden 4096, FFN 14336, 8 KV heads, BF16.

usage: python3 bench/make_checkpoint.py DIR [--layers N] [--shard-size 5GB]
Needs torch and transformers; uses the GPU when torch sees one."""
import argparse
import sys


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="the directory to write")
    ap.add_argument("--layers", type=int, default=32, help="decoder layers (32)")
    ap.add_argument("--shard-size", default="5GB", help="largest shard (5GB)")
    a = ap.parse_args(argv)
    if a.layers < 1:
        ap.error("--layers must be at least 1")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=a.layers,
                      num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                      max_position_embeddings=4096, torch_dtype="bfloat16")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device(dev):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(a.dir, max_shard_size=a.shard_size)
    n = sum(p.numel() for p in model.parameters())
    print(f"make_checkpoint: {a.dir}: {a.layers} layers, {n * 2 / 1e9:.2f} GB of BF16 weights")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

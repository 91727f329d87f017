#!/usr/bin/env python3
"""Greedy generation with a Hugging Face Llama-family model whose decoder
linears run on kiln.

Every q/k/v/o projection and gate/up/down projection of the decoder layers
becomes a kiln.Linear (a kiln session each; their kernels come from the
caches, shared by every layer of one shape), and transformers' own
``generate`` runs greedy decoding through them. The same prompts run on
transformers' BF16 linears first; the script then checks that kiln's tokens
equal transformers' for every step and prompt and that the logits agree
within a tolerance, and prints tokens/s for both.

For a quantized format (``--format fp8``, ``q8_0``, ...) the reference is
transformers with each weight replaced by its dequantized kiln copy, so
both sides compute with the same weight values and differ only in how they
compute.

    python3 examples/transformers_generate.py --model DIR|FILE.gguf [--format bf16]
    python3 examples/transformers_generate.py --make-trained DIR  # a small model to try

Token ids are generated at random (no tokenizer is needed). Needs torch,
transformers and a GPU (``--device cpu`` runs the linears on kiln's CPU
executor and the rest of the model on torch's CPU, slowly).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Dict, List, Tuple

import numpy as np
import torch
import transformers

import kiln

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def make_trained(path: str, seed: int, device: torch.device, steps: int = 300) -> None:
    """A small Llama written by transformers as safetensors, trained here for
    a few hundred steps on a synthetic language (each token followed by its
    image under a fixed random permutation), so that, as with a trained
    model, its greedy choices are decided by a margin rather than by the
    rounding of near-ties, as they are in a model of random weights."""
    config = transformers.LlamaConfig(
        hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=4, vocab_size=512, max_position_embeddings=1024,
        tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).to(device)
    g = torch.Generator().manual_seed(seed)
    succ = torch.randperm(config.vocab_size, generator=g).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    for step in range(steps):
        x = torch.randint(0, config.vocab_size, (32, 1), generator=g).to(device)
        seq = [x]
        for _ in range(63):
            seq.append(succ[seq[-1]])
        batch = torch.cat(seq, dim=1)
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"training the model: step {step}, loss {loss.item():.4f}", flush=True)
    model.to(torch.bfloat16).save_pretrained(path, safe_serialization=True)


def decoder_linears(model: Any) -> List[Tuple[Any, str, torch.nn.Linear]]:
    """(parent module, attribute, nn.Linear) for every linear kiln takes."""
    out = []
    for layer in model.model.layers:
        for dotted in LINEARS:
            parent_name, attr = dotted.split(".")
            parent = getattr(layer, parent_name)
            out.append((parent, attr, getattr(parent, attr)))
    return out


def dequantize_in_place(model: Any, fmt: str) -> None:
    """Each decoder linear's weight replaced by its kiln-quantized copy, dequantized."""
    for _, _, lin in decoder_linears(model):
        w = lin.weight.detach().float().cpu().numpy()
        dq = kiln.quantize(w, fmt).dequantize()
        lin.weight.data = torch.from_numpy(dq).to(lin.weight.device, lin.weight.dtype)


def swap_in_kiln(model: Any, fmt: str, session_options: Dict[str, Any]) -> int:
    """Every decoder linear replaced by a kiln.Linear; the count."""
    n = 0
    for parent, attr, lin in decoder_linears(model):
        setattr(parent, attr, kiln.Linear.from_linear(lin, format=fmt, **session_options))
        n += 1
    return n


def generate(model: Any, ids: torch.Tensor, steps: int) -> Tuple[torch.Tensor, torch.Tensor, float]:
    """(new tokens [B, steps], logits [B, steps, vocab] in f32, seconds).
    A two-step generation first, untimed, so that neither side's time
    includes its first calls' one-time costs (library loads, allocator
    growth, kernel selection)."""
    sync = torch.cuda.synchronize if ids.is_cuda else (lambda: None)

    def run(n: int) -> Any:
        with torch.inference_mode():
            return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                  min_new_tokens=n, do_sample=False, num_beams=1,
                                  output_logits=True, return_dict_in_generate=True,
                                  pad_token_id=0, eos_token_id=None)

    run(2)
    sync()
    t0 = time.perf_counter()
    out = run(steps)
    sync()
    seconds = time.perf_counter() - t0
    logits = torch.stack([s.float() for s in out.logits], dim=1)
    return out.sequences[:, ids.shape[1]:], logits, seconds


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a Hugging Face Llama-family checkpoint folder, or a GGUF "
                    "file transformers reads (it dequantizes the weights)")
    ap.add_argument("--make-trained", metavar="DIR",
                    help="train a small Llama on a synthetic language for a few seconds, "
                    "write it to DIR and use it")
    ap.add_argument("--format", default="bf16",
                    help="kiln format for the linears' weights (default bf16; see kiln.formats())")
    ap.add_argument("--prompts", type=int, default=8, help="prompts, generated together")
    ap.add_argument("--prompt-len", type=int, default=16, help="tokens in each prompt")
    ap.add_argument("--steps", type=int, default=32, help="new tokens to generate and compare")
    ap.add_argument("--tolerance", type=float, default=0.03,
                    help="largest |logit difference| / largest |logit| allowed (default 0.03)")
    ap.add_argument("--device", default="cuda:0", help="cuda:N (default) or cpu")
    ap.add_argument("--cache", help="kiln's writable kernel cache (default: kiln's own)")
    ap.add_argument("--shipped", action="append", default=[],
                    help="a shipped kernel cache to read first (repeatable)")
    ap.add_argument("--offline", action="store_true",
                    help="never compile: a kernel no cache holds is an error")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if bool(args.model) == bool(args.make_trained):
        ap.error("give --model PATH or --make-trained DIR")
    device = torch.device(args.device)
    path = args.model
    if args.make_trained:
        make_trained(args.make_trained, args.seed, device)
        path = args.make_trained

    if path.endswith(".gguf"):  # transformers dequantizes a GGUF file's weights
        folder, name = os.path.split(os.path.abspath(path))
        extra = {}
        if hasattr(transformers, "GgufConfig"):  # plain linears, not its packed ones
            extra["quantization_config"] = transformers.GgufConfig(dequantize=True)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                                  dtype=torch.bfloat16, **extra)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    model.to(device).eval()
    if args.format != "bf16":
        dequantize_in_place(model, args.format)
    g = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(1, model.config.vocab_size, (args.prompts, args.prompt_len),
                        generator=g).to(device)

    ref_tokens, ref_logits, ref_s = generate(model, ids, args.steps)

    largest = args.prompts * (args.prompt_len + args.steps)
    opts: Dict[str, Any] = dict(device=str(device), cache=args.cache, shipped=args.shipped,
                                offline=args.offline,
                                capture=[1, 2, 4, 8, 16, 32, 64, 128, 256],
                                max_tokens=max(256, largest))
    t0 = time.perf_counter()
    n = swap_in_kiln(model, args.format, opts)
    setup_s = time.perf_counter() - t0
    where = model.model.layers[0].mlp.down_proj.session.device
    print(f"kiln: {n} linears in {args.format} on {where}, sessions made in {setup_s:.1f} s")

    kiln_tokens, kiln_logits, kiln_s = generate(model, ids, args.steps)

    new = args.prompts * args.steps
    print(f"transformers: {new / ref_s:8.1f} tokens/s ({args.prompts} prompts x "
          f"{args.steps} steps in {ref_s:.2f} s)")
    print(f"kiln:         {new / kiln_s:8.1f} tokens/s ({kiln_s:.2f} s), "
          f"{ref_s / kiln_s:.2f}x transformers'")

    ok = True
    same = (kiln_tokens == ref_tokens).cpu().numpy()
    for p in range(args.prompts):
        if not same[p].all():
            first = int(np.argmin(same[p]))
            print(f"prompt {p}: tokens differ from step {first} "
                  f"(transformers {int(ref_tokens[p, first])}, kiln {int(kiln_tokens[p, first])})")
            ok = False
    # logits are comparable while both sides have generated the same tokens
    agree = np.cumprod(same, axis=1).astype(bool)
    diff = (kiln_logits - ref_logits).abs().amax(dim=-1).cpu().numpy()
    scale = ref_logits.abs().amax().item()
    worst = float(diff[agree].max()) / scale if agree.any() else float("inf")
    print(f"logits: largest |kiln - transformers| = {worst:.4f} of the largest |logit| "
          f"(tolerance {args.tolerance})")
    if worst > args.tolerance:
        ok = False
    print("tokens: " + ("all equal" if same.all() else f"{int(same.sum())} of {same.size} equal"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

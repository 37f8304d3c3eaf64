#!/usr/bin/env python3
"""Convert a PoLar predictor checkpoint (PyTorch .pt, as the reference's
training writes it) into the safetensors file polar loads.

    pip install torch safetensors
    python3 predictor/convert_checkpoint.py CHECKPOINT.pt OUT.safetensors [--heads 4]

The checkpoint may be a bare state dict or hold one under "model_state_dict",
"state_dict" or "model"; keys may carry a "module." prefix (DataParallel).
The frozen encoder's weights ("embedding_model.*") are dropped: polar runs the
encoder as a model of its own (--encoder). Everything else is kept under the
reference's names, as float32, with the head count in the metadata.
"""
import argparse
import sys

import torch
from safetensors.torch import save_file

NEEDED = ["q_proj.weight", "q_proj.bias", "layer_embedding.weight", "cross_attn.in_proj_weight",
          "cross_attn.in_proj_bias", "cross_attn.out_proj.weight", "cross_attn.out_proj.bias",
          "seg_head.weight", "seg_head.bias", "op_head.weight", "op_head.bias"]


def state_dict_of(ckpt):
    for key in ("model_state_dict", "state_dict", "model"):
        if isinstance(ckpt, dict) and isinstance(ckpt.get(key), dict):
            return ckpt[key]
    return ckpt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("out")
    ap.add_argument("--heads", type=int, default=4, help="attention heads of the predictor (the reference uses 4)")
    args = ap.parse_args()
    sd = state_dict_of(torch.load(args.checkpoint, map_location="cpu", weights_only=False))
    tensors, dropped = {}, 0
    for name, value in sd.items():
        name = name[len("module."):] if name.startswith("module.") else name
        if name.startswith("embedding_model."):
            dropped += 1
            continue
        if torch.is_tensor(value):
            tensors[name] = value.detach().to(torch.float32).contiguous()
    missing = [n for n in NEEDED if n not in tensors]
    if missing:
        sys.exit(f"{args.checkpoint}: not a PoLar predictor checkpoint, missing {', '.join(missing)}")
    D, d = tensors["layer_embedding.weight"].shape
    save_file(tensors, args.out, metadata={"nheads": str(args.heads), "num_layers": str(D), "d_model": str(d)})
    print(f"{args.out}: D {D}, d {d}, d_q {tensors['q_proj.weight'].shape[1]}, {len(tensors)} tensors "
          f"({sum(t.numel() for t in tensors.values()) / 1e6:.2f} M params); dropped {dropped} encoder tensors")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Golden outputs of the PoLar predictor network, from a PyTorch module built
as the reference describes it: q_proj Linear(d_q, 256), layer_embedding
Embedding(D, 256), one nn.MultiheadAttention(256, 4) from the layer queries
to the projected tokens, a 2-layer nn.TransformerEncoder (post-norm, ReLU,
feed-forward 1024), seg_head Linear(256, 1), op_head Linear(256, 3); eval mode.

Weights and token states come from an integer hash (weight_value below) that
tests/test_predictor.c computes identically, so only the outputs are
committed. Run by hand:  pip install torch safetensors numpy
                         python3 tests/golden/make_predictor_golden.py
"""
import json
import math
import os

import numpy as np
import torch
from safetensors.torch import save_file

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "predictor")
D_MODEL, HEADS, DQ = 256, 4, 1024
CASES = [(28, 7), (36, 300)]  # (D, T)


def name_hash(name):
    h = 2166136261
    for c in name.encode():
        h = ((h ^ c) * 16777619) & 0xFFFFFFFF
    return h


def weight_value(name, n, scale, center=0.0):
    """f32 values center + scale * (2u - 1), u = ((i * 2654435761 + hash(name)) mod 2^32) / 2^32."""
    i = np.arange(n, dtype=np.uint64)
    u = ((i * np.uint64(2654435761) + np.uint64(name_hash(name))) % np.uint64(1 << 32)).astype(np.float64) / 4294967296.0
    return (center + scale * (2.0 * u - 1.0)).astype(np.float32)


def scale_of(name, shape):
    if name.endswith("bias"):
        return 0.0 if "norm" not in name else 0.1, 0.1
    if "norm" in name:
        return 1.0, 0.2
    if name == "layer_embedding.weight":
        return 0.0, 1.0
    return 0.0, math.sqrt(3.0 / shape[-1])


class Predictor(torch.nn.Module):
    def __init__(self, D):
        super().__init__()
        self.q_proj = torch.nn.Linear(DQ, D_MODEL)
        self.layer_embedding = torch.nn.Embedding(D, D_MODEL)
        self.cross_attn = torch.nn.MultiheadAttention(D_MODEL, HEADS, batch_first=True, dropout=0.1)
        layer = torch.nn.TransformerEncoderLayer(D_MODEL, HEADS, dim_feedforward=4 * D_MODEL, dropout=0.1,
                                                 batch_first=True)
        self.layer_encoder = torch.nn.TransformerEncoder(layer, num_layers=2)
        self.seg_head = torch.nn.Linear(D_MODEL, 1)
        self.op_head = torch.nn.Linear(D_MODEL, 3)

    def forward(self, h):
        tok = self.q_proj(h)
        q = self.layer_embedding.weight.unsqueeze(0)
        x, _ = self.cross_attn(q, tok, tok, need_weights=False)
        x = self.layer_encoder(x)
        return self.seg_head(x).squeeze(-1)[0], self.op_head(x)[0]


def decode(seg, op, D, threshold=0.5, kmax=4, beam=5, top_ops=2):
    """The reference decoder's ranking, written from its description."""
    starts = [0]
    for i in range(1, D):
        if 1.0 / (1.0 + math.exp(-float(seg[i]))) >= threshold:
            while i - starts[-1] > kmax:
                starts.append(starts[-1] + kmax)
            if i != starts[-1]:
                starts.append(i)
    segs = []
    for k, st in enumerate(starts):
        ed = starts[k + 1] if k + 1 < len(starts) else D
        while st < ed:
            segs.append((st, min(st + kmax, ed)))
            st = min(st + kmax, ed)
    lp = torch.log_softmax(op, dim=-1).tolist()
    beams = [([], 0.0)]
    for st, ed in segs:
        ops = sorted(range(3), key=lambda o: lp[st][o], reverse=True)[:top_ops]
        beams = sorted([(a + [o], s + lp[st][o]) for a, s in beams for o in ops], key=lambda b: b[1], reverse=True)[:beam]
    out = []
    for acts, score in beams:
        prog = [l for (st, ed), o in zip(segs, acts) for _ in range(o) for l in range(st, ed)]
        if prog:
            out.append((prog, score))
    return out


def main():
    torch.set_num_threads(2)
    os.makedirs(HERE, exist_ok=True)
    for D, T in CASES:
        model = Predictor(D).eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                center, scale = scale_of(name, tuple(p.shape))
                p.copy_(torch.from_numpy(weight_value(name, p.numel(), scale, center)).reshape(p.shape))
            h = torch.from_numpy(weight_value("H", T * DQ, 1.0)).reshape(1, T, DQ)
            seg, op = model(h)
        progs = decode(seg, op, D)
        tensors = {"seg": seg.contiguous(), "op": op.contiguous()}
        meta = {"D": str(D), "T": str(T), "d_q": str(DQ), "programs": json.dumps([p for p, _ in progs]),
                "scores": json.dumps([s for _, s in progs]), "torch": torch.__version__}
        save_file(tensors, os.path.join(HERE, f"D{D}_T{T}.safetensors"), metadata=meta)
        print(D, T, "params", sum(p.numel() for p in model.parameters()), [len(p) for p, _ in progs])


if __name__ == "__main__":
    main()

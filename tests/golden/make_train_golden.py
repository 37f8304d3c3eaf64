#!/usr/bin/env python3
"""Golden training run of the PoLar predictor, for tests/test_train.c.

A tiny predictor of the reference's structure (q_proj, layer_embedding, one
4-head nn.MultiheadAttention from the layer queries to the projected tokens,
a 2-layer post-norm nn.TransformerEncoder with ReLU, seg_head, op_head) and
one batch of examples with token states of different lengths, padded and
masked as the reference's collate does (key_padding_mask). Dropout off.

The loss is the reference's (polar/train.py): BCE-with-logits over segment
positions 1..D-1 (mean per example) + cross entropy of the op logits at
segment starts (mean over them, ignore_index -100 elsewhere); example
weights w / (mean(w) + 1e-8); loss = mean(w * loss). Optimizer: AdamW
(betas 0.9/0.999, eps 1e-8, weight decay 0) with the reference's LambdaLR:
linear warm-up over WARMUP steps, then cosine to 0 at STEPS.

The math runs in float64 from float32 starting weights, so the fixture holds
the exact answer the f32 C trainer is compared with. Written to
train/golden.safetensors:
  the starting weights under the reference names (f32; polar_predictor_load
  reads them), "grad.<name>" the gradient of the first batch loss (f32),
  "h" [B, T_max, d_q] token states (zero padding), "T" [B] (i32),
  "seg" [B, D] segment starts (i32, 1 at 0 too), "ops" [B, D] (i32, -1 off
  starts), "weight" [B] (f32), "loss" [STEPS + 1] (f64): the batch loss
  before each of the STEPS AdamW steps on this batch, then after the last.
Metadata: nheads, lr, warmup, steps, torch version.

Run by hand (never by make test):
  python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch numpy safetensors
  /tmp/venv/bin/python tests/golden/make_train_golden.py
"""
import math
import os

import numpy as np
import torch
from safetensors.torch import save_file

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train")
D, D_MODEL, HEADS, FF, DQ = 8, 32, 4, 64, 24
TS = [5, 9, 3, 12, 7, 10]            # token states per example
WEIGHTS = [1.0, 0.3, 1.0, 1.0, 0.3, 1.0]
LR, WARMUP, STEPS = 5e-3, 10, 20     # a larger lr than the recipe's 5e-4 so 20 steps move the loss
KMAX = 4


class Predictor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = torch.nn.Linear(DQ, D_MODEL)
        self.layer_embedding = torch.nn.Embedding(D, D_MODEL)
        self.cross_attn = torch.nn.MultiheadAttention(D_MODEL, HEADS, batch_first=True, dropout=0.0)
        layer = torch.nn.TransformerEncoderLayer(D_MODEL, HEADS, dim_feedforward=FF, dropout=0.0, batch_first=True)
        self.layer_encoder = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.seg_head = torch.nn.Linear(D_MODEL, 1)
        self.op_head = torch.nn.Linear(D_MODEL, 3)

    def forward(self, h, pad):
        tok = self.q_proj(h)
        q = self.layer_embedding.weight.unsqueeze(0).expand(h.shape[0], -1, -1)
        x, _ = self.cross_attn(q, tok, tok, key_padding_mask=pad, need_weights=False)
        x = self.layer_encoder(x)
        return self.seg_head(x).squeeze(-1), self.op_head(x)


def batch_loss(model, h, pad, seg, ops, w):
    seg_logits, op_logits = model(h, pad)
    bce = torch.nn.functional.binary_cross_entropy_with_logits(seg_logits[:, 1:], seg[:, 1:].to(h.dtype),
                                                               reduction="none").mean(dim=1)
    B = h.shape[0]
    ce = torch.nn.functional.cross_entropy(op_logits.reshape(-1, 3), ops.reshape(-1), ignore_index=-100,
                                           reduction="none").view(B, D)
    mask = (ops != -100).to(h.dtype)
    per = bce + (ce * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
    w = w / (w.mean() + 1e-8)
    return (w * per).mean()


def random_targets(rng):
    """Segment starts (segments of 1..KMAX layers) and an op at each start."""
    seg = np.zeros(D, np.int32)
    ops = np.full(D, -100, np.int64)
    i = 0
    while i < D:
        seg[i] = 1
        ops[i] = rng.integers(0, 3)
        i += int(rng.integers(1, KMAX + 1))
    return seg, ops


def main():
    torch.manual_seed(7)
    rng = np.random.default_rng(7)
    model = Predictor()
    with torch.no_grad():  # non-trivial norms and biases, so their gradients are tested too
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.empty_like(p).uniform_(-0.1, 0.1))
    init = {n: p.detach().to(torch.float32).clone().contiguous() for n, p in model.named_parameters()}
    model = model.double().train()

    B, T_max = len(TS), max(TS)
    h = np.zeros((B, T_max, DQ), np.float32)
    pad = np.ones((B, T_max), bool)
    seg = np.zeros((B, D), np.int32)
    ops = np.zeros((B, D), np.int64)
    for b, T in enumerate(TS):
        h[b, :T] = rng.standard_normal((T, DQ)).astype(np.float32)
        pad[b, :T] = False
        seg[b], ops[b] = random_targets(rng)
    th, tpad = torch.from_numpy(h).double(), torch.from_numpy(pad)
    tseg, tops, tw = torch.from_numpy(seg), torch.from_numpy(ops), torch.tensor(WEIGHTS, dtype=torch.float64)

    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)

    def lr_lambda(step):
        if WARMUP > 0 and step < WARMUP:
            return step / WARMUP
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - WARMUP) / (STEPS - WARMUP))))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    losses, grads = [], None
    for step in range(STEPS):
        opt.zero_grad()
        loss = batch_loss(model, th, tpad, tseg, tops, tw)
        loss.backward()
        if step == 0:
            grads = {f"grad.{n}": p.grad.to(torch.float32).clone().contiguous() for n, p in model.named_parameters()}
        losses.append(loss.item())
        opt.step()
        sched.step()
    with torch.no_grad():
        losses.append(batch_loss(model, th, tpad, tseg, tops, tw).item())

    tensors = dict(init)
    tensors.update(grads)
    tensors.update({
        "h": torch.from_numpy(h), "T": torch.tensor(TS, dtype=torch.int32), "seg": torch.from_numpy(seg),
        "ops": torch.from_numpy(np.where(ops < 0, -1, ops).astype(np.int32)),
        "weight": torch.tensor(WEIGHTS, dtype=torch.float32), "loss": torch.tensor(losses, dtype=torch.float64),
    })
    meta = {"nheads": str(HEADS), "lr": repr(LR), "warmup": str(WARMUP), "steps": str(STEPS),
            "torch": torch.__version__}
    os.makedirs(HERE, exist_ok=True)
    save_file(tensors, os.path.join(HERE, "golden.safetensors"), metadata=meta)
    print("loss", " ".join(f"{x:.6f}" for x in losses))


if __name__ == "__main__":
    main()

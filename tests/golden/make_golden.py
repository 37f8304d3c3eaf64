#!/usr/bin/env python3
"""Make the golden fixtures polar's CPU runtime is checked against.

Run by hand (not by CI):  pip install torch transformers safetensors
                          python3 tests/golden/make_golden.py [NAME...]
(names: only those fixtures; the seeds follow each fixture's place in MODELS)

For each architecture a tiny random model is built by Hugging Face
transformers, its weights rounded to bf16 and saved with save_pretrained
(config.json + model.safetensors, as transformers writes them). Then, in
float32 with eager attention, for every program the model's layer list is
rebuilt (layers[i] for i in the program) and run without a cache: the logits
at every prompt position and 8 greedy tokens, each from a full recompute.
Everything lands in tests/golden/<arch>/expected.safetensors.
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen2MoeConfig,
                          Qwen2MoeForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)

HERE = os.path.dirname(os.path.abspath(__file__))
GREEDY = 8

COMMON = dict(vocab_size=256, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=256, bos_token_id=0, eos_token_id=255, hidden_act="silu")

MODELS = {
    # GQA, llama3 rope scaling (original context 32 so all three frequency bands occur), tied embeddings
    "llama": (LlamaConfig, LlamaForCausalLM,
              dict(COMMON, intermediate_size=128, head_dim=16, rms_norm_eps=1e-5, tie_word_embeddings=True,
                   rope_theta=10000.0,
                   rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 32})),
    # q/k/v bias, untied head
    "qwen2": (Qwen2Config, Qwen2ForCausalLM,
              dict(COMMON, intermediate_size=160, rms_norm_eps=1e-6, rope_theta=1000000.0,
                   tie_word_embeddings=False)),
    # q_norm/k_norm, head_dim (32) != hidden/heads (16)
    "qwen3": (Qwen3Config, Qwen3ForCausalLM,
              dict(COMMON, intermediate_size=128, head_dim=32, rms_norm_eps=1e-6, rope_theta=1000000.0,
                   tie_word_embeddings=False)),
    # experts: MoE in layers 1 and 5 (3 is listed dense), shared expert, no top-k renormalisation
    "qwen2_moe": (Qwen2MoeConfig, Qwen2MoeForCausalLM,
                  dict(COMMON, num_hidden_layers=6, intermediate_size=160, rms_norm_eps=1e-6, rope_theta=1000000.0,
                       tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48,
                       shared_expert_intermediate_size=96, norm_topk_prob=False, decoder_sparse_step=2,
                       mlp_only_layers=[3])),
    # every layer MoE, q/k norm, renormalised top-k, no shared expert
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM,
                  dict(COMMON, intermediate_size=128, head_dim=32, rms_norm_eps=1e-6, rope_theta=1000000.0,
                       tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48,
                       norm_topk_prob=True, decoder_sparse_step=1)),
    # linear position interpolation (inv_freq / factor)
    "llama_linear": (LlamaConfig, LlamaForCausalLM,
                     dict(COMMON, intermediate_size=128, head_dim=16, rms_norm_eps=1e-5, tie_word_embeddings=True,
                          rope_theta=10000.0, rope_scaling={"rope_type": "linear", "factor": 4.0})),
    # YaRN as Qwen's model cards enable it: factor and original context only (attention factor
    # 0.1 ln 4 + 1); theta 1e4 and original context 4096 put the ramp at dimensions 5..12 of 16
    "qwen3_yarn": (Qwen3Config, Qwen3ForCausalLM,
                   dict(COMMON, intermediate_size=128, head_dim=32, rms_norm_eps=1e-6, rope_theta=10000.0,
                        tie_word_embeddings=False, max_position_embeddings=16384,
                        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096})),
    # YaRN with every optional field: an attention factor given, other betas, an untruncated ramp
    "qwen2_yarn": (Qwen2Config, Qwen2ForCausalLM,
                   dict(COMMON, intermediate_size=160, rms_norm_eps=1e-6, rope_theta=10000.0,
                        tie_word_embeddings=False, max_position_embeddings=16384,
                        rope_scaling={"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 2048,
                                      "attention_factor": 1.25, "beta_fast": 16.0, "beta_slow": 2.0,
                                      "truncate": False})),
}

# name -> (program text in polar's grammar, layer list), for 4- and 6-layer models
PROGRAMS = {
    4: [("base", "base", [0, 1, 2, 3]),
        ("skip", "0,3", [0, 3]),
        ("repeat", "0,1-2x2,3", [0, 1, 2, 1, 2, 3]),
        ("mixed", "0,2-3x2", [0, 2, 3, 2, 3]),
        ("reorder", "0,2,1,3", [0, 2, 1, 3])],
    6: [("base", "base", [0, 1, 2, 3, 4, 5]),
        ("skip", "0-1,4-5", [0, 1, 4, 5]),
        ("repeat", "0,1-2x2,3-5", [0, 1, 2, 1, 2, 3, 4, 5]),
        ("mixed", "0-2,4-5x2", [0, 1, 2, 4, 5, 4, 5]),
        ("reorder", "0,2,1,3-5", [0, 2, 1, 3, 4, 5])],
}

PROMPT = [17, 3, 200, 45, 91, 128, 7]


def init_weights(model, seed):
    """Weights ~ N(0, 1/fan_in) so every layer matters; norms near 1; small biases; routers
    scaled up so the top-k choice is clear-cut (no near-ties for float error to flip)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(0.8 + 0.4 * torch.rand(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(4 * torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
            p.copy_(p.to(torch.bfloat16).to(torch.float32))


def run_program(model, layers, layer_types, prog, ids):
    """The model with its layer list rebuilt for the program (per-layer config lists too)."""
    model.model.layers = torch.nn.ModuleList([layers[i] for i in prog])
    model.config.num_hidden_layers = len(prog)
    if layer_types:
        model.config.layer_types = [layer_types[i] for i in prog]
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()


def main():
    torch.set_num_threads(2)
    only = set(sys.argv[1:])
    unknown = only - set(MODELS)
    if unknown:
        sys.exit(f"unknown fixture(s): {', '.join(sorted(unknown))} (known: {', '.join(MODELS)})")
    for seed, (arch, (cfg_cls, model_cls, kw)) in enumerate(MODELS.items()):
        if only and arch not in only:
            continue
        out = os.path.join(HERE, arch)
        os.makedirs(out, exist_ok=True)
        cfg = cfg_cls(**kw)
        torch.manual_seed(seed)
        model = model_cls(cfg).float().eval()
        init_weights(model, 1000 + seed)
        model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
        # Reload in float32 as a user would: the bf16 round trip above also
        # rounded non-weight buffers (RoPE inv_freq), which must stay f32.
        model = model_cls.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
        layers = list(model.model.layers)
        layer_types = list(getattr(model.config, "layer_types", None) or [])
        tensors = {"prompt": torch.tensor(PROMPT, dtype=torch.int32)}
        programs = PROGRAMS[cfg.num_hidden_layers]
        for k, (name, text, prog) in enumerate(programs):
            tensors[f"{name}.logits"] = run_program(model, layers, layer_types, prog, PROMPT).contiguous()
            seq = list(PROMPT)
            for _ in range(GREEDY):  # full recompute each step: no cache anywhere
                seq.append(int(run_program(model, layers, layer_types, prog, seq)[-1].argmax()))
            tensors[f"{name}.tokens"] = torch.tensor(seq[len(PROMPT):], dtype=torch.int32)
            tensors[f"{name}.program"] = torch.tensor(prog, dtype=torch.int32)
        meta = {"programs": json.dumps([[n, t] for n, t, _ in programs]),
                "transformers": transformers.__version__, "torch": torch.__version__}
        save_file(tensors, os.path.join(out, "expected.safetensors"), metadata=meta)
        print(arch, {n: tensors[f"{n}.tokens"].tolist() for n, _, _ in programs})


if __name__ == "__main__":
    sys.exit(main())

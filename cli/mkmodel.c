/* polar mkmodel: write a checkpoint with deterministic random weights. */
#include <stdio.h>
#include <string.h>

#include "args.h"

int cmd_mkmodel(int argc, char **argv) {
    const char *cmd = "mkmodel", *arch = NULL, *preset = NULL, *out = NULL;
    uint64_t seed = 0;
    int layers = 0, hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0;
    int experts = 0, top_k = 0, expert_ffn = 0, shared_ffn = -1;
    cli_opt opts[] = {
        {"--arch", OPT_STR, &arch, 0},        {"--preset", OPT_STR, &preset, 0},
        {"--out", OPT_STR, &out, 0},          {"--seed", OPT_U64, &seed, 0},
        {"--layers", OPT_INT, &layers, 0},    {"--hidden", OPT_INT, &hidden, 0},
        {"--heads", OPT_INT, &heads, 0},      {"--kv-heads", OPT_INT, &kv_heads, 0},
        {"--head-dim", OPT_INT, &head_dim, 0}, {"--ffn", OPT_INT, &ffn, 0},
        {"--vocab", OPT_INT, &vocab, 0},      {"--experts", OPT_INT, &experts, 0},
        {"--top-k", OPT_INT, &top_k, 0},      {"--expert-ffn", OPT_INT, &expert_ffn, 0},
        {"--shared-ffn", OPT_INT, &shared_ffn, 0},
    };
    if (!parse_opts(cmd, argc, argv, opts, sizeof opts / sizeof opts[0])) return EXIT_USAGE;
    if (!out) return fail_usage(cmd, "--out DIR is required");
    if (!!arch + !!preset != 1) return fail_usage(cmd, "give exactly one of --arch or --preset");
    polar_error err;
    polar_arch a;
    polar_status st = preset ? polar_arch_preset(preset, &a, &err) : polar_arch_default(arch, &a, &err);
    if (st != POLAR_OK) return fail_status(cmd, &err);
    /* Overrides; head_dim follows hidden/heads unless given. */
    if (layers) a.n_layers = layers;
    if (hidden) a.hidden = hidden;
    if (heads) a.n_heads = heads;
    if (kv_heads) a.n_kv_heads = kv_heads;
    if (head_dim) a.head_dim = head_dim;
    else if (hidden || heads) a.head_dim = a.hidden / a.n_heads;
    if (ffn) a.ffn = ffn;
    if ((experts || top_k || expert_ffn || shared_ffn >= 0) && !a.n_experts)
        return fail_usage(cmd, "--experts, --top-k, --expert-ffn and --shared-ffn need an MoE architecture");
    if (experts) a.n_experts = experts;
    if (top_k) a.top_k = top_k;
    if (expert_ffn) a.moe_ffn = expert_ffn;
    if (shared_ffn >= 0) a.shared_ffn = shared_ffn;
    /* Dense layers listed for the default shape must exist in the new one. */
    int kept = 0;
    for (int i = 0; i < a.n_mlp_only; i++)
        if (a.mlp_only[i] < a.n_layers) a.mlp_only[kept++] = a.mlp_only[i];
    a.n_mlp_only = kept;
    if (vocab) {
        a.vocab = vocab;
        a.n_eos = 1;
        a.eos[0] = vocab - 1;
    }
    polar_model *m;
    if (polar_model_random(&a, seed, &m, &err) != POLAR_OK) return fail_status(cmd, &err);
    st = polar_model_save(m, out, &err);
    polar_model_info info;
    polar_model_info_get(m, &info);
    polar_model_free(m);
    if (st != POLAR_OK) return fail_status(cmd, &err);
    printf("wrote %s: %s, %d layers, hidden %d, %d heads (%d kv, head_dim %d), ffn %d, vocab %d", out, a.arch,
           a.n_layers, a.hidden, a.n_heads, a.n_kv_heads, a.head_dim, a.ffn, a.vocab);
    if (a.n_experts) printf(", %d experts (top %d, width %d, shared %d)", a.n_experts, a.top_k, a.moe_ffn, a.shared_ffn);
    printf(", %.1f M params\n", (double)info.n_params / 1e6);
    return 0;
}

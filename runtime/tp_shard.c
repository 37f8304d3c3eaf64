/* The tensor-parallel split of a model (tp_shard.h). Query heads go out as
 * evenly as they can, ranks r*Hq/N up to (r+1)*Hq/N; a rank holds the
 * key/value heads those read, so with fewer key/value heads than ranks they
 * are held by several. The CUDA kernels map local query head j to local
 * key/value head j / (n_heads / n_kv), which holds when a rank's heads are
 * whole groups, or all in one group: any other split is refused. MLP
 * columns split as evenly as TP_COLUMN_ALIGN allows, experts and vocabulary
 * rows as evenly as they can. */
#include "tp_shard.h"

#include "error.h"

/* Part r of n of [0, total), boundaries on multiples of align (the last at total). */
static void split(int total, int r, int n, int align, int *start, int *count) {
    int a = (int)((long)total * r / n / align * align), b = r + 1 == n ? total : (int)((long)total * (r + 1) / n / align * align);
    *start = a, *count = b - a;
}

polar_status tp_shard_of(const polar_arch *a, int rank, int world, tp_shard *out, polar_error *err) {
    if (world < 1 || rank < 0 || rank >= world)
        return polar_fail(err, POLAR_ERR_ARG, "tensor parallel: rank %d of %d", rank, world);
    tp_shard s = {.rank = rank, .world = world};
    int Hq = a->n_heads, K = a->n_kv_heads, g = Hq / K;
    if (Hq < world)
        return polar_fail(err, POLAR_ERR_UNSUPPORTED, "tensor parallel: %d ranks, but the model has %d attention heads",
                          world, Hq);
    split(Hq, rank, world, 1, &s.q0, &s.n_heads);
    s.kv0 = s.q0 / g;
    s.n_kv = (s.q0 + s.n_heads - 1) / g - s.kv0 + 1;
    if (s.n_kv > 1 && (s.q0 % g || s.n_heads % g))
        return polar_fail(err, POLAR_ERR_UNSUPPORTED,
                          "tensor parallel: %d ranks split %d attention heads unevenly: rank %d would hold heads %d-%d, "
                          "not whole groups of the %d heads that share a key/value head (try a world size that "
                          "divides %d or %d)",
                          world, Hq, rank, s.q0, s.q0 + s.n_heads - 1, g, Hq, K);
    if (a->ffn) {
        split(a->ffn, rank, world, TP_COLUMN_ALIGN, &s.f0, &s.ffn);
        if (s.ffn <= 0)
            return polar_fail(err, POLAR_ERR_UNSUPPORTED,
                              "tensor parallel: %d ranks, but the MLP's %d columns give rank %d none (splits fall on "
                              "multiples of %d)", world, a->ffn, rank, TP_COLUMN_ALIGN);
    }
    if (a->shared_ffn) {
        split(a->shared_ffn, rank, world, TP_COLUMN_ALIGN, &s.s0, &s.shared_ffn);
        if (s.shared_ffn <= 0)
            return polar_fail(err, POLAR_ERR_UNSUPPORTED,
                              "tensor parallel: %d ranks, but the shared expert's %d columns give rank %d none", world,
                              a->shared_ffn, rank);
    }
    if (a->n_experts) {
        if (a->n_experts < world)
            return polar_fail(err, POLAR_ERR_UNSUPPORTED, "tensor parallel: %d ranks, but the model has %d experts",
                              world, a->n_experts);
        split(a->n_experts, rank, world, 1, &s.e0, &s.n_experts);
    }
    if (a->vocab < world)
        return polar_fail(err, POLAR_ERR_UNSUPPORTED, "tensor parallel: %d ranks, but the vocabulary has %d tokens", world,
                          a->vocab);
    split(a->vocab, rank, world, 1, &s.v0, &s.vocab);
    s.vocab_part = (a->vocab + world - 1) / world;
    *out = s;
    return POLAR_OK;
}

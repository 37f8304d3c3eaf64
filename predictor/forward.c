/* The predictor network, following PyTorch's modules:
 *   tok = q_proj(H)                                  [T, d]
 *   x   = MultiheadAttention(layer_emb, tok, tok)    [D, d]   (no residual, no norm)
 *   x   = 2 x TransformerEncoderLayer(x)  post-norm: x = LN1(x + SA(x)); x = LN2(x + W2 relu(W1 x))
 *   seg = seg_head(x) [D], op = op_head(x) [D, 3]
 * f32 throughout; LayerNorm eps 1e-5 as PyTorch's default. On the CPU it is
 * the trainer's forward pass with dropout off (train.c: one implementation
 * of the network's math, its products split across threads); on a GPU the
 * fused kernel (cuda.c). */
#include "../runtime/error.h"
#include "predictor.h"
#include "train.h"

polar_status polar_predict_logits(const polar_predictor *p, const float *h, int T, float *seg, float *op,
                                  polar_error *err) {
    if (!p || !h || !seg || !op) return polar_fail(err, POLAR_ERR_ARG, "predict: missing argument");
    if (T < 1 || T > PRED_MAX_TOKENS)
        return polar_fail(err, POLAR_ERR_ARG, "predict: %d token states (1 to %d)", T, PRED_MAX_TOKENS);
    if (p->cuda) return pred_cuda_logits(p, h, T, seg, op, err);
    return pred_forward_cpu(p, h, T, seg, op, err);
}

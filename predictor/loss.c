/* The reference's training loss of one example, shared by training (with
 * its gradient) and by the catalogue decoder (which ranks programs by it). */
#include <math.h>

#include "train.h"

/* One example's loss from its logits seg[D], op[D, 3] and targets
 * seg_start[D], ops[D] (-1: no op label):
 *   BCE-with-logits over positions 1..D-1 (mean) + cross entropy of the op
 *   logits where ops >= 0 (mean over them; 0 when there are none).
 * dseg[D], dop[D, 3] (when not NULL) get d(loss)/d(logit) times gscale. */
double tr_example_loss(const float *seg, const float *op, const unsigned char *seg_start, const int *ops, int D,
                       float *dseg, float *dop, float gscale) {
    double bce = 0.0, ce = 0.0;
    int n_ops = 0;
    for (int i = 0; i < D; i++) n_ops += ops[i] >= 0;
    double pos_scale = D > 1 ? 1.0 / (D - 1) : 0.0, op_scale = 1.0 / (n_ops > 0 ? n_ops : 1);
    if (dseg) dseg[0] = 0.0f;
    for (int i = 1; i < D; i++) {
        double s = seg[i], y = seg_start[i] ? 1.0 : 0.0;
        bce += fmax(s, 0.0) - s * y + log1p(exp(-fabs(s)));
        if (dseg) dseg[i] = (float)((1.0 / (1.0 + exp(-s)) - y) * pos_scale * gscale);
    }
    for (int i = 0; i < D; i++) {
        const float *o = op + 3 * i;
        if (dop) dop[3 * i] = dop[3 * i + 1] = dop[3 * i + 2] = 0.0f;
        if (ops[i] < 0) continue;
        double mx = fmax(o[0], fmax(o[1], o[2])), z = 0.0;
        for (int k = 0; k < 3; k++) z += exp(o[k] - mx);
        ce += mx + log(z) - o[ops[i]];
        if (dop)
            for (int k = 0; k < 3; k++)
                dop[3 * i + k] = (float)((exp(o[k] - mx) / z - (k == ops[i])) * op_scale * gscale);
    }
    return bce * pos_scale + ce * op_scale;
}

/* The quantized matmul of one SIMD level, written once over its tile
 * routine: included (once) by quant_avx2.c and quant_neon.c after they
 * define
 *   INLINE void tile(cpu_wtype t, int R, int C, const uint8_t *w, size_t row_bytes,
 *                    const cpu_q8_block *x, size_t xs, int nb, float out[4][4]);
 * (out[r][c] = dot of weight row r, rows row_bytes apart, with token c's nb
 * blocks, tokens xs blocks apart; R, C <= 4) and QUANT_LEVEL (avx2, neon).
 * It defines the tables cpu_dot_q_<level> and cpu_rows_q_<level>: the dot
 * product is the 1 x 1 tile, and since a tile does the same operations per
 * (row, token) in the same order whatever its shape, the matmul equals the
 * dot product bit for bit. */
#ifndef POLAR_CPU_QUANT_TILES_H
#define POLAR_CPU_QUANT_TILES_H

#ifndef BATCH_ROWS
#define BATCH_ROWS 2
#endif

/* A level may also define PREPARED_ROWS, the type of R rows unpacked once
 * for all the token tiles of a row group, with
 *   int prepare_rows(cpu_wtype t, int R, const uint8_t *w, size_t row_bytes, int nb, PREPARED_ROWS *p)
 * (0 when the rows are too long for it) and
 *   void tile_prepared(cpu_wtype t, int R, int C, const PREPARED_ROWS *p, const cpu_q8_block *x, size_t xs,
 *                      int nb, float out[4][4])
 * giving tile's out bit for bit. */
#ifdef PREPARED_ROWS
#define HAVE_PREPARED_ROWS 1
#else
#define HAVE_PREPARED_ROWS 0
typedef char no_prepared_rows;
#define PREPARED_ROWS no_prepared_rows
INLINE void tile_prepared(cpu_wtype t, int R, int C, const PREPARED_ROWS *p, const cpu_q8_block *x, size_t xs, int nb,
                          float out[4][4]) {}
INLINE int prepare_rows(cpu_wtype t, int R, const uint8_t *w, size_t row_bytes, int nb, PREPARED_ROWS *p) { return 0; }
#endif

/* Rows r..r+R-1 of y[T, rows] for every token, up to 4 tokens a tile (so
 * a weight block is unpacked once for all of them: batches of 2 or 3
 * sequences, and the tokens left after the 4-token tiles), from the
 * weights wr or, when not NULL, from the same rows prepared. */
INLINE void token_tiles(cpu_wtype t, int R, float *y, const cpu_q8_block *xq, const uint8_t *wr, size_t row_bytes,
                        const PREPARED_ROWS *prep, const bf16 *bias, int T, int rows, int nb, int accumulate, int r) {
    for (int c = 0; c < T;) {
        float out[4][4];
        int nc = R > BATCH_ROWS ? 1 : T - c < 4 ? T - c : 4;
        const cpu_q8_block *xc = xq + (size_t)c * nb;
#define TILE(C) (prep ? tile_prepared(t, R, C, prep, xc, nb, nb, out) : tile(t, R, C, wr, row_bytes, xc, nb, nb, out))
        switch (nc) { /* constant tile shapes, unrolled */
        case 4: TILE(4); break;
        case 3: TILE(3); break;
        case 2: TILE(2); break;
        default: TILE(1); break;
        }
#undef TILE
        for (int i = 0; i < R; i++) {
            float b = bias ? bf16_to_f32(bias[r + i]) : 0.0f;
            for (int j = 0; j < nc; j++) {
                float *dst = &y[(size_t)(c + j) * rows + r + i];
                *dst = accumulate ? *dst + (out[i][j] + b) : out[i][j] + b;
            }
        }
        c += nc;
    }
}

/* scratch: room for R prepared rows, used when there is more than one
 * token tile over them. */
INLINE void row_group(cpu_wtype t, int R, float *y, const cpu_q8_block *xq, const uint8_t *w, size_t row_bytes,
                      const bf16 *bias, int T, int rows, int nb, int accumulate, int r, PREPARED_ROWS *scratch) {
    const uint8_t *wr = w + (size_t)r * row_bytes;
    int prepared = HAVE_PREPARED_ROWS && T > 4 && R <= BATCH_ROWS && prepare_rows(t, R, wr, row_bytes, nb, scratch);
    token_tiles(t, R, y, xq, wr, row_bytes, prepared ? scratch : NULL, bias, T, rows, nb, accumulate, r);
}

/* Rows r0..r1-1 for every token: 4-row tiles for one token (decode),
 * BATCH_ROWS rows x up to 4 tokens otherwise (batches, prefill), single
 * rows at the tail. */
INLINE void rows_q(cpu_wtype t, float *y, const cpu_q8_block *xq, const uint8_t *w, size_t row_bytes, const bf16 *bias,
                   int T, int rows, int nb, int accumulate, int r0, int r1) {
    PREPARED_ROWS scratch;
    int r = r0;
    if (T == 1)
        for (; r + 4 <= r1; r += 4) row_group(t, 4, y, xq, w, row_bytes, bias, T, rows, nb, accumulate, r, &scratch);
    else
        for (; r + BATCH_ROWS <= r1; r += BATCH_ROWS)
            row_group(t, BATCH_ROWS, y, xq, w, row_bytes, bias, T, rows, nb, accumulate, r, &scratch);
    for (; r < r1; r++) row_group(t, 1, y, xq, w, row_bytes, bias, T, rows, nb, accumulate, r, &scratch);
}

#define LEVEL_FUNCTIONS(name, type)                                                                                 \
    static float dot_##name(const void *w, const cpu_q8_block *x, int nb) {                                        \
        float out[4][4];                                                                                           \
        tile(type, 1, 1, w, 0, x, 0, nb, out);                                                                     \
        return out[0][0];                                                                                          \
    }                                                                                                              \
    static void rows_##name(float *y, const cpu_q8_block *xq, const void *w, size_t row_bytes, const bf16 *bias,  \
                            int T, int rows, int nb, int accumulate, int r0, int r1) {                             \
        rows_q(type, y, xq, w, row_bytes, bias, T, rows, nb, accumulate, r0, r1);                                  \
    }
LEVEL_FUNCTIONS(q8_0, CPU_W_Q8_0)
LEVEL_FUNCTIONS(q4_0, CPU_W_Q4_0)
LEVEL_FUNCTIONS(q4_1, CPU_W_Q4_1)
LEVEL_FUNCTIONS(q5_0, CPU_W_Q5_0)
LEVEL_FUNCTIONS(q5_1, CPU_W_Q5_1)
LEVEL_FUNCTIONS(q4_k, CPU_W_Q4_K)
LEVEL_FUNCTIONS(q5_k, CPU_W_Q5_K)
LEVEL_FUNCTIONS(q6_k, CPU_W_Q6_K)
LEVEL_FUNCTIONS(iq4_nl, CPU_W_IQ4_NL)
LEVEL_FUNCTIONS(iq4_xs, CPU_W_IQ4_XS)

#define LEVEL_TABLE_NAME(kind, level) cpu_##kind##_##level
#define LEVEL_TABLE(kind, level) LEVEL_TABLE_NAME(kind, level) /* expands QUANT_LEVEL first */

const cpu_dot_q_fn LEVEL_TABLE(dot_q, QUANT_LEVEL)[CPU_W_N] = {
    [CPU_W_Q8_0] = dot_q8_0, [CPU_W_Q4_0] = dot_q4_0, [CPU_W_Q4_1] = dot_q4_1, [CPU_W_Q5_0] = dot_q5_0,
    [CPU_W_Q5_1] = dot_q5_1, [CPU_W_Q4_K] = dot_q4_k, [CPU_W_Q5_K] = dot_q5_k, [CPU_W_Q6_K] = dot_q6_k,
    [CPU_W_IQ4_NL] = dot_iq4_nl, [CPU_W_IQ4_XS] = dot_iq4_xs,
};
const cpu_rows_q_fn LEVEL_TABLE(rows_q, QUANT_LEVEL)[CPU_W_N] = {
    [CPU_W_Q8_0] = rows_q8_0, [CPU_W_Q4_0] = rows_q4_0, [CPU_W_Q4_1] = rows_q4_1, [CPU_W_Q5_0] = rows_q5_0,
    [CPU_W_Q5_1] = rows_q5_1, [CPU_W_Q4_K] = rows_q4_k, [CPU_W_Q5_K] = rows_q5_k, [CPU_W_Q6_K] = rows_q6_k,
    [CPU_W_IQ4_NL] = rows_iq4_nl, [CPU_W_IQ4_XS] = rows_iq4_xs,
#ifdef LEVEL_EXTRA_ROWS /* a level's entries for layouts of its own (the x16 ones) */
    LEVEL_EXTRA_ROWS
#endif
};

#endif

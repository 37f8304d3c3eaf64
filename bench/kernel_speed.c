/* The quantized matmul kernels' own speed, per block type and CPU level:
 * how many bytes of weights a single thread multiplies per second of its
 * own CPU time (CLOCK_THREAD_CPUTIME_ID, so a busy neighbour on a shared
 * machine takes time slices, not the figure), for T tokens at once.
 *
 *   build/kernel_speed [--types Q4_K,Q5_K,Q6_K,...] [--levels avx2,...] [--rows 2048] [--cols 2048]
 *                      [--T 1] [--ms 400] [--cold-mb 256] [--json]
 *
 * Two figures per (type, level):
 * - hot: 64 rows that stay in the L2 cache, multiplied over and over: the
 *   kernel's arithmetic, the ceiling it could reach with free memory;
 * - cold: a rows x cols matrix in enough copies (>= --cold-mb, 0 for none)
 *   that each pass reads from memory: what one thread gets in a decode step.
 * A decode step of n threads is bound by min(n * cold, the machine's read
 * bandwidth) (polar bench's read_gbps); a type whose hot figure is below
 * read_gbps / n cannot reach the memory's speed on this CPU. Weights are
 * random bytes in the model's layout (the x16 layout where the level has
 * one), with finite scales. Not a test: make test only checks that it
 * runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "../kernels/cpu/kernels.h"

enum { HOT_ROWS = 64 };

static double thread_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t next_random(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

/* rows x cols of kept type t as random bytes, its f16 scales (the d and,
 * for the offset types, m of each block) set to 2^-7 so that every float
 * stays normal. */
static void random_rows(cpu_wtype t, int rows, int cols, uint8_t *w) {
    size_t bb = cpu_wtype_block_bytes(t), n = (size_t)rows * (size_t)cols / (size_t)cpu_wtype_block_elems(t);
    int first = t == CPU_W_Q6_K ? 208 : 0, fields = 1 + cpu_kept_has_offset(t);
    for (size_t b = 0; b < n; b++, w += bb) {
        for (size_t i = 0; i < bb; i++) w[i] = (uint8_t)next_random();
        for (int f = 0; f < fields; f++) w[first + 2 * f] = 0x00, w[first + 2 * f + 1] = 0x20;
    }
}

/* One matrix as the level multiplies it: repacked to x16 where the level
 * has that layout's rows, else row-major. */
typedef struct {
    cpu_wtype t; /* the type rows_q is called with */
    size_t bytes;
    uint8_t *data;
} matrix;

static int make_matrix(const cpu_kernels *k, cpu_wtype t, int rows, int cols, matrix *m) {
    size_t rb = cpu_wtype_row_bytes(t, (size_t)cols);
    uint8_t *plain = malloc((size_t)rows * rb);
    if (!plain) return -1;
    random_rows(t, rows, cols, plain);
    cpu_wtype x = cpu_x16_of(t);
    if (x != CPU_W_BF16 && k->rows_q[x]) {
        m->t = x, m->bytes = cpu_x16_bytes(x, rows, (size_t)cols);
        m->data = malloc(m->bytes);
        if (m->data) cpu_repack_x16(t, plain, rows, (size_t)cols, m->data);
        free(plain);
    } else {
        m->t = t, m->bytes = (size_t)rows * rb, m->data = plain;
    }
    return m->data ? 0 : -1;
}

/* Weight bytes per thread-CPU second: passes over `copies` matrices laid
 * one after another (each rows x cols), until ms of CPU time have gone. */
static double measure(const cpu_kernels *k, const matrix *m, int copies, int rows, int cols, int T, double ms,
                      float *y, const cpu_q8_block *xq) {
    size_t each = m->bytes / (size_t)copies, row_bytes = cpu_wtype_row_bytes(m->t, (size_t)cols);
    double bytes = 0, start = thread_seconds(), elapsed = 0;
    for (int c = 0; elapsed < ms * 1e-3; c = (c + 1) % copies) {
        k->rows_q[m->t](y, xq, m->data + (size_t)c * each, row_bytes, NULL, T, rows, cols / CPU_QK, 0, 0, rows);
        bytes += (double)each;
        elapsed = thread_seconds() - start;
    }
    return bytes / elapsed * 1e-9;
}

static int listed(const char *list, const char *name) {
    if (!list) return 1;
    size_t n = strlen(name);
    for (const char *p = list; *p; p += strcspn(p, ","), p += *p == ',')
        if (!strncasecmp(p, name, n) && (p[n] == ',' || p[n] == '\0')) return 1;
    return 0;
}

int main(int argc, char **argv) {
    const char *types = NULL, *levels = NULL;
    int rows = 2048, cols = 2048, T = 1, json = 0, cold_mb = 256;
    double ms = 400;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "kernel_speed: usage error: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--types")) types = v;
        else if (!strcmp(a, "--levels")) levels = v;
        else if (!strcmp(a, "--rows")) rows = atoi(v);
        else if (!strcmp(a, "--cols")) cols = atoi(v);
        else if (!strcmp(a, "--T")) T = atoi(v);
        else if (!strcmp(a, "--ms")) ms = atof(v);
        else if (!strcmp(a, "--cold-mb")) cold_mb = atoi(v);
        else {
            fprintf(stderr, "kernel_speed: usage error: unknown option '%s'\n", a);
            return 2;
        }
        i++;
    }
    if (rows < 16 || rows % 16 || cols < 256 || cols % 256 || T < 1 || T > 64 || !(ms > 0) || cold_mb < 0) {
        fprintf(stderr, "kernel_speed: usage error: --rows a multiple of 16, --cols of 256, --T 1..64, --ms > 0, --cold-mb >= 0\n");
        return 2;
    }
    static const cpu_wtype all[] = {CPU_W_Q4_0, CPU_W_Q4_1, CPU_W_Q5_0, CPU_W_Q5_1,   CPU_W_Q8_0,
                                    CPU_W_Q4_K, CPU_W_Q5_K, CPU_W_Q6_K, CPU_W_IQ4_NL, CPU_W_IQ4_XS};
    float *y = malloc((size_t)T * (size_t)(rows > HOT_ROWS ? rows : HOT_ROWS) * sizeof(float)), *x = malloc((size_t)T * (size_t)cols * sizeof(float));
    cpu_q8_block *xq = malloc((size_t)T * (size_t)cols / CPU_QK * sizeof(cpu_q8_block));
    if (!y || !x || !xq) {
        fprintf(stderr, "kernel_speed: error: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < (size_t)T * (size_t)cols; i++) x[i] = (float)(int)(next_random() % 2001 - 1000) * 1e-3f;
    cpu_quantize_q8(xq, x, T * cols);
    if (!json) printf("%-8s %-11s %-11s %3s %10s %10s\n", "type", "level", "layout", "T", "hot GB/s", "cold GB/s");
    for (int l = 0; l < CPU_N_LEVELS; l++) {
        const cpu_kernels *k = cpu_kernels_for((cpu_level)l, NULL);
        if (!k || !listed(levels, k->name)) continue;
        for (size_t ti = 0; ti < sizeof all / sizeof *all; ti++) {
            cpu_wtype t = all[ti];
            cpu_wtype t16 = cpu_x16_of(t);
            if (!listed(types, cpu_wtype_name(t)) || !(k->rows_q[t] || (t16 != CPU_W_BF16 && k->rows_q[t16]))) continue;
            size_t matrix_bytes = (size_t)rows * cpu_wtype_row_bytes(t, (size_t)cols);
            int copies = (int)(((size_t)cold_mb * 1048576 + matrix_bytes - 1) / matrix_bytes);
            matrix hot, cold = {t, 0, NULL};
            if (make_matrix(k, t, HOT_ROWS, cols, &hot) || (copies && make_matrix(k, t, rows * copies, cols, &cold))) {
                fprintf(stderr, "kernel_speed: error: out of memory for %s\n", cpu_wtype_name(t));
                return 1;
            }
            double hot_gbps = measure(k, &hot, 1, HOT_ROWS, cols, T, ms, y, xq);
            double cold_gbps = copies ? measure(k, &cold, copies, rows, cols, T, ms, y, xq) : 0.0;
            if (json)
                printf("{\"type\":\"%s\",\"level\":\"%s\",\"layout\":\"%s\",\"T\":%d,\"rows\":%d,\"cols\":%d,"
                       "\"hot_gbps\":%.3f,\"cold_gbps\":%.3f}\n",
                       cpu_wtype_name(t), k->name, cpu_wtype_name(hot.t), T, rows, cols, hot_gbps, cold_gbps);
            else
                printf("%-8s %-11s %-11s %3d %10.2f %10.2f\n", cpu_wtype_name(t), k->name, cpu_wtype_name(hot.t), T,
                       hot_gbps, cold_gbps);
            free(hot.data);
            free(cold.data);
        }
    }
    free(y), free(x), free(xq);
    return 0;
}

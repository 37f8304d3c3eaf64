/* The C API from several threads: sessions on one shared, read-only model,
 * and on two different models, generating at the same time, give exactly
 * what they give one after another. */
#include <pthread.h>

#include "harness.h"

typedef struct {
    const polar_model *m;
    const char *program;
    int out[12];
    int n;
    polar_status st;
} job;

static void *run_job(void *arg) {
    job *j = arg;
    polar_error err;
    polar_program p;
    polar_session *s = NULL;
    j->st = polar_program_parse(j->program, 4, 0, &p, &err);
    polar_session_opts o = {.max_ctx = 32, .n_threads = 1};
    if (j->st == POLAR_OK) j->st = polar_session_create(j->m, &p, &o, &s, &err);
    int prompt[5] = {9, 8, 7, 6, 5};
    polar_gen_opts go = {.max_new = 12, .ignore_eos = 1};
    polar_gen_stats st;
    if (j->st == POLAR_OK) j->st = polar_generate(s, prompt, 5, &go, j->out, &st, NULL, NULL, &err);
    j->n = st.n_generated;
    polar_session_free(s);
    polar_program_free(&p);
    return NULL;
}

static void threads_share_models(void) {
    polar_error err;
    polar_model *a = NULL, *b = NULL;
    CHECK_OK(polar_model_load(GOLDEN_DIR "/llama", &a, &err));
    CHECK_OK(polar_model_load(GOLDEN_DIR "/qwen3", &b, &err));
    if (!a || !b) return;
    job jobs[4] = {{a, "base", {0}, 0, 0}, {a, "0,1-2x2,3", {0}, 0, 0}, {b, "0-1x2,3", {0}, 0, 0}, {b, "base", {0}, 0, 0}};
    job serial[4];
    memcpy(serial, jobs, sizeof jobs);
    for (int i = 0; i < 4; i++) run_job(&serial[i]);
    pthread_t t[4];
    for (int i = 0; i < 4; i++) CHECK(pthread_create(&t[i], NULL, run_job, &jobs[i]) == 0, "pthread_create");
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 4; i++) {
        CHECK(jobs[i].st == POLAR_OK && jobs[i].n == 12, "job %d failed", i);
        CHECK(memcmp(jobs[i].out, serial[i].out, sizeof jobs[i].out) == 0, "job %d: threaded tokens differ", i);
    }
    polar_model_free(a);
    polar_model_free(b);
}

int main(void) {
    RUN(threads_share_models);
    TEST_EXIT();
}

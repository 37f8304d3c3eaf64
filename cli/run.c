/* polar run: greedy generation with a program of layers, from token ids or
 * from text (the model's tokenizer and chat template). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auto.h"
#include "tp.h"

/* Streams generated text: token bytes are held back while they end in an
 * incomplete UTF-8 character, so a character split across tokens prints
 * whole. */
typedef struct {
    const polar_tokenizer *tok;
    char pending[16];
    size_t n_pending;
    char *text;         /* everything generated, for --json */
    size_t len, cap;
    int print, stop_id;
} text_stream;

static void stream_bytes(text_stream *ts, const char *p, size_t n) {
    if (ts->len + n + 1 > ts->cap) {
        size_t cap = (ts->len + n + 1) * 2;
        char *t = realloc(ts->text, cap);
        if (!t) return;
        ts->text = t;
        ts->cap = cap;
    }
    memcpy(ts->text + ts->len, p, n);
    ts->len += n;
    ts->text[ts->len] = 0;
    if (!ts->print) return;
    for (size_t i = 0; i < n; i++) {
        if (ts->n_pending == sizeof ts->pending) {
            fwrite(ts->pending, 1, ts->n_pending, stdout);
            ts->n_pending = 0;
        }
        ts->pending[ts->n_pending++] = p[i];
    }
    size_t ok = polar_utf8_complete(ts->pending, ts->n_pending);
    fwrite(ts->pending, 1, ok, stdout);
    memmove(ts->pending, ts->pending + ok, ts->n_pending - ok);
    ts->n_pending -= ok;
    fflush(stdout);
}

static int on_text_token(int token, void *user) {
    text_stream *ts = user;
    const char *p;
    size_t n;
    if (token != ts->stop_id && polar_token_piece(ts->tok, token, &p, &n)) stream_bytes(ts, p, n);
    return 0;
}

static int on_id_token(int token, void *user) {
    (void)user;
    printf(" %d", token);
    fflush(stdout);
    return 0;
}

static void print_json_string(const char *s, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') printf("\\n");
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

static void print_json(const polar_program *p, const polar_arch *a, const char *kv, int n_prompt, const int *out,
                       const polar_gen_stats *st, const text_stream *ts) {
    char text[4096];
    polar_program_format(p, text, sizeof text);
    printf("{\"program\":[");
    for (int i = 0; i < p->n; i++) printf("%s%d", i ? "," : "", p->layers[i]);
    printf("],\"program_text\":\"%s\",\"executed_layers\":%d,\"n_layers\":%d,\"kv\":\"%s\",\"prompt_tokens\":%d,"
           "\"tokens\":[", text, p->n, a->n_layers, kv, n_prompt);
    for (int i = 0; i < st->n_generated; i++) printf("%s%d", i ? "," : "", out[i]);
    printf("]");
    if (ts) {
        printf(",\"text\":");
        print_json_string(ts->text ? ts->text : "", ts->len);
    }
    int steps = st->n_generated > 1 ? st->n_generated - 1 : 0;
    printf(",\"stopped_at_eos\":%s,\"prefill_ms\":%.4f,\"decode_ms_per_token\":%.4f}\n",
           st->stopped_at_eos ? "true" : "false", st->prefill_ms, steps ? st->decode_ms / steps : 0.0);
}

/* The prompt's ids: from --tokens, or the tokenized (chat-formatted) text. */
static int prompt_ids(const char *cmd, const char *tokens, const char *prompt, const polar_tokenizer *tok, int chat,
                      const char *system, int **ids, int *n) {
    if (tokens) return parse_int_list(cmd, "--tokens", tokens, ids, n) ? 0 : EXIT_USAGE;
    polar_error err;
    char *text = NULL;
    if (chat && polar_chat_prompt(tok, system, prompt, &text, &err) != POLAR_OK) return fail_status(cmd, &err);
    const char *src = text ? text : prompt;
    /* A chat prompt spells its own special tokens; raw text gets BOS when the
     * tokenizer asks for it. */
    polar_status st = polar_tokenize(tok, src, strlen(src), chat, !chat, ids, n, &err);
    polar_free(text);
    if (st != POLAR_OK) return fail_status(cmd, &err);
    if (*n == 0) return fail_usage(cmd, "--prompt gives no tokens");
    return 0;
}

int cmd_run(int argc, char **argv) {
    const char *cmd = "run", *model_arg = NULL, *tokens = NULL, *prompt = NULL, *program_text = "base";
    const char *system = NULL;
    const char *predictor = NULL, *encoder = NULL, *device_text = NULL, *kv_text = NULL, *decode = NULL;
    cli_tp_args tpa = CLI_TP_ARGS_INIT;
    int kv_bf16 = 0, max_new = 128, ctx = 0, threads = 0, json = 0, ignore_eos = 0, raw = 0, chat_flag = 0, max_new_set, top_n = 1;
    polar_gen_opts sampling = {.top_p = 1};
    cli_opt opts[] = {
        {"--model", OPT_STR, &model_arg, 0},   {"--tokens", OPT_STR, &tokens, 0},
        {"--prompt", OPT_STR, &prompt, 0},     {"--program", OPT_STR, &program_text, 0},
        {"--max-new", OPT_INT, &max_new, 0},   {"--ctx", OPT_INT, &ctx, 0},
        {"--threads", OPT_INT, &threads, 0},   {"--json", OPT_FLAG, &json, 0},
        {"--ignore-eos", OPT_FLAG, &ignore_eos, 0}, {"--raw", OPT_FLAG, &raw, 0},
        {"--chat", OPT_FLAG, &chat_flag, 0},   {"--system", OPT_STR, &system, 0},
        {"--predictor", OPT_STR, &predictor, 0}, {"--encoder", OPT_STR, &encoder, 0},
        {"-k", OPT_INT, &top_n, 0},            {"--device", OPT_STR, &device_text, 0},
        {"--temperature", OPT_FLOAT, &sampling.temperature, 0}, {"--top-p", OPT_FLOAT, &sampling.top_p, 0},
        {"--top-k", OPT_INT, &sampling.top_k, 0}, {"--min-p", OPT_FLOAT, &sampling.min_p, 0},
        {"--seed", OPT_U64, &sampling.seed, 0}, {"--kv", OPT_STR, &kv_text, 0},
        {"--decode", OPT_STR, &decode, 0},     CLI_TP_OPTS(tpa),
    };
    if (!parse_opts(cmd, argc, argv, opts, sizeof opts / sizeof opts[0])) return EXIT_USAGE;
    max_new_set = opts[4].seen;
    if (!!tokens + !!prompt != 1) return fail_usage(cmd, "give exactly one of --tokens or --prompt");
    if (raw && chat_flag) return fail_usage(cmd, "--raw and --chat exclude each other");
    if (tokens && !max_new_set) max_new = 16;
    int predicted = strcmp(program_text, "auto") == 0;
    if (predicted && !prompt) return fail_usage(cmd, "--program auto predicts from the question: give --prompt");
    if (!predicted && (predictor || encoder || decode || opts[14].seen))
        return fail_usage(cmd, "--predictor, --encoder, --decode and -k go with --program auto");
    polar_decode_opts decode_opts = polar_decode_defaults();
    if (decode_mode(cmd, decode, &decode_opts)) return EXIT_USAGE;
    if (top_n < 1 || top_n > 64) return fail_usage(cmd, "-k must be 1 to 64");
    if (!check_sampling(cmd, &sampling)) return EXIT_USAGE;
    polar_device device;
    if (!parse_device(cmd, device_text, &device) || !parse_kv(cmd, kv_text, &kv_bf16)) return EXIT_USAGE;
    cli_tp par;
    int tp_rc = cli_tp_setup(cmd, &tpa, &par);
    if (tp_rc) return tp_rc;
    char *model_file = find_model(cmd, model_arg);
    const char *model_path = model_file;
    if (!model_path) return 1;

    polar_error err;
    polar_model *m = NULL;
    polar_tokenizer *tok = NULL;
    polar_session *s = NULL;
    polar_candidate cand[64];
    int n_cand = 0;
    int *ids = NULL, n_ids = 0, *out = NULL, rc = 1;
    text_stream ts = {0};
    if (polar_model_load(model_path, &m, &err) != POLAR_OK) {
        rc = fail_status(cmd, &err);
        goto done;
    }
    if (prompt && polar_tokenizer_load(model_path, &tok, &err) != POLAR_OK) {
        rc = fail_status(cmd, &err);
        goto done;
    }
    /* Chat by default when the model carries a template (instruct models). */
    int chat = tok && !raw && (chat_flag || strcmp(polar_chat_template_name(tok), "none") != 0);
    if ((rc = prompt_ids(cmd, tokens, prompt, tok, chat, system, &ids, &n_ids)) != 0) goto done;
    rc = 1;
    polar_model_info info;
    polar_model_info_get(m, &info);
    /* The programs to run: the one given, or the predictor's top N. */
    if (predicted) {
        if ((rc = predict_programs(cmd, model_path, info.arch.n_layers, predictor, encoder, prompt, &decode_opts, cand,
                                   top_n, &n_cand,
                                   NULL, NULL)))
            goto done;
        rc = 1;
    } else if (polar_program_parse(program_text, info.arch.n_layers, 0, &cand[0].program, &err) != POLAR_OK) {
        rc = fail_status(cmd, &err);
        goto done;
    } else {
        n_cand = 1;
    }
    int cap = 0;
    for (int i = 0; i < n_cand; i++) cap = cand[i].program.n > cap ? cand[i].program.n : cap;
    if (ctx == 0) ctx = n_ids + (max_new > 0 ? max_new : 1);
    polar_session_opts so = {.max_ctx = ctx, .max_program_len = cap, .n_threads = threads, .device = device,
                             .kv_bf16 = kv_bf16, .tp = par.tp, .tp_devices = par.devices, .tp_world = par.world,
                             .tp_rank = par.rank, .tp_nccl_id = par.nccl_id};
    out = malloc((size_t)(max_new > 0 ? max_new : 1) * sizeof *out);
    if (!out) {
        fprintf(stderr, "polar run: error: out of memory\n");
        goto done;
    }
    if (polar_session_create(m, &cand[0].program, &so, &s, &err) != POLAR_OK) {
        rc = fail_status(cmd, &err);
        goto done;
    }
    const char *kv = polar_session_kv_type(s);
    for (int c = 0; c < n_cand; c++) {
        const polar_program *prog = &cand[c].program;
        if (polar_session_set_program(s, prog, &err) != POLAR_OK) {
            rc = fail_status(cmd, &err);
            goto done;
        }
        char text[4096];
        polar_program_format(prog, text, sizeof text);
        if (!json) {
            if (predicted) printf("%s== predicted program %d of %d (score %.4f)\n", c ? "\n" : "", c + 1, n_cand,
                                  cand[c].score);
            printf("program: %s\nexecuted layers: %d of %d\ndevice: %s", text, prog->n, info.arch.n_layers,
                   polar_session_device(s));
            if (par.tp) printf(" (tensor parallel: %d GPU%s here, %d in all)", par.tp, par.tp == 1 ? "" : "s",
                               par.world ? par.world : par.tp);
            printf("\nKV cache: %s\nprompt tokens: %d\n%s", kv, n_ids, tok ? "" : "generated:");
            fflush(stdout);
        }
        int stop = tok ? polar_tokenizer_end_of_turn(tok) : -1;
        polar_gen_opts go = sampling;
        go.max_new = max_new, go.ignore_eos = ignore_eos, go.stop = &stop, go.n_stop = stop >= 0;
        ts.len = ts.n_pending = 0;
        ts.tok = tok;
        ts.print = !json;
        ts.stop_id = stop;
        polar_gen_stats st;
        polar_token_cb cb = tok ? on_text_token : json ? NULL : on_id_token;
        if (polar_generate(s, ids, n_ids, &go, out, &st, cb, &ts, &err) != POLAR_OK) {
            if (!json) printf("\n");
            rc = fail_status(cmd, &err);
            goto done;
        }
        if (json) {
            print_json(prog, &info.arch, kv, n_ids, out, &st, tok ? &ts : NULL);
        } else {
            fwrite(ts.pending, 1, ts.n_pending, stdout);
            int steps = st.n_generated > 1 ? st.n_generated - 1 : 0;
            printf("%s\nprefill: %.2f ms (%d tokens)\ndecode: %.2f ms/token (%d steps)\n",
                   st.stopped_at_eos ? (tok ? "" : " [eos]") : "", st.prefill_ms, n_ids,
                   steps ? st.decode_ms / steps : 0.0, steps);
        }
    }
    rc = 0;
done:
    polar_session_free(s);
    for (int c = 0; c < n_cand; c++) polar_program_free(&cand[c].program);
    polar_tokenizer_free(tok);
    polar_model_free(m);
    polar_free(model_file);
    polar_free(ids);
    free(out);
    free(ts.text);
    return rc;
}

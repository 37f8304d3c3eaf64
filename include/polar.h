/* polar: run a pretrained decoder-only LLM as a program of layers.
 *
 * The public C API. Every call that can fail returns a polar_status and, when
 * the caller passes a non-NULL polar_error, fills it with the same code and a
 * one-line message saying what failed, where, and why. The library holds no
 * global mutable state: models and sessions are independent objects, and a
 * model may be shared read-only by several sessions on several threads (one
 * thread per session at a time).
 */
#ifndef POLAR_H
#define POLAR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define POLAR_VERSION "0.2.0" /* 0.2: polar_arch's rope_type, polar_gen_opts' top_k / min_p, polar_sample's options */

typedef enum {
    POLAR_OK = 0,
    POLAR_ERR_ARG,         /* bad argument from the caller */
    POLAR_ERR_IO,          /* file missing, unreadable, unwritable */
    POLAR_ERR_FORMAT,      /* malformed file: JSON, safetensors */
    POLAR_ERR_CONFIG,      /* config.json missing, mistyped or inconsistent fields */
    POLAR_ERR_UNSUPPORTED, /* valid input this build cannot run (model type, rope type, device) */
    POLAR_ERR_PROGRAM,     /* program text malformed or out of range */
    POLAR_ERR_RANGE,       /* token id outside the vocabulary, context full */
    POLAR_ERR_NOMEM,       /* allocation failed */
    POLAR_ERR_FULL,        /* a batch has no room for another sequence now: retry once one has ended */
} polar_status;

typedef struct {
    polar_status code;
    char msg[512];
} polar_error;

/* Name of a status code, e.g. "format". */
const char *polar_status_name(polar_status s);

/* ------------------------------------------------------------------ models */

typedef struct polar_model polar_model;

/* RoPE frequency scaling, as transformers' rope_type names it. */
enum { POLAR_ROPE_DEFAULT = 0, POLAR_ROPE_LLAMA3, POLAR_ROPE_LINEAR, POLAR_ROPE_YARN };

/* The architecture of a model: what config.json says, normalised. */
typedef struct {
    char arch[16];          /* "llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe" */
    int n_layers;           /* D */
    int hidden;             /* model width */
    int n_heads;            /* query heads */
    int n_kv_heads;         /* key/value heads (GQA groups) */
    int head_dim;           /* per-head width; may differ from hidden/n_heads (Qwen3) */
    int ffn;                /* MLP intermediate size */
    int vocab;
    int max_pos;            /* max_position_embeddings */
    double rope_theta;
    int rope_type;          /* POLAR_ROPE_*: the frequency scaling in force, with the fields below */
    double rope_factor;     /* llama3, linear (inv_freq / factor), yarn */
    double rope_low_freq_factor, rope_high_freq_factor; /* llama3 */
    int rope_original_max_pos;       /* llama3, yarn: the pretraining context */
    double rope_beta_fast, rope_beta_slow; /* yarn: rotations over that context bounding the ramp
                                            * (config.json's defaults: 32, 1) */
    int rope_truncate;               /* yarn: the ramp's ends rounded out to whole dimensions (default 1) */
    double rope_attention_factor;    /* yarn: cos and sin times this; 0: 0.1 ln(factor) + 1 */
    double rms_eps;
    int tied_embeddings;    /* lm_head shares the token embedding */
    int qkv_bias;           /* q/k/v projections carry a bias (Qwen2) */
    int qk_norm;            /* per-head RMSNorm of q and k before RoPE (Qwen3) */
    int n_eos;
    int eos[8];             /* end-of-sequence ids (config + generation_config) */
    /* Mixture of experts (qwen2_moe, qwen3_moe); n_experts = 0 for dense models.
     * Layer l is an MoE layer when l is not in mlp_only and
     * (l + 1) % sparse_step == 0; other layers have a dense MLP of width ffn. */
    int n_experts;
    int top_k;              /* experts per token */
    int moe_ffn;            /* width of each expert's SwiGLU MLP */
    int shared_ffn;         /* width of the sigmoid-gated shared expert; 0: none */
    int norm_topk;          /* renormalise the top-k routing weights to sum 1 */
    int sparse_step;
    int n_mlp_only;
    int mlp_only[64];
} polar_arch;

/* 1 when layer l of this architecture is a mixture-of-experts layer. */
int polar_arch_layer_is_moe(const polar_arch *a, int l);

typedef struct {
    polar_arch arch;
    size_t n_params;
    size_t layer_bytes;     /* bytes of weights of one decoder layer (bf16), averaged over layers */
    size_t embed_bytes;     /* token embedding table */
    size_t head_bytes;      /* final norm + lm_head (0 extra when tied, beyond the norm) */
    size_t weight_bytes;    /* all weights, in bf16 */
    size_t stored_bytes;    /* all weights as the model holds them: a GGUF's kept blocks in their bytes, the
                             * rest bf16 (weight_bytes for a Hugging Face checkpoint) */
} polar_model_info;

/* Load a Hugging Face checkpoint directory (config.json + model.safetensors
 * or a sharded model.safetensors.index.json). BF16 tensors are used in place
 * from the mapped file; F16/F32 are converted to bf16. */
polar_status polar_model_load(const char *dir, polar_model **out, polar_error *err);

/* Default shape for an architecture ("llama", "qwen2", "qwen3", "qwen2_moe",
 * "qwen3_moe"): a tiny model
 * for tests and demos. Fields may be edited before polar_model_random. */
polar_status polar_arch_default(const char *arch, polar_arch *out, polar_error *err);

/* Real shapes: "llama-3.2-1b", "llama-3.2-3b", "qwen2.5-3b", "qwen3-8b",
 * "qwen1.5-moe-a2.7b", "qwen3-embedding-0.6b", "qwen2.5-0.5b"
 * (polar_preset_names lists them). */
polar_status polar_arch_preset(const char *name, polar_arch *out, polar_error *err);

/* Names of the presets, NULL-terminated. */
const char *const *polar_preset_names(void);

/* A model with deterministic random weights (rounded to bf16) of this shape,
 * built in memory. The same arch and seed give the same weights. */
polar_status polar_model_random(const polar_arch *arch, uint64_t seed, polar_model **out,
                                polar_error *err);

/* Write a model as a checkpoint directory: config.json + model.safetensors. */
polar_status polar_model_save(const polar_model *m, const char *dir, polar_error *err);

polar_status polar_model_info_get(const polar_model *m, polar_model_info *out);
void polar_model_free(polar_model *m);

/* ---------------------------------------------------------------- programs */

/* A program: the sequence of layer indices executed, each in [0, D). */
typedef struct {
    int n;
    int *layers;
} polar_program;

/* Parse program text: "base", or comma-separated terms "A", "A-B" with an
 * optional "xN" suffix, or a JSON list of ints. Whitespace is ignored.
 * max_len <= 0 means the default limit 4*D. Errors name the character
 * position (1-based column) of the fault. Free with polar_program_free. */
polar_status polar_program_parse(const char *text, int n_layers, int max_len, polar_program *out,
                                 polar_error *err);

/* The base program 0..D-1. */
polar_status polar_program_base(int n_layers, polar_program *out, polar_error *err);

/* Write a program in its shortest text form ("0-5,6-7x2,9-27"); returns the
 * length it needs (like snprintf), or -1 when out of memory. */
int polar_program_format(const polar_program *p, char *buf, size_t size);

void polar_program_free(polar_program *p);

/* ---------------------------------------------------------------- sessions */

typedef struct polar_session polar_session;

typedef enum {
    POLAR_DEVICE_AUTO = 0, /* CUDA when this build has it and a GPU is present, else the CPU */
    POLAR_DEVICE_CPU,
    POLAR_DEVICE_CUDA,
} polar_device;

typedef struct {
    int max_ctx;         /* tokens the KV cache holds; 0: min(max_pos, 4096) */
    int max_program_len; /* execution positions the cache holds; 0: the program's length */
    int n_threads;       /* CPU threads; 0: all available */
    polar_device device;
    /* CPU only: round to bf16 where the CUDA backend does (the KV cache, and
     * the activations entering its tensor-core GEMMs in prefill chunks of
     * more than 8 tokens), so a CPU session is a tight reference for a GPU
     * one. 0: f32 throughout (the reference math). */
    int round_like_cuda;
    /* CPU only: keep the KV cache in bf16 (rounded to nearest even), as the
     * GPU always does: half the memory and half the bytes attention reads;
     * the attention math stays f32, so the results are those of
     * round_like_cuda's rounded cache. 0: f32 (the reference math). */
    int kv_bf16;
    /* CPU only: keep the residual stream of the last prompt (prefilled from
     * position 0) before every program entry, so when the same prompt comes
     * again under a program whose first L entries are the same (a program
     * search's neighbours), prefill resumes at entry L: the prompt's KV slots
     * 0..L-1 are still the ones that program would write. Exactly the same
     * results; costs (max_program_len + 1) x max_ctx x hidden floats. */
    int share_prompt;
    /* Tensor parallel over tp GPUs through NCCL (as polar_batch_opts): 0:
     * one GPU without NCCL. */
    int tp;
    const int *tp_devices; /* the tp GPUs, rank 0 first (NULL: 0..tp-1) */
    int tp_world, tp_rank; /* several processes (as polar_batch_opts) */
    const void *tp_nccl_id;
} polar_session_opts;

/* The device a session computes on ("cpu" or "cuda"). */
const char *polar_session_device(const polar_session *s);
/* The type of its K/V rows: "f32", or "bf16" (kv_bf16, or on the GPU). */
const char *polar_session_kv_type(const polar_session *s);
/* On a GPU, how its kernels are launched: "overlapped" (each may start
 * while the one before it finishes: programmatic dependent launch, compute
 * capability 9.0 and later), or "serial: " and why (an older GPU,
 * POLAR_CUDA_PDL=0 in the environment, or a driver that would not capture
 * overlapping launches in a graph, which a session finds at its first
 * decode graph and then goes on without). NULL on the CPU. */
const char *polar_session_cuda_launches(const polar_session *s);
/* On a GPU, the kernels (and into *copies, which may be NULL, the memcpy
 * and memset nodes) of the session's last step when it ran as a CUDA graph:
 * a decode step's launches; -1 otherwise (polar_batch_graph_kernels). */
int polar_session_graph_kernels(const polar_session *s, int *copies);
/* Device memory a session (a batch) holds on a GPU (its first GPU under tensor
 * parallel), in bytes asked of cudaMalloc: the model's weights as they went
 * up (bf16, or a GGUF's blocks with POLAR_CUDA_BLOCKS=1; shared by every
 * batch of the model on that GPU), the paged KV pool, and the rest
 * (workspaces of a pass, the steps' state, cuBLASLt's workspace). */
typedef struct {
    size_t weights, kv, workspaces;
} polar_device_memory;
/* POLAR_ERR_UNSUPPORTED on the CPU. */
polar_status polar_session_device_memory(const polar_session *s, polar_device_memory *out, polar_error *err);

/* The CPU kernels this process runs: "generic" (plain C), "avx2", "avx512"
 * or "neon", the best the CPU supports unless the environment variable
 * POLAR_CPU names another it can run (read once, at the first CPU kernel). */
const char *polar_cpu_kernels(void);

/* 1 when this build has the CUDA backend and a GPU is usable; *why says
 * why not (may be NULL). */
int polar_cuda_available(char *why, size_t why_size);

/* Create a session running `program` on `m`. The KV cache (one slot per
 * execution position per token) and every workspace are allocated here;
 * nothing is allocated per token. The model must outlive the session. */
polar_status polar_session_create(const polar_model *m, const polar_program *program,
                                  const polar_session_opts *opts, polar_session **out,
                                  polar_error *err);

void polar_session_free(polar_session *s);

/* Replace the program (length <= max_program_len) and clear the cache. */
polar_status polar_session_set_program(polar_session *s, const polar_program *program,
                                       polar_error *err);

/* Forget every token: the cache is empty again. */
void polar_session_reset(polar_session *s);

/* With share_prompt: the program entries the last prefill from position 0
 * resumed instead of running (its prompt ran n_program - this entries). */
int polar_session_prompt_reused(const polar_session *s);

/* CPU threads the session computes with. */
int polar_session_threads(const polar_session *s);

/* Tokens in the cache so far. */
int polar_session_pos(const polar_session *s);

/* Append n tokens: run them through the program, filling the cache. The
 * logits of the last one become polar_logits(). When all_logits is not
 * NULL it receives the logits of every appended token (n x vocab). */
polar_status polar_prefill(polar_session *s, const int *tokens, int n, float *all_logits,
                           polar_error *err);

/* Append one token (same as polar_prefill with n = 1). */
polar_status polar_decode_step(polar_session *s, int token, polar_error *err);

/* Logits (vocab floats) of the last token appended; NULL before any. */
const float *polar_logits(const polar_session *s);

/* Index of the largest logit, the lowest index on ties; NaNs are passed
 * over, and 0 is returned when no logit is above -infinity (as the GPU's
 * argmax does). */
int polar_argmax(const float *logits, int n);

/* A seeded random stream (splitmix64): one per sequence, never shared
 * between threads; the same seed gives the same stream everywhere. */
typedef struct {
    uint64_t state;
} polar_rng;
void polar_rng_seed(polar_rng *r, uint64_t seed);
double polar_rng_uniform(polar_rng *r); /* in [0, 1) */

/* Bytes of work space polar_sample needs for n logits. */
size_t polar_sample_work_bytes(int n);

typedef struct {
    int max_new;        /* tokens to generate at most */
    int ignore_eos;     /* 1: do not stop at an eos id */
    const int *stop;    /* further ids that end generation (e.g. end of turn) */
    int n_stop;
    float temperature;  /* 0 (the default): greedy; else sampled (polar_sample) */
    int top_k;          /* the k most likely tokens (and any as likely as the k-th); 0: every token */
    float top_p;        /* nucleus when 0 < top_p < 1; 0 or >= 1: every token */
    float min_p;        /* drop tokens under min_p times the most likely one's probability; 0: off */
    uint64_t seed;      /* the sampler's seed: the same seed, the same tokens */
} polar_gen_opts;

/* A token drawn from softmax(logits / o->temperature), narrowed in
 * transformers' order: to the top_k most likely tokens, then to the
 * smallest set of the most likely of those whose probability reaches top_p
 * (ties to the lower id), then to those at least min_p times as likely as
 * the most likely one; renormalised. temperature <= 0 (or o or rng NULL):
 * the argmax. work: polar_sample_work_bytes(n) bytes the caller owns
 * (nothing is allocated). Only the sampling fields of o are read. */
int polar_sample(const float *logits, int n, const polar_gen_opts *o, polar_rng *rng, void *work);

typedef struct {
    int n_prompt;
    int n_generated;
    int stopped_at_eos;
    double prefill_ms;
    double decode_ms;   /* total over the decode steps (n_generated - 1 of them) */
} polar_gen_stats;

/* Called after each generated token; return non-zero to stop early. */
typedef int (*polar_token_cb)(int token, void *user);

/* Generation: reset, prefill the prompt, then pick the next token (the
 * argmax, or a sample when opts->temperature > 0) and feed it back until an
 * eos id or max_new tokens. out must hold max_new ids. Greedy decoding on
 * CUDA keeps the argmax on the device; sampling reads each step's logits. */
polar_status polar_generate(polar_session *s, const int *prompt, int n_prompt,
                            const polar_gen_opts *opts, int *out, polar_gen_stats *stats,
                            polar_token_cb cb, void *user, polar_error *err);

/* ----------------------------------------------------------------- batches */

/* A batch runs many sequences at once on one model, each with its own
 * program, prompt and generation options (continuous batching: sequences
 * join and leave between steps). A step advances every sequence by one
 * token, or by a chunk of its prompt, and reads each layer's weights once
 * for all the sequences whose programs run that layer at that point: the
 * sequences' next entries are served lowest layer first, so programs that
 * skip or repeat layers of the base order share the passes of the others.
 * Every sequence gets exactly the logits and tokens it would get alone in a
 * session (CPU: bit for bit).
 *
 * The KV cache is one pool of 16-token blocks, with a block table per
 * sequence and execution position. A sequence is admitted only when the
 * pool can hold its whole worst case (program length x (prompt + max_new -
 * 1) tokens); else polar_batch_add answers POLAR_ERR_FULL and the caller
 * retries after a sequence has ended. So a running sequence never waits or
 * is evicted, and blocks go back to the pool as soon as a sequence ends
 * (an eos before max_new returns its unused promise too).
 *
 * Sequences added with the same prompt before the first of them has started
 * it share it: the later ones follow the oldest through the program entries
 * they have in common with it (a sample of the same program: all of them)
 * and compute only from where their programs part; the K/V of the shared
 * entries for the prompt are the leader's blocks. The result is the same.
 *
 * With a prefix cache (opts.prefix_cache_bytes), prompts share across time
 * too: the K/V and residual stream of each 16-token prompt block (the last
 * may be shorter) at each program entry are kept, keyed by a 64-bit hash of
 * the tokens up to the block's end and one of the program's entries up to
 * that one (the one way to a wrong result: two token prefixes, or two entry
 * prefixes, whose hashes collide; about n^2 / 2^65 for n distinct ones). A
 * later prompt starting with the same tokens under a program starting with
 * the same entries maps those K/V blocks and computes each block only from
 * the first entry the cache lacks: a few-shot prefix common to many
 * questions, or a program search's neighbours that part after their first L
 * entries, runs once (the same prompt under the same program: its last
 * token's row comes from the cache too). A partial last block is copied
 * rather than shared, as the sequence's own tokens go on filling it. A
 * prompt that starts like one being run (its first block, under the same
 * first entry) waits while that one runs and the cache lacks what it will
 * leave (the last block they share at the last entry they share), then
 * finds it; so with a cache, sequences added together with the same prompt
 * do this instead of following the first (which would share only the
 * entries their programs have in common with it). Least recently used items
 * go first when the cache is full, and those no sequence maps when the pool
 * must admit a sequence. The result is the same (CPU: bit for bit: a row's
 * sums do not depend on the rows beside it).
 *
 * Everything is allocated by polar_batch_create; adding a sequence copies
 * its prompt, program and stop ids into its slot. A batch is used by one
 * thread at a time; several batches (and sessions) may share a model on
 * several threads.
 *
 * On a GPU (opts.device POLAR_DEVICE_CUDA, a build with CUDA) the step is
 * planned the same way on the host and run on the device: the K/V pool is
 * bf16 there, every layer pass gathers its rows and runs the GEMVs (up to
 * 8 rows) or tensor-core GEMMs (more rows, inputs rounded to bf16) and
 * split-K attention over each row's own block table; greedy tokens are
 * chosen there and only sampled sequences' logits come back with the step
 * (polar_batch_logits copies others on request). A decode step with the
 * same calls as the step before (the same sequences and programs) is
 * captured as a CUDA graph and replayed by later such steps
 * (polar_batch_stats.graph; POLAR_CUDA_GRAPHS=0 in the environment turns
 * it off). Results agree with the CPU within
 * the GPU's rounding (a CPU batch with round_like_cuda is the tight
 * reference), not bit for bit. The prefix cache works the same (its
 * residual rows on the device). A device error fails the step
 * and leaves the batch unusable: every later add or step answers
 * POLAR_ERR_IO; free it. */
typedef struct polar_batch polar_batch;

#define POLAR_BATCH_MAX_STOP 16 /* stop ids a sequence may give besides the model's eos */

typedef struct {
    int max_seqs;        /* sequences held at once (running or ended, until removed); 0: 16 */
    int max_ctx;         /* tokens per sequence, prompt + generated; 0: min(max_pos, 2048) */
    int max_program_len; /* entries per program; 0: 2 x n_layers */
    size_t kv_bytes;     /* the KV pool; 0: room for max_seqs sequences of n_layers entries x max_ctx tokens */
    int step_tokens;     /* tokens one step runs at most, decode tokens first, then prompt chunks; 0: 64
                          * (never fewer than max_seqs) */
    int n_threads;       /* CPU threads; 0: all available */
    polar_device device; /* CPU, CUDA (see above), or AUTO: CUDA when this build has it and a GPU is present */
    /* CPU only: round to bf16 where the CUDA step does (the K/V pool; the
     * inputs of passes, and of head slices, of more than 8 rows), so a CPU
     * batch is a tight reference for a GPU one (as polar_session_opts). */
    int round_like_cuda;
    int kv_bf16;         /* CPU only: the K/V pool in bf16 (as polar_session_opts; CUDA's always is) */
    size_t prefix_cache_bytes; /* the prefix cache, on top of kv_bytes (an item: a pool block of 16 K/V rows
                                * and 16 x hidden floats of residual rows; each sequence slot then also
                                * holds max_ctx x hidden floats of them, on the batch's device; bf16 K/V
                                * rows make a CUDA item smaller, so the same bytes hold more); 0: none */
    /* Tensor parallel (docs/cuda.md): the model split over tp GPUs through
     * NCCL, each holding its share of the heads (and their KV cache), MLP
     * columns, experts and head rows, every step run on all of them; a CUDA
     * batch. 0: one GPU without NCCL; 1: one GPU through NCCL. NCCL runs one
     * rank per GPU: a machine with one GPU runs tp 1 at most. Shapes that do
     * not split (more ranks than heads, experts or vocabulary rows, heads
     * that cannot go out in whole groups sharing a key/value head) are
     * refused with POLAR_ERR_UNSUPPORTED. */
    int tp;
    const int *tp_devices; /* the tp GPUs, rank 0 first (NULL: 0..tp-1) */
    /* Several processes (one per node), each with its tp GPUs: tp_world
     * ranks in all, this process's GPUs ranks tp_rank .. tp_rank + tp - 1,
     * joined under tp_nccl_id (POLAR_NCCL_ID_BYTES made by polar_nccl_id in
     * the process holding rank 0, the same bytes given to every process).
     * Every process must then add the same sequences in the same order and
     * step alike. tp_world 0: this process's tp GPUs alone. */
    int tp_world, tp_rank;
    const void *tp_nccl_id;
} polar_batch_opts;

/* A new NCCL unique id (ncclGetUniqueId) for a tensor-parallel group of
 * several processes (polar_batch_opts.tp_nccl_id): made by the process that
 * holds rank 0, which must stay up while the others join. */
#define POLAR_NCCL_ID_BYTES 128
polar_status polar_nccl_id(unsigned char id[POLAR_NCCL_ID_BYTES], polar_error *err);

/* KV pool bytes for n_seqs sequences of program_len entries x n_tokens
 * tokens each in a batch of these options (their device and kv_bf16: f32
 * rows on the CPU unless kv_bf16, bf16 on CUDA): a polar_batch_opts.kv_bytes
 * that never refuses them. */
size_t polar_batch_kv_bytes(const polar_model *m, const polar_batch_opts *opts, int n_seqs, int program_len,
                            int n_tokens);

polar_status polar_batch_create(const polar_model *m, const polar_batch_opts *opts, polar_batch **out,
                                polar_error *err);
void polar_batch_free(polar_batch *b);

/* Add a sequence: program (<= max_program_len entries), prompt (>= 1
 * token) and generation options (as polar_generate's; stop ids at most
 * POLAR_BATCH_MAX_STOP). Its id goes to *id. POLAR_ERR_FULL: every slot
 * is held, or the KV pool cannot promise its blocks; nothing changed. */
polar_status polar_batch_add(polar_batch *b, const polar_program *program, const int *prompt, int n_prompt,
                             const polar_gen_opts *gen, int *id, polar_error *err);

typedef struct {
    int sequences;        /* sequences that ran a token this step */
    int decode_tokens;    /* of them, one generated token each */
    int prompt_tokens;    /* prompt tokens run (chunks of prompts being prefilled) */
    int shared_prompt_tokens; /* of them, tokens of sequences following a leader with the same prompt */
    int shared_entries;   /* (token, program entry) pairs those did not compute */
    int cached_entries;   /* (token, program entry) pairs of the prompts that started this step found in the
                           * prefix cache */
    int finished;         /* sequences that ended with this step */
    int layer_passes;     /* layer-weight reads the step made */
    int min_layer_passes; /* a lower bound for these programs: the longest program, or the sum over layers of
                           * the most times one program runs it, whichever is larger (each program from the
                           * first entry it runs this step: prompt blocks found in the prefix cache start later) */
    int graph;            /* CUDA: 1 the step replayed a graph captured from an earlier step of the same calls
                           * (a decode step of the same sequences and programs), 2 it was captured now; 0 it went
                           * call by call (or the CPU) */
} polar_batch_stats;

/* One step for every sequence with work left. Nothing to do is not an
 * error (stats->sequences = 0). */
polar_status polar_batch_step(polar_batch *b, polar_batch_stats *stats, polar_error *err);

/* Called with each token a sequence generates in polar_batch_run (after it
 * is recorded: polar_batch_logits gives the logits it was chosen from);
 * return non-zero to end that sequence's generation there. */
typedef int (*polar_batch_token_cb)(int id, int token, void *user);

typedef struct {
    int steps;         /* steps taken */
    int steps_ahead;   /* of them, queued while the step before them ran */
    int graph_replays; /* of them, replays of a CUDA graph captured at an earlier step */
    int tokens;        /* tokens generated */
    int wasted_rows;   /* rows run ahead for a sequence that had stopped at the step before */
} polar_batch_run_stats;

/* Steps until no sequence has work left or max_steps were taken (stats may
 * be NULL). While every sequence with work decodes greedily, a GPU runs
 * ahead: step i + 1 is queued, fed step i's argmax on the device, before
 * the host reads step i's tokens, so the GPU never waits for the host (a
 * sequence that stops at step i wastes its row of step i + 1, which is
 * disregarded). The tokens are those of polar_batch_step. */
polar_status polar_batch_run(polar_batch *b, int max_steps, polar_batch_token_cb on_token, void *user,
                             polar_batch_run_stats *stats, polar_error *err);

/* Open a sequence for appends: a program and room for n_tokens tokens (its
 * KV promise, made now; POLAR_ERR_FULL as polar_batch_add). It starts idle
 * and stays in the batch, its cache kept, between appends until cancelled
 * or removed: scoring, perplexity, a session. */
polar_status polar_batch_open(polar_batch *b, const polar_program *program, int n_tokens, int *id, polar_error *err);

/* Per-token outputs of an append, in the caller's memory (each may be
 * NULL), filled as the steps run the tokens: every appended token's logits
 * (n x vocab) and final-normed hidden state (n x hidden). On a CUDA batch
 * hidden may also be device memory (cudaMalloc'd, on any of the process's
 * GPUs): the states are copied there without a trip through the host. */
typedef struct {
    float *logits;
    float *hidden;
} polar_batch_outputs;

/* Append n tokens to an idle opened sequence, to be run by the next steps
 * (in chunks of the step's budget), after its tokens so far. Then, with gen
 * and gen->max_new > 0, generate as polar_batch_add does; else it goes
 * idle again, polar_batch_logits giving the last token's logits (unless
 * out asked for hidden states only). The first append to a sequence is its
 * prompt (prompt sharing and the prefix cache; an append asking for
 * outputs computes every row, finding nothing in the cache). A generation
 * that stops leaves its last token out of the cache: append it to go on.
 * POLAR_ERR_RANGE when the tokens (and those to generate) do not fit the
 * room it was opened with. */
polar_status polar_batch_append(polar_batch *b, int id, const int *tokens, int n, const polar_gen_opts *gen,
                                const polar_batch_outputs *out, polar_error *err);

typedef enum {
    POLAR_SEQ_PREFILL, /* its prompt (or appended tokens) is still being run */
    POLAR_SEQ_DECODE,  /* generating */
    POLAR_SEQ_ENDED,   /* eos, a stop id, max_new, or cancelled: its KV blocks are back in the pool */
    POLAR_SEQ_IDLE,    /* opened (polar_batch_open): every token run, nothing to generate, its cache kept */
} polar_seq_state;

typedef struct {
    polar_seq_state state;
    int n_prompt, n_generated;
    int stopped_at_eos;
    long prompt_skipped;  /* (prompt token, program entry) pairs it did not compute: it followed a sequence
                           * with the same prompt, or found them in the prefix cache */
    const int *tokens;    /* the n_generated ids of its last generation so far; valid until the sequence is
                           * removed or appended to */
    int n_past;           /* tokens in its KV cache */
    int prompt_resumed;   /* program entries at which all of its prompt came from the prefix cache (its prompt
                           * ran the rest) */
} polar_seq_info;

/* A sequence's state and tokens. POLAR_ERR_ARG for an unknown id. */
polar_status polar_batch_seq(const polar_batch *b, int id, polar_seq_info *info, polar_error *err);

/* Logits (vocab floats) the sequence's last token was chosen from, when
 * the last step chose it; NULL otherwise (before its first token, or a
 * step without one of it). Valid until the next step. On a CUDA batch
 * greedy tokens are chosen on the GPU and only sampled rows come to the
 * host with the step: the first call for another sequence copies its row
 * then (NULL if that copy fails), so this call too uses the batch (one
 * thread at a time). */
const float *polar_batch_logits(const polar_batch *b, int id);

/* End a sequence now (its blocks go back to the pool); its tokens stay
 * readable until it is removed. */
polar_status polar_batch_cancel(polar_batch *b, int id, polar_error *err);

/* Forget a sequence (cancelling it if it still runs): its slot is free. */
polar_status polar_batch_remove(polar_batch *b, int id, polar_error *err);

/* Sequences with work left: tokens to run or to generate (not ended, not idle). */
int polar_batch_running(const polar_batch *b);

/* A batch's KV pool, in blocks of 16 token rows (the K and V of one
 * execution position): what a server reports, and what admission can still
 * promise (blocks - used - promised). */
typedef struct {
    int blocks;   /* the pool */
    int used;     /* held by sequences or by the prefix cache */
    int promised; /* reserved for running sequences, not yet held */
    int cached;   /* prefix cache items (each holds a block, which sequences may hold too) */
} polar_batch_kv_info;
void polar_batch_kv(const polar_batch *b, polar_batch_kv_info *out);

/* CPU threads the batch computes with. */
int polar_batch_threads(const polar_batch *b);
/* The device it computes on: "cpu" or "cuda". */
const char *polar_batch_device(const polar_batch *b);
/* The type of its K/V rows: "f32", or "bf16" (kv_bf16, or on the GPU). */
const char *polar_batch_kv_type(const polar_batch *b);
/* On a GPU, how its kernels are launched (polar_session_cuda_launches; a
 * batch finds a driver's refusal at its first graph capture); NULL on the
 * CPU. */
const char *polar_batch_cuda_launches(const polar_batch *b);
/* On a GPU, the device memory the batch holds (polar_device_memory);
 * POLAR_ERR_UNSUPPORTED on the CPU. */
polar_status polar_batch_device_memory(const polar_batch *b, polar_device_memory *out, polar_error *err);
/* On a GPU, the kernel nodes of the CUDA graph the last step ran as
 * (polar_batch_stats.graph 1 or 2: a decode step repeating the calls of the
 * one before), counted when it was captured (cudaGraphGetNodes; under
 * tensor parallel the first rank's, its all-reduces among them), and into
 * *copies (may be NULL) its memcpy and memset nodes. -1 for both when the
 * last step went call by call (a prompt, the first decode step of a shape,
 * POLAR_CUDA_GRAPHS=0) and on the CPU. docs/cuda.md lists the kernels. */
int polar_batch_graph_kernels(const polar_batch *b, int *copies);

/* -------------------------------------------------------------- tokenizers */

typedef struct polar_tokenizer polar_tokenizer;

/* Load a byte-level BPE tokenizer from a .gguf file, a tokenizer.json, a
 * tiktoken rank file (Llama-3 tokenizer.model, Qwen qwen.tiktoken), or a
 * folder holding one of them. */
polar_status polar_tokenizer_load(const char *path, polar_tokenizer **out, polar_error *err);
void polar_tokenizer_free(polar_tokenizer *t);
int polar_tokenizer_vocab(const polar_tokenizer *t);

/* Text (any bytes; invalid UTF-8 is kept byte for byte) -> token ids.
 * parse_special: the texts of special tokens ("<|im_end|>") become their ids.
 * add_special: add the special tokens the tokenizer's own template puts
 * around a text (Llama-3's BOS, Qwen3-Embedding's trailing <|endoftext|>).
 * *ids is allocated: release it with polar_free. */
polar_status polar_tokenize(const polar_tokenizer *t, const char *text, size_t len, int parse_special, int add_special,
                            int **ids, int *n, polar_error *err);

/* The bytes a token stands for (not NUL-terminated, may be part of a UTF-8
 * character); 0 for an id outside the vocabulary. */
int polar_token_piece(const polar_tokenizer *t, int id, const char **bytes, size_t *len);

/* Ids -> text (NUL-terminated, allocated: release with polar_free). */
polar_status polar_detokenize(const polar_tokenizer *t, const int *ids, int n, char **text, size_t *len,
                              polar_error *err);

/* Length of the prefix of s[0..n) that does not end inside a UTF-8
 * character: what may be shown of a text streamed token by token, a
 * character split across tokens held back until it is whole. */
size_t polar_utf8_complete(const char *s, size_t n);

/* Id of a token given its exact text, or -1. */
int polar_token_id(const polar_tokenizer *t, const char *text);

/* The token polar_tokenize's add_special puts first (a BOS the vocabulary
 * adds: Llama-3's <|begin_of_text|>, a GGUF's bos when add_bos_token), or -1. */
int polar_tokenizer_bos(const polar_tokenizer *t);

/* The token that ends an assistant turn in this model's chat format
 * (<|eot_id|>, <|im_end|>), or -1. */
int polar_tokenizer_end_of_turn(const polar_tokenizer *t);

/* A one-turn chat prompt in the model's own template (Llama-3 headers,
 * ChatML with Qwen2.5's default system text, Qwen3 with thinking disabled,
 * SmolLM2's). system may be NULL (the template's default). *out is
 * allocated: release it with polar_free. Fails when the tokenizer carries no
 * known template. */
polar_status polar_chat_prompt(const polar_tokenizer *t, const char *system, const char *user, char **out,
                               polar_error *err);

/* One turn of a conversation: role "system", "user" or "assistant". */
typedef struct {
    const char *role;
    const char *content;
} polar_chat_message;

/* A conversation in the model's own template, ending with the assistant's
 * generation prompt (polar_chat_prompt is the one-turn case: its system
 * text, when given, then the user's). The template's default system text
 * comes first when the first turn is not "system". POLAR_ERR_ARG for
 * another role; *out as polar_chat_prompt's. */
polar_status polar_chat_format(const polar_tokenizer *t, const polar_chat_message *msgs, int n, char **out,
                               polar_error *err);

/* Name of the chat template ("llama3", "chatml", "qwen3", "smollm2", "none"). */
const char *polar_chat_template_name(const polar_tokenizer *t);

void polar_free(void *p);

/* --------------------------------------------------------------- predictor */

/* The PoLar predictor: token states of the question (T x d_q, from a frozen
 * encoder model) -> per-layer segment-start logits (D) and op logits (D x 3:
 * 0 skip, 1 keep, 2 repeat), for a model of D layers. */
typedef struct polar_predictor polar_predictor;

/* A fixed set of distinct programs of D layers, each held in segment form
 * (polar_program_to_segments, segments of at most kmax layers), for the
 * catalogue decoder (polar_catalogue_rank). */
typedef struct polar_catalogue polar_catalogue;

/* Load predictor weights (safetensors with the reference's PyTorch names:
 * q_proj, layer_embedding, cross_attn, layer_encoder.layers.N, seg_head,
 * op_head). D, d, d_q come from the shapes; the head count from the file's
 * metadata "nheads" (default 4); the catalogue polar train stored from
 * metadata "programs" (none without it). */
polar_status polar_predictor_load(const char *path, polar_predictor **out, polar_error *err);
void polar_predictor_free(polar_predictor *p);
int polar_predictor_layers(const polar_predictor *p);    /* D */
int polar_predictor_input_dim(const polar_predictor *p); /* d_q */

/* Run the predictor on a device from now on: POLAR_DEVICE_CUDA uploads the
 * weights and workspaces for up to 512 tokens and runs the network as one
 * fused kernel; POLAR_DEVICE_CPU (the default) the reference. A predictor on
 * the GPU serves one thread at a time. */
polar_status polar_predictor_use_device(polar_predictor *p, polar_device device, polar_error *err);

/* Run the network on token states h[T, d_q] (T <= 512): seg[D], op[D * 3]. */
polar_status polar_predict_logits(const polar_predictor *p, const float *h, int T, float *seg, float *op,
                                  polar_error *err);

typedef struct {
    double threshold;  /* a layer starts a segment when sigmoid(seg) >= threshold (0.5) */
    int kmax;          /* longest segment (4) */
    int beam;          /* beam width (5) */
    int top_ops;       /* ops tried per segment (2) */
    int min_layers;    /* keep programs executing at least this many layers (0: no bound) */
    int max_layers;    /* ... and at most this many (0: no bound) */
    int catalogue;     /* 1: rank the predictor's catalogue (polar_catalogue_rank) instead of the beam;
                        * polar_decode_programs ignores it */
} polar_decode_opts;

/* The reference decoder's defaults: 0.5, 4, 5, 2, no bounds, the beam. */
polar_decode_opts polar_decode_defaults(void);

typedef struct {
    polar_program program;
    double score;      /* sum of the chosen ops' log-probabilities */
} polar_candidate;

/* Beam-decode the logits into up to max_out distinct programs, best first,
 * ranked as the reference decoder ranks them; the all-skip program and those
 * outside the layer bounds are dropped. Free each with polar_program_free. */
polar_status polar_decode_programs(const float *seg, const float *op, int D, const polar_decode_opts *opts,
                                   polar_candidate *out, int max_out, int *n_out, polar_error *err);

/* A catalogue of the distinct programs among programs[n] (the first of
 * equal ones kept, in order); POLAR_ERR_PROGRAM when one has no segment form. */
polar_status polar_catalogue_create(const polar_program *programs, int n, int D, int kmax, polar_catalogue **out,
                                    polar_error *err);
void polar_catalogue_free(polar_catalogue *c);
int polar_catalogue_size(const polar_catalogue *c);
const polar_program *polar_catalogue_program(const polar_catalogue *c, int i); /* NULL outside 0..size-1 */

/* Up to max_out of the catalogue's programs within opts' layer bounds, best
 * first: score = -(the training loss of the program's segment form under
 * the logits), so the program the predictor was trained to give; a tie
 * keeps the catalogue's order. Copies: free each with polar_program_free. */
polar_status polar_catalogue_rank(const polar_catalogue *c, const float *seg, const float *op,
                                  const polar_decode_opts *opts, polar_candidate *out, int max_out, int *n_out,
                                  polar_error *err);

/* The predictor's catalogue (NULL: none), and a new one for it to own and
 * save (NULL: none; POLAR_ERR_ARG when its D differs). */
const polar_catalogue *polar_predictor_catalogue(const polar_predictor *p);
polar_status polar_predictor_set_catalogue(polar_predictor *p, polar_catalogue *c, polar_error *err);

/* A question's programs, end to end: the encoder (any model the runtime
 * loads, run with any program) gives the question's token states, the
 * predictor scores the layers, the beam decoder ranks programs. Opened once
 * (predictor, encoder model, tokenizer, encoder session, buffers) for any
 * number of questions; one thread at a time. */
typedef struct polar_planner polar_planner;

/* Tokens of a question the encoder takes at most (the reference truncates
 * questions here). */
#define POLAR_PLANNER_MAX_TOKENS 512

/* The default encoder of a model of n_layers layers (polar train's, and
 * --program auto's): the model itself running layers 0..this (its first
 * quarter). */
int polar_default_encoder_last_layer(int n_layers);

/* The predictor at predictor_path for a model of n_layers layers, with the
 * encoder encoder_spec ("PATH" or "PATH@PROGRAM": the program after the
 * last '@', base without one). The predictor runs where the encoder's
 * session runs: on the GPU when the encoder does and the GPU takes the
 * fused kernel (polar_planner_note says why not). POLAR_ERR_CONFIG when
 * the predictor's layers or input width do not match the model's and the
 * encoder's. */
polar_status polar_planner_open(const char *predictor_path, const char *encoder_spec, int n_layers,
                                polar_planner **out, polar_error *err);
void polar_planner_free(polar_planner *p);

/* Where the predictor runs ("cpu" or "cuda"), and, when on the CPU beside
 * an encoder on the GPU, why (else NULL). */
const char *polar_planner_device(const polar_planner *p);
const char *polar_planner_note(const polar_planner *p);

typedef struct {
    double encoder_ms, predictor_ms, beam_ms;
    int question_tokens;  /* after truncation to POLAR_PLANNER_MAX_TOKENS */
} polar_planner_timing;

/* Up to k programs for the question, best first (free each with
 * polar_program_free); tm may be NULL. POLAR_ERR_ARG when the question
 * gives no tokens, POLAR_ERR_PROGRAM when the decoder leaves no program
 * within opts' layer bounds. */
polar_status polar_planner_predict(polar_planner *p, const char *question, const polar_decode_opts *opts,
                                   polar_candidate *out, int k, int *n_out, polar_planner_timing *tm, polar_error *err);

/* PoLar's segment form of a program: seg_start[D] (1 where a segment starts,
 * seg_start[0] = 1) and ops[D] (0 skip, 1 keep, 2 repeat at segment starts,
 * -1 elsewhere), segments of at most kmax layers. The parse reproduces the
 * reference's tie-breaks: fewest segments, then fewest skips, then most
 * repeats, then larger segments earlier. Paths it cannot express (a layer
 * run three times, reordering, a repeat that is not one segment twice)
 * fail with the reason. */
polar_status polar_program_to_segments(const polar_program *p, int D, int kmax, unsigned char *seg_start, int *ops,
                                       polar_error *err);
polar_status polar_segments_to_program(const unsigned char *seg_start, const int *ops, int D, polar_program *out,
                                       polar_error *err);

/* ------------------------------------------------------ predictor training */

/* The predictor's shape: D layers, width d, heads, feed-forward width, d_q. */
typedef struct {
    int n_layers, d_model, heads, ff, input_dim;
} polar_predictor_shape;

/* The reference's shape: d 256, 4 heads, ff 1024. */
polar_predictor_shape polar_predictor_default_shape(int n_layers, int input_dim);

/* A fresh predictor with PyTorch's default initialisation (Linear: uniform
 * +-1/sqrt(fan_in); attention in-projections Xavier-uniform with zero
 * biases; embedding N(0, 1); LayerNorm 1, 0; the second encoder layer a copy
 * of the first, as nn.TransformerEncoder makes it), from a seeded stream. */
polar_status polar_predictor_create(const polar_predictor_shape *s, uint64_t seed, polar_predictor **out,
                                    polar_error *err);

/* Write the weights (f32) under the reference names, the head count and the
 * catalogue (when it has one) in the metadata: the file polar_predictor_load
 * reads. */
polar_status polar_predictor_save(const polar_predictor *p, const char *path, polar_error *err);

/* One training example: a question's token states and one program's segment
 * form (polar_program_to_segments). Nothing is copied. */
typedef struct {
    const float *h;                 /* [T, d_q] */
    int T;                          /* 1..512 */
    const unsigned char *seg_start; /* [D] */
    const int *ops;                 /* [D]: 0..2 at segment starts, -1 elsewhere */
    float weight;                   /* >= 0; normalised to mean 1 in each batch */
} polar_train_example;

typedef struct {
    double lr;            /* peak learning rate (5e-4) */
    int warmup;           /* steps of linear warm-up from 0 (10) */
    int total_steps;      /* cosine decay to 0 over the steps after the warm-up */
    double beta1, beta2;  /* AdamW (0.9, 0.999) */
    double eps;           /* (1e-8) */
    double weight_decay;  /* (0) */
    float dropout;        /* on attention weights and in the encoder layers (0.1); 0: off */
    uint64_t seed;        /* dropout masks: the same seed, the same run */
} polar_train_opts;

/* The reference's recipe for a run of total_steps optimizer steps. */
polar_train_opts polar_train_defaults(int total_steps);

/* Training loss of a batch (the reference's): per example, BCE-with-logits
 * of the segment-start logits over positions 1..D-1 (mean) plus the cross
 * entropy of the op logits at segment starts (mean over them); the batch
 * loss is mean(w * loss) with w the weights over (their mean + 1e-8). */
typedef struct polar_trainer polar_trainer;

/* A trainer updates p's weights in place (p stays on the CPU). */
polar_status polar_trainer_create(polar_predictor *p, const polar_train_opts *o, polar_trainer **out,
                                  polar_error *err);
void polar_trainer_free(polar_trainer *t);

/* One AdamW step on a batch of n examples (training mode: dropout on),
 * OpenMP over the examples. *loss: the batch loss before the step. */
polar_status polar_train_step(polar_trainer *t, const polar_train_example *ex, int n, double *loss, polar_error *err);

/* Learning rate of the trainer's next step, and steps taken. */
double polar_trainer_lr(const polar_trainer *t);
int polar_trainer_steps(const polar_trainer *t);

/* The batch loss in evaluation mode (no dropout, no gradient). */
polar_status polar_train_loss(const polar_predictor *p, const polar_train_example *ex, int n, double *loss,
                              polar_error *err);

/* One question's training examples, from polar search labels. */
typedef struct {
    char *question;
    int n;                    /* examples */
    unsigned char *seg_start; /* [n, D] */
    int *ops;                 /* [n, D] */
    float *weight;            /* [n] */
} polar_label_question;

typedef struct {
    int n_layers;                /* D */
    polar_label_question *q;     /* questions with at least one example, in file order */
    int n, cap;
    int lines;                   /* lines read */
    int merged;                  /* lines whose question an earlier line asked: their programs pooled with its */
    int duplicates;              /* valid programs a question held already (counted, taken once) */
    int no_examples;             /* questions that gave none (no valid program, or all rejected) */
    int programs;                /* valid programs taken (after the max_paths choice) */
    int rejected;                /* ... that the segment form cannot express (skipped) */
    int capped;                  /* valid programs left out by the max_paths choice */
} polar_train_labels;

/* Read `polar search` JSONL files (fields question, final_valid_transitions)
 * into examples as the reference does, the lines of one question text (in
 * any of the files) pooled into one question with each program once: per
 * question at most max_paths (50)
 * valid programs, a seeded choice; each in segment form (rejects counted and
 * skipped); weight 1, or orig_weight (0.3) for the base program 0..D-1 when
 * the question has a shorter valid program. A torn last line is ignored. */
polar_status polar_train_labels_load(const char *const *paths, int n_paths, int n_layers, int max_paths,
                                     float orig_weight, uint64_t seed, polar_train_labels *out, polar_error *err);
void polar_train_labels_free(polar_train_labels *l);

/* Each question's token states through the frozen encoder, computed once
 * for every epoch of a run. */
typedef struct {
    int n, dq;       /* questions (as in the labels), width of a token state */
    int *T;          /* [n] tokens per question (at most 512: the reference truncates) */
    float **h;       /* [n] question i's states [T[i], dq], inside one block */
    int cache;       /* POLAR_FEATURES_* : what happened with the cache file */
} polar_train_features;

enum {
    POLAR_FEATURES_COMPUTED,  /* no cache file asked for */
    POLAR_FEATURES_REUSED,    /* read from the cache file, which matched */
    POLAR_FEATURES_WRITTEN,   /* computed, and the cache file (there was none) written */
    POLAR_FEATURES_REPLACED   /* the cache file was made from another encoder or other questions:
                               * computed again and the file replaced */
};

/* Encode every question of l (tokenized without special tokens, truncated
 * to 512 tokens) with the model at encoder_path running program (text
 * form). cache_path (NULL: none) is a safetensors file of the features; it
 * is reused when its key (encoder path, program, model shape, the questions
 * in order) matches and the first question, encoded again, gives the same
 * states (so a model changed in place is caught), else rewritten.
 * progress (may be NULL) is called after each question encoded. */
polar_status polar_train_features_make(const char *encoder_path, const char *program, const polar_train_labels *l,
                                       const char *cache_path, void (*progress)(int done, int total, void *ctx),
                                       void *ctx, polar_train_features *out, polar_error *err);
void polar_train_features_free(polar_train_features *f);

/* How a predictor ranks the programs of labelled questions [q0, q1): each
 * of n_decoders decoders (opts[n_decoders]; NULL with 1: polar_decode_defaults,
 * the beam) against each question's valid programs, into out[n_decoders],
 * the network run once per question; f
 * the features of l's questions, for p's input width. The questions run in
 * parallel (OpenMP) on a CPU predictor, one at a time on a GPU one. */
typedef struct {
    int questions;
    int top1;          /* questions whose top program is one of their valid programs */
    int topk;          /* ... with one among the top k */
    int distinct_top;  /* distinct top programs over the questions */
    int constant;      /* questions for which the `constant` program is valid (0 without one) */
} polar_train_fit;

polar_status polar_train_fit_measure(const polar_predictor *p, const polar_train_labels *l,
                                     const polar_train_features *f, int q0, int q1, int k,
                                     const polar_decode_opts *opts, int n_decoders, const polar_program *constant,
                                     polar_train_fit *out, polar_error *err);

/* The catalogue of the valid programs of questions [q0, q1), in file order
 * of first appearance: what polar train stores with the predictor (the
 * training questions'). */
polar_status polar_train_catalogue(const polar_train_labels *l, int q0, int q1, polar_catalogue **out,
                                   polar_error *err);

/* The program valid for the most of questions [q0, q1) (the first in file
 * order on a tie) and how many: the top program of a predictor that ignores
 * the question, the bar polar_train_fit's top1 has to clear. */
polar_status polar_train_commonest_program(const polar_train_labels *l, int q0, int q1, polar_program *out,
                                           int *questions, polar_error *err);

/* ---------------------------------------------------------- program search */

#define POLAR_SEARCH_MAX_DEPTH 256

/* PoLar's Monte Carlo tree search for programs that earn a reward (the
 * reference's rules; search/search.c says them in full). */
typedef struct {
    int n_layers;      /* D: the root is the base program 0..D-1 */
    int min_len;       /* programs shorter than this are not explored */
    int max_len;       /* ... nor longer */
    int simulations;   /* (100) */
    double lambda;     /* length penalty in the UCB (5) */
    double explore;    /* chance of a random child while selecting (0.1) */
    uint64_t seed;     /* (42) */
    int actions;       /* POLAR_ACTIONS_*: the edits candidates make (0: both, the reference's search) */
} polar_search_opts;

/* The action spaces of the paper's Table 1 (search/search.c says the rule).
 * SKIP: every program is 0..D-1 with layers left out (no layer twice);
 * LOOP: every program keeps each layer of 0..D-1 in order, some blocks run
 * twice in place (no layer left out). */
enum { POLAR_ACTIONS_BOTH = 0, POLAR_ACTIONS_SKIP = 1, POLAR_ACTIONS_LOOP = 2 };

/* "both", "skip", "loop" (NULL for another value), and back (-1: none of them). */
const char *polar_search_actions_name(int actions);
int polar_search_actions_parse(const char *name);

/* The reference's defaults; length limits from polar_search_limits. */
polar_search_opts polar_search_defaults(int n_layers);

/* The reference's length limits for its models' depths (D 28: 16..32, 36:
 * 24..44, 24: 16..28, 48: 36..54); for other depths round(2D/3) ..
 * D + round(D/6), close to their ratios. */
void polar_search_limits(int n_layers, int *min_len, int *max_len);

/* The reward of one program (1 correct, 0 not; any value in [0, 1] works).
 * Called once per distinct program; an error stops the search. */
typedef polar_status (*polar_reward_fn)(void *ctx, const polar_program *program, double *reward, polar_error *err);

typedef struct {
    polar_program program;
    double score;
} polar_scored_program;

typedef struct {
    polar_scored_program *programs; /* every evaluated program: score descending, then shorter first */
    int n;
    double initial_score;           /* the base program's reward */
    int simulations, evaluations, nodes;
} polar_search_result;

polar_status polar_search_programs(const polar_search_opts *o, polar_reward_fn reward, void *ctx,
                                   polar_search_result *out, polar_error *err);
void polar_search_result_free(polar_search_result *r);

/* The same search, driven by the caller (so that many questions' searches
 * can run at once, e.g. as sequences of one batch): polar_search_next hands
 * out the next program to reward (valid until the next call; n = 0: the
 * search is done), polar_search_reward takes its reward. The programs and
 * the result are those of polar_search_programs. */
typedef struct polar_search polar_search;
polar_status polar_search_begin(const polar_search_opts *o, polar_search **out, polar_error *err);
polar_status polar_search_next(polar_search *s, polar_program *next, polar_error *err);
polar_status polar_search_reward(polar_search *s, double reward, polar_error *err);
polar_status polar_search_result_get(polar_search *s, polar_search_result *out, polar_error *err);
void polar_search_free(polar_search *s);

/* Encoder states: reset the session, run the tokens through its program and
 * write each token's final hidden state after the final norm (n x hidden;
 * on a CUDA session hidden may be device memory, as polar_batch_outputs). */
polar_status polar_encode(polar_session *s, const int *tokens, int n, float *hidden, polar_error *err);

/* --------------------------------------------------------------- measuring */

/* Bandwidth of a plain memory copy of `bytes` bytes, in GB/s counting bytes
 * read plus bytes written: host memcpy with n_threads threads (0: all) for
 * POLAR_DEVICE_CPU, a device-to-device cudaMemcpy for POLAR_DEVICE_CUDA. */
polar_status polar_copy_bandwidth(polar_device device, size_t bytes, int n_threads, double *gbps, polar_error *err);

/* Bandwidth of reading `bytes` bytes, in GB/s, best of 5 passes after a
 * warm-up: n_threads threads (0: all) each summing its slice of a host
 * buffer for POLAR_DEVICE_CPU, a kernel summing a device buffer for
 * POLAR_DEVICE_CUDA. A decode step only reads its weights, so this, not a
 * copy, is its limit; give more bytes than the caches hold. */
polar_status polar_read_bandwidth(polar_device device, size_t bytes, int n_threads, double *gbps, polar_error *err);

/* Bytes one decode step at context length ctx reads on a device: the
 * executed layers' weights as the device holds them (a GGUF's blocks as
 * blocks, but on CUDA the routed experts, and everything under
 * POLAR_CUDA_BLOCKS=0, as bf16; MoE: router, top-k and shared experts), their KV
 * cache rows (f32 on the CPU unless kv_bf16, bf16 on CUDA), one embedding
 * row, the final norm and the head. */
double polar_decode_bytes(const polar_model *m, const polar_program *p, int ctx, polar_device device, int kv_bf16);

/* Monotonic clock in milliseconds. */
double polar_time_ms(void);

/* ---------------------------------------- evaluation: answers and data sets */

/* Answer checking as common math-eval harnesses do it. Buffers named out
 * receive NUL-terminated text truncated to cap bytes (nothing when cap is 0);
 * NULL text reads as "". */

/* The content of the last \boxed{...} or \fbox{...} in text, braces nested,
 * into out. 1 when found (an empty box is found, with ""), else 0; the last
 * box unclosed reads as not found. */
int polar_answer_boxed(const char *text, char *out, size_t cap);
/* The last number in text ("1,234.5", "-3", "3/4", ".5"), as written, into
 * out. 1 when found. */
int polar_answer_last_number(const char *text, char *out, size_t cap);
/* A multiple-choice letter (A.. up to n_choices, at most 26) from text, tried
 * in this order: \boxed{B}, "answer is B" / "answer: (B)", text starting with
 * "B", "(B)", "B)" or "B.", the last "(B)", the last lone capital letter.
 * The index 0..n_choices-1, or -1. */
int polar_answer_choice(const char *text, int n_choices);
/* The normal form the comparison uses, into out: a \boxed answer unwrapped;
 * $, \left, \right, \!, \, \; \: \displaystyle, degree signs, % and \%
 * (so 50% reads as 50, never 0.5) dropped; \text{}, \textbf{}, \mbox{},
 * \mathrm{} unwrapped and trailing unit words after a number dropped
 * ("5 apples", "12 \text{ cm}^2"); \dfrac, \tfrac -> \frac; \frac12 ->
 * \frac{1}{2}, \sqrt2 -> \sqrt{2}; "x = 5" -> "5" (a left side of one or two
 * characters); thousands separators, spaces, a leading +, trailing periods
 * and trailing zeros of decimals (5.00 -> 5) removed; .5 -> 0.5; a whole
 * "a/b" of integers -> \frac{a}{b}. */
void polar_answer_normalize(const char *in, char *out, size_t cap);
/* 1 when pred and gold name the same answer: both normal forms read as
 * numbers (decimals, a/b, \frac{a}{b}, with a sign) within relative 1e-4 or
 * absolute 1e-4 (Python's isclose(rel_tol=1e-4, abs_tol=1e-4)), or their
 * normal forms are equal and not empty (case-insensitively when both are
 * plain words, e.g. "Yes" and "yes"). */
int polar_answer_equal(const char *pred, const char *gold);

typedef struct {
    const char *question;       /* the problem text (ASDiv: body, a space, question) */
    const char *answer;         /* gold answer as text: GSM8K the number after "####", commas removed;
                                   ASDiv "9 (apples)" -> "9"; MAWPS the target, shortest round-trip
                                   form (43.0 -> "43"); MC the letter */
    const char *solution;       /* a worked solution when the set has one (GSM8K's text before "####",
                                   its <<calculator>> annotations removed), else NULL */
    const char *const *choices; /* MC choices, else NULL */
    int n_choices;
    int answer_index;           /* MC: the gold choice, else -1 */
    long line;                  /* 1-based line in the file */
} polar_question;

typedef enum {
    POLAR_DATA_AUTO,
    POLAR_DATA_GSM8K, /* question, answer "... #### N" */
    POLAR_DATA_ASDIV, /* body, question, answer "9 (apples)" */
    POLAR_DATA_MAWPS, /* input, target (number) */
    POLAR_DATA_MMLU,  /* question, choices [..], answer (index or letter) */
    POLAR_DATA_JSONL, /* generic: the fields named in the options; choices when present */
} polar_data_format;

typedef struct {
    polar_data_format format;   /* AUTO: from the fields of the first line */
    const char *question_field; /* JSONL: NULL tries "question", then "query" */
    const char *answer_field;   /* JSONL: NULL tries "answer", then "gt_ans" */
} polar_dataset_opts;

typedef struct polar_dataset polar_dataset;

/* Read a JSON-lines data set (one object a line; blank lines skipped). opts
 * may be NULL (AUTO). */
polar_status polar_dataset_load(const char *path, const polar_dataset_opts *opts, polar_dataset **out,
                                polar_error *err);
/* The same from memory; `what` names the source in messages. */
polar_status polar_dataset_parse(const char *text, size_t len, const char *what, const polar_dataset_opts *opts,
                                 polar_dataset **out, polar_error *err);
int polar_dataset_size(const polar_dataset *d);
/* Question i, or NULL when out of range. */
const polar_question *polar_dataset_get(const polar_dataset *d, int i);
/* The format read (AUTO resolved). */
polar_data_format polar_dataset_format(const polar_dataset *d);
/* "auto", "gsm8k", "asdiv", "mawps", "mmlu", "jsonl" ("unknown" otherwise). */
const char *polar_data_format_name(polar_data_format f);
void polar_dataset_free(polar_dataset *d);

typedef enum { POLAR_PROMPT_BOXED, POLAR_PROMPT_MC } polar_prompt_style;

/* The user text for question q. BOXED is the reference's direct prompt:
 *   Solve the following math problem and output ONLY the final answer directly, formatted strictly as \boxed{ANSWER}.
 *   ### Problem Start
 *   {question}
 *   ### Problem End
 *   Answer:
 * (lines joined by "\n", no final newline). MC is the same frame with
 * "\boxed{the letter of the correct choice}" for "\boxed{ANSWER}" and the
 * choices as lines "A. ...", "B. ..." after the question; q needs choices.
 * Each of the n_shots shots comes first in the same frame, followed by
 * " {solution}\n\boxed{answer}" (or " \boxed{answer}" without a solution;
 * MC: the gold letter), then a blank line. *out is malloc'd. */
polar_status polar_prompt_format(polar_prompt_style style, const polar_question *q, const polar_question *const *shots,
                                 int n_shots, char **out, polar_error *err);

/* ----------------------------------------------- evaluation: perplexity */

/* A text's perplexity, computed as llama.cpp's llama-perplexity computes
 * it: its tokens in chunks of ctx, each chunk run from an empty cache (its
 * first token replaced by bos, when the vocabulary adds one) through the
 * batch engine, and the second half of each chunk scored: every token of
 * it but the first, given the ones before. With a reference's
 * log-probabilities (the same tokens through another model file, device,
 * CPU level or program, saved by an earlier run), the KL divergence from
 * them too. */
typedef struct {
    int ctx;                /* tokens per chunk; 0: 512 */
    int max_chunks;         /* at most this many chunks; 0: every whole chunk of the tokens */
    int bos;                /* the id each chunk runs with first (polar_tokenizer_bos), or -1: its own token */
    int n_threads;          /* 0: all available */
    polar_device device;
    int kv_bf16;            /* CPU: the K/V rows in bf16 */
    const char *save;       /* write the scored tokens' log-probabilities here: a reference for later runs */
    int save_top_k;         /* ... only each token's top k and the mass of the rest (a lower bound on the KL
                             * divergence then); 0: the whole vocabulary, 2 bytes each */
    int save_llama;         /* ... in llama-perplexity's --kl-divergence-base layout (the whole vocabulary;
                             * save_top_k 0). A reference is read in either layout, told by its magic */
    const char *reference;  /* compare with the log-probabilities saved in this file (its tokens, ctx and chunks
                             * are the run's: tokens may be NULL) */
    void (*progress)(int chunk, int n_chunks, double ppl, void *user); /* after each chunk (may be NULL) */
    void *user;
} polar_ppl_opts;

typedef struct {
    double ppl, ppl_err;    /* e^(mean negative log-likelihood), and its standard error */
    long tokens;            /* tokens scored */
    int chunks, ctx;
    int compared;           /* 1 when a reference was given; then: */
    double ref_ppl, ref_ppl_err;
    double ln_ratio, ln_ratio_err; /* mean ln(PPL / PPL(reference)) */
    double cor;             /* correlation of the tokens' log-likelihoods here and in the reference */
    double kld, kld_err;    /* mean KL divergence from the reference, and its standard error */
    double kld_max, kld_p999, kld_p99, kld_p95, kld_p90, kld_median, kld_p10, kld_p5, kld_p1, kld_min;
    double same_top, same_top_err; /* the share of tokens whose most likely next token is the reference's */
    double dp_rms, dp_rms_err;     /* RMS of the change in the scored token's probability */
} polar_ppl_result;

/* The perplexity of tokens[0..n_tokens) under the model running program. */
polar_status polar_perplexity(const polar_model *m, const polar_program *program, const int *tokens, int n_tokens,
                              const polar_ppl_opts *opts, polar_ppl_result *out, polar_error *err);

/* -------------------------------------------------- evaluation: results */

/* One generation of polar eval: a program (or a base sample) on a question. */
typedef struct {
    const char *program;         /* text form */
    int executed_layers;
    int sample;                  /* -1: greedy; else the base sample's number */
    const char *text;            /* the generated text */
    const char *answer;          /* extracted (\boxed{}, or a choice letter); NULL when none */
    int correct;
    const char *fallback_answer; /* the last number, for numeric sets; NULL when none */
    int fallback_correct;
    int tokens;
    double ms;
} polar_eval_run;

/* One question's line of a results file. */
typedef struct {
    long index;                  /* in the data set */
    long line;                   /* in its file */
    const char *question, *gold, *prompt;
    int prompt_tokens;
    const polar_eval_run *runs;  /* the programs, best-ranked first */
    int n_runs;
    const polar_eval_run *samples; /* the base program sampled */
    int n_samples;
} polar_eval_record;

/* The record as one JSON line without the newline (release with polar_free). */
polar_status polar_eval_record_json(const polar_eval_record *r, char **out, polar_error *err);

/* s as a JSON string literal, quotes included, bytes that are not UTF-8 as
 * U+FFFD (release with polar_free); NULL when out of memory. */
char *polar_json_quote(const char *s);

/* The question index of a complete results line (polar eval's and polar
 * search's lines both begin {"index":N,); -1 for a torn or foreign line. */
long polar_eval_record_index(const char *line);

/* From a results file alone: the summary as JSON and as a table for a
 * terminal (either may be NULL; release with polar_free). Accuracy per rank,
 * pass@k, consensus@k (majority of the first k extracted answers, ties to the
 * better rank), the same over base samples, executed-layer counts. */
polar_status polar_eval_summary(const char *results_path, char **json, char **table, polar_error *err);

/* The plot of polar_eval_summary's curves and depth histogram, as SVG. */
polar_status polar_eval_plot(const char *results_path, const char *svg_path, polar_error *err);

/* Which list of a results line a comparison reads: the programs' runs
 * ("runs") or the base samples ("samples"). */
typedef enum { POLAR_EVAL_RUNS, POLAR_EVAL_SAMPLES } polar_eval_list;

/* Two results files paired by question index: for k = 1..k_max (0: the
 * longest list of either file), the questions that only A's first k get right, only B's,
 * both and neither, for pass@k and consensus@k, with the exact two-sided
 * McNemar p. Questions in one file only are counted, not compared; a file
 * with a repeated index, or whose chosen list is empty on every line, is
 * refused. json / table as polar_eval_summary. */
polar_status polar_eval_compare(const char *path_a, polar_eval_list list_a, const char *path_b, polar_eval_list list_b,
                                int k_max, char **json, char **table, polar_error *err);

/* The findings of a polar search labels file: share of questions with a
 * valid program, of base-wrong questions a program fixes, the mean length of
 * the shortest valid program against D, and the segments of the valid
 * programs (single-layer, skip, repeat, keep shares, through the segment
 * codec), and the action space its lines name ("both" for lines without one,
 * written before --actions; "mixed" when they differ). n_layers: D (0: the
 * search root's length, read from the file).
 * json / table as polar_eval_summary, both ending with the base-wrong
 * questions a program fixes counted by the length of their shortest valid
 * program (JSON "fixed_shortest_lengths": {"length": questions}); svg_path
 * (NULL: none) gets the histograms of the shortest and of all valid
 * programs' lengths. */
polar_status polar_labels_summary(const char *labels_path, int n_layers, char **json, char **table,
                                  const char *svg_path, polar_error *err);

/* Two labels files paired by question index: the questions with a valid
 * program in only A, only B, both and neither, and the same over the
 * questions both judge base-wrong (those a program fixes), each with the
 * exact two-sided McNemar p, and the rates beside them. Questions in one
 * file only are counted and left out; those whose base answer the two
 * judge differently are counted too (the searches did not share prompts or
 * model); a repeated index is refused. json / table as polar_eval_summary. */
polar_status polar_labels_compare(const char *path_a, const char *path_b, char **json, char **table, polar_error *err);

#ifdef __cplusplus
}
#endif
#endif

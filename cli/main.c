/* polar: the command-line interface. It uses nothing but include/polar.h. */
#include <stdio.h>
#include <string.h>

#include "args.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *usage; /* its lines of `polar help`, after "polar " */
} command;

static const command commands[] = {
    {"run", cmd_run,
     "run [--model PATH] (--prompt TEXT | --tokens 1,2,3) [--program SPEC] [--max-new N]\n"
     "            [--chat | --raw] [--system TEXT] [--ctx N] [--threads N] [--device D] [--kv f32|bf16]\n"
     "            [--tp N] [--devices 0,1,..] [--nccl-id FILE --rank R --world W]\n"
     "            [--ignore-eos] [--temperature T [--top-k K] [--top-p P] [--min-p P] --seed S] [--json]\n"
     "            [--program auto --predictor FILE [--encoder PATH[@PROGRAM]] [--decode beam|catalogue] [-k N]]\n"},
    {"tokenize", cmd_tokenize, "tokenize [--model PATH] (--text TEXT | -f FILE) [--json] [--no-special] [--bos]\n"},
    {"predict", cmd_predict,
     "predict [--model PATH] --predictor FILE [--encoder PATH[@PROGRAM]] --question TEXT\n"
     "            [-k N] [--min-layers N] [--max-layers N] [--decode beam|catalogue] [--json]\n"},
    {"eval", cmd_eval,
     "eval [--model PATH] --data FILE [--format F] [--question-field K --answer-field K]\n"
     "            [--start I] [--limit N] [--style boxed|chat|mc] [--shots N --shots-from FILE]\n"
     "            [--program SPEC | --programs FILE | --program auto --predictor P [--encoder E] [--decode D] -k K]\n"
     "            [--samples N --temperature T [--top-k K] [--top-p P] [--min-p P] --seed S] [--max-new N]\n"
     "            [--fallback last-number]\n"
     "            [--threads N] [--device D] [--kv f32|bf16] [--cache-mb 1024] -o RESULTS.jsonl\n"
     "            [--summary FILE.json] [--plot FILE.svg] [--quiet]\n"
     "  polar eval --summary-of RESULTS.jsonl [--summary FILE.json] [--plot FILE.svg]\n"
     "  polar eval --compare A.jsonl --with B.jsonl [--lists runs|samples[,runs|samples]] [-k K]\n"
     "            [--summary FILE.json]\n"},
    {"search", cmd_search,
     "search [--model PATH] --data FILE [--format F] [--start I] [--limit N] [--sims 100]\n"
     "            [--actions both|skip|loop] [--lambda 5] [--max-new 50] [--min-layers A --max-layers B]\n"
     "            [--style boxed|chat] [--shots N --shots-from FILE] [--seed S] [--threads N] [--device D] [--batch 8]\n"
     "            [--kv f32|bf16] [--cache-mb 1024] -o LABELS.jsonl [--quiet]\n"
     "  polar search --summary LABELS.jsonl [--layers D] [--json] [--plot FILE.svg]\n"
     "  polar search --compare A.jsonl --with B.jsonl [--json]\n"},
    {"train", cmd_train,
     "train [--model PATH] --labels FILE... -o PREDICTOR [--encoder PATH[@PROGRAM]] [--epochs 10]\n"
     "            [--batch 128] [--lr 5e-4] [--warmup 10] [--orig-weight 0.3] [--max-paths 50] [--dropout 0.1]\n"
     "            [--seed S] [--log FILE] [--features-cache FILE] [--select loss|beam|catalogue]\n"
     "            (default encoder: the model's first quarter of layers)\n"},
    {"perplexity", cmd_perplexity,
     "perplexity [--model PATH] (-f TEXT | --kl-divergence FILE) [--ctx 512] [--chunks N]\n"
     "            [--program SPEC] [--threads N] [--device D] [--kv f32|bf16]\n"
     "            [--kl-divergence-base FILE [--kl-top-k K | --kl-format llama]] [--json] [--quiet]\n"},
    {"serve", cmd_serve,
     "serve [--model PATH] [--host 127.0.0.1] [--port 8080] [--device D] [--max-batch 16] [--ctx N]\n"
     "            [--threads N] [--kv f32|bf16] [--kv-mb N] [--cache-mb 64] [--api-key KEY] [--name ID]\n"
     "            [--queue 256] [--timeout 30] [--deadline 600] [--max-body-kb 1024]\n"
     "            [--predictor FILE [--encoder PATH[@PROGRAM]]]\n"},
    {"mkmodel", cmd_mkmodel,
     "mkmodel (--arch llama|qwen2|qwen3|qwen2_moe|qwen3_moe | --preset NAME) [--layers N\n"
     "            --hidden N --heads N --kv-heads N --head-dim N --ffn N --vocab N --experts N --top-k N\n"
     "            --expert-ffn N --shared-ffn N] [--seed S] --out DIR\n"},
    {"bench", cmd_bench,
     "bench (--model PATH | --preset NAME | --arch A) [--program SPEC] [--prompt-len N]\n"
     "            [--gen N] [--reps N] [--threads N] [--device D] [--kv f32|bf16] [--tp N] [--devices 0,1,..]\n"
     "            [--nccl-id FILE --rank R --world W] [--predictor FILE --encoder PATH [--question-len N]] [--json]\n"
     "  polar bench (--model PATH | --preset NAME | --arch A) --batch N[,N...] [--programs FILE]\n"
     "            [--program SPEC] [--prompt-len N] [--gen N] [--reps N] [--threads N] [--device D]\n"
     "            [--kv f32|bf16] [--tp N] [--devices 0,1,..] [--nccl-id FILE --rank R --world W]\n"
     "            [--prompts distinct|shared] [--json]\n"},
};
enum { N_COMMANDS = sizeof commands / sizeof commands[0] };

static void usage(FILE *f, const command *only) {
    if (!only) fprintf(f, "polar %s: run an LLM as a program of layers\n\n", POLAR_VERSION);
    for (int i = 0; i < N_COMMANDS; i++)
        if (!only || only == &commands[i]) fprintf(f, "  polar %s", commands[i].usage);
    fprintf(f, "\n"
               "PATH: a model folder (config.json + safetensors), a .gguf file, or the name of a model\n"
               "installed by `make models` (qwen2.5-coder-0.5b, qwen2.5-coder-1.5b); without --model,\n"
               "the default model (SmolLM2-135M-Instruct, installed by `make run`).\n"
               "SPEC: base | comma-separated terms A, A-B, each optionally xN (repeat N times) | a JSON\n"
               "list of layer indices. Example: 0-5,6-7x2,9-15 runs 6,7,6,7 in place of 6,7 and skips 8.\n");
    if (!only)
        fprintf(f, "Presets: llama-3.2-1b, llama-3.2-3b, qwen2.5-3b, qwen3-8b, qwen1.5-moe-a2.7b,\n"
                   "qwen3-embedding-0.6b, qwen2.5-0.5b (real shapes, random weights).\n"
                   "polar CMD --help: one command's usage. Exit status: 0 success, 2 usage error, 1 any other\n"
                   "failure.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr, NULL);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout, NULL);
        return 0;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("polar %s (CPU kernels: %s)\n", POLAR_VERSION, polar_cpu_kernels());
        return 0;
    }
    for (int i = 0; i < N_COMMANDS; i++) {
        if (strcmp(cmd, commands[i].name)) continue;
        for (int a = 2; a < argc; a++)
            if (!strcmp(argv[a], "--help") || !strcmp(argv[a], "-h")) {
                usage(stdout, &commands[i]);
                return 0;
            }
        return commands[i].run(argc - 2, argv + 2);
    }
    fprintf(stderr, "polar: usage error: unknown command '%s' (see polar help)\n", cmd);
    return EXIT_USAGE;
}

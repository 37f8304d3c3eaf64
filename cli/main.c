/* polar: the command-line interface. It uses nothing but include/polar.h. */
#include <stdio.h>
#include <string.h>

#include "args.h"

static void usage(FILE *f) {
    fprintf(f,
            "polar %s: run an LLM as a program of layers\n"
            "\n"
            "  polar run [--model PATH] (--prompt TEXT | --tokens 1,2,3) [--program SPEC] [--max-new N]\n"
            "            [--chat | --raw] [--system TEXT] [--ctx N] [--threads N] [--ignore-eos] [--json]\n"
            "            [--program auto --predictor FILE [--encoder PATH[@PROGRAM]] [-k N]]\n"
            "  polar tokenize [--model PATH] --text TEXT [--json] [--no-special] [--bos]\n"
            "  polar predict [--model PATH] --predictor FILE [--encoder PATH[@PROGRAM]] --question TEXT\n"
            "            [-k N] [--min-layers N] [--max-layers N] [--json]\n"
            "  polar train [--model PATH] --labels FILE... -o PREDICTOR [--encoder PATH[@PROGRAM]] [--epochs 10]\n"
            "            [--batch 128] [--lr 5e-4] [--warmup 10] [--orig-weight 0.3] [--max-paths 50] [--dropout 0.1]\n"
            "            [--seed S] [--log FILE]   (default encoder: the model's first quarter of layers)\n"
            "  polar mkmodel (--arch llama|qwen2|qwen3|qwen2_moe|qwen3_moe | --preset NAME) [--layers N\n"
            "            --hidden N --heads N --kv-heads N --head-dim N --ffn N --vocab N --experts N --top-k N\n"
            "            --expert-ffn N --shared-ffn N] [--seed S] --out DIR\n"
            "  polar bench (--model PATH | --preset NAME | --arch A) [--program SPEC] [--prompt-len N]\n"
            "            [--gen N] [--reps N] [--threads N] [--device D] [--predictor FILE --encoder PATH\n"
            "            [--question-len N]] [--json]\n"
            "\n"
            "PATH: a model folder (config.json + safetensors) or a .gguf file; without --model, the\n"
            "default model (SmolLM2-135M-Instruct, installed by `make run`).\n"
            "SPEC: base | comma-separated terms A, A-B, each optionally xN (repeat N times) | a JSON\n"
            "list of layer indices. Example: 0-5,6-7x2,9-15 runs 6,7,6,7 in place of 6,7 and skips 8.\n"
            "Presets: llama-3.2-1b, llama-3.2-3b, qwen2.5-3b, qwen3-8b, qwen1.5-moe-a2.7b,\n"
            "qwen3-embedding-0.6b (real shapes, random weights).\n"
            "Exit status: 0 success, 2 usage error, 1 any other failure.\n",
            POLAR_VERSION);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "run") == 0) return cmd_run(argc - 2, argv + 2);
    if (strcmp(cmd, "mkmodel") == 0) return cmd_mkmodel(argc - 2, argv + 2);
    if (strcmp(cmd, "bench") == 0) return cmd_bench(argc - 2, argv + 2);
    if (strcmp(cmd, "tokenize") == 0) return cmd_tokenize(argc - 2, argv + 2);
    if (strcmp(cmd, "predict") == 0) return cmd_predict(argc - 2, argv + 2);
    if (strcmp(cmd, "train") == 0) return cmd_train(argc - 2, argv + 2);
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
        printf("polar %s\n", POLAR_VERSION);
        return 0;
    }
    fprintf(stderr, "polar: usage error: unknown command '%s' (see polar help)\n", cmd);
    return EXIT_USAGE;
}

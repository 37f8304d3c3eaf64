/* Built-in chat templates (no template engine): one user turn, an optional
 * system text, and the assistant's generation prompt. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/error.h"
#include "tokenizer.h"

static const char QWEN25_SYSTEM[] = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
static const char SMOLLM2_SYSTEM[] = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

const char *polar_chat_template_name(const polar_tokenizer *t) {
    static const char *names[] = {"none", "llama3", "chatml", "qwen3", "smollm2"};
    return t ? names[t->chat] : "none";
}

int polar_token_id(const polar_tokenizer *t, const char *text) { return t ? tok_find(t, text, strlen(text)) : -1; }

int polar_tokenizer_bos(const polar_tokenizer *t) { return t && t->n_prefix ? t->prefix[0] : -1; }

int polar_tokenizer_end_of_turn(const polar_tokenizer *t) {
    if (!t) return -1;
    if (t->chat == CHAT_LLAMA3) return polar_token_id(t, "<|eot_id|>");
    if (t->chat != CHAT_NONE) return polar_token_id(t, "<|im_end|>");
    return -1;
}

polar_status polar_chat_prompt(const polar_tokenizer *t, const char *system, const char *user, char **out,
                               polar_error *err) {
    *out = NULL;
    if (!t || !user) return polar_fail(err, POLAR_ERR_ARG, "chat: no tokenizer or user text");
    if (t->chat == CHAT_NONE)
        return polar_fail(err, POLAR_ERR_UNSUPPORTED, "chat: this model carries no chat template polar knows; use --raw");
    size_t n = strlen(user) + (system ? strlen(system) : 0) + sizeof QWEN25_SYSTEM + sizeof SMOLLM2_SYSTEM + 256;
    char *o = malloc(n);
    if (!o) return polar_fail(err, POLAR_ERR_NOMEM, "chat: out of memory");
    int k = 0;
    switch (t->chat) {
    case CHAT_LLAMA3:
        k = snprintf(o, n, "<|begin_of_text|>");
        if (system)
            k += snprintf(o + k, n - (size_t)k, "<|start_header_id|>system<|end_header_id|>\n\n%s<|eot_id|>", system);
        snprintf(o + k, n - (size_t)k,
                 "<|start_header_id|>user<|end_header_id|>\n\n%s<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
                 user);
        break;
    case CHAT_QWEN3:
        if (system) k = snprintf(o, n, "<|im_start|>system\n%s<|im_end|>\n", system);
        snprintf(o + k, n - (size_t)k, "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
                 user);
        break;
    default: /* ChatML: Qwen2.5 and SmolLM2 differ only in the default system text */
        snprintf(o, n, "<|im_start|>system\n%s<|im_end|>\n<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n",
                 system ? system : t->chat == CHAT_SMOLLM2 ? SMOLLM2_SYSTEM : QWEN25_SYSTEM, user);
        break;
    }
    *out = o;
    return POLAR_OK;
}

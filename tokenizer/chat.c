/* Built-in chat templates (no template engine): a conversation of system,
 * user and assistant turns, and the assistant's generation prompt. */
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

static const char *default_system(chat_style chat) {
    return chat == CHAT_SMOLLM2 ? SMOLLM2_SYSTEM : chat == CHAT_CHATML ? QWEN25_SYSTEM : NULL;
}

polar_status polar_chat_format(const polar_tokenizer *t, const polar_chat_message *msgs, int n, char **out,
                               polar_error *err) {
    *out = NULL;
    if (!t || !msgs || n < 1) return polar_fail(err, POLAR_ERR_ARG, "chat: no tokenizer or no turns");
    if (t->chat == CHAT_NONE)
        return polar_fail(err, POLAR_ERR_UNSUPPORTED, "chat: this model carries no chat template polar knows; use --raw");
    /* A turn: before, role, after, content, end. */
    int llama = t->chat == CHAT_LLAMA3;
    const char *before = llama ? "<|start_header_id|>" : "<|im_start|>";
    const char *after = llama ? "<|end_header_id|>\n\n" : "\n", *end = llama ? "<|eot_id|>" : "<|im_end|>\n";
    size_t cap = 256 + sizeof QWEN25_SYSTEM + sizeof SMOLLM2_SYSTEM;
    for (int i = 0; i < n; i++) {
        const char *r = msgs[i].role;
        if (!r || !msgs[i].content || (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant")))
            return polar_fail(err, POLAR_ERR_ARG, "chat: turn %d: the role must be system, user or assistant", i + 1);
        cap += strlen(r) + strlen(msgs[i].content) + 64;
    }
    char *o = malloc(cap);
    if (!o) return polar_fail(err, POLAR_ERR_NOMEM, "chat: out of memory");
    size_t k = 0;
    if (llama) k += (size_t)snprintf(o + k, cap - k, "<|begin_of_text|>");
    const char *sys = default_system(t->chat);
    if (sys && strcmp(msgs[0].role, "system"))
        k += (size_t)snprintf(o + k, cap - k, "%ssystem%s%s%s", before, after, sys, end);
    for (int i = 0; i < n; i++)
        k += (size_t)snprintf(o + k, cap - k, "%s%s%s%s%s", before, msgs[i].role, after, msgs[i].content, end);
    /* Qwen3 with thinking disabled: an empty thought opens the answer. */
    snprintf(o + k, cap - k, "%sassistant%s%s", before, after, t->chat == CHAT_QWEN3 ? "<think>\n\n</think>\n\n" : "");
    *out = o;
    return POLAR_OK;
}

polar_status polar_chat_prompt(const polar_tokenizer *t, const char *system, const char *user, char **out,
                               polar_error *err) {
    *out = NULL;
    if (!user) return polar_fail(err, POLAR_ERR_ARG, "chat: no tokenizer or user text");
    polar_chat_message turns[2] = {{"system", system}, {"user", user}};
    return system ? polar_chat_format(t, turns, 2, out, err) : polar_chat_format(t, turns + 1, 1, out, err);
}

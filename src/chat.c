/* chat.c — chat templates, tokenization and conversation keys. */
#include "chat.h"

#include "error.h"
#include "log.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct thaw_chat {
    const struct llama_model *model;
    const struct llama_vocab *vocab;
    char *tmpl; /* name or template text handed to llama_chat_apply_template */
};

/* ---- template ------------------------------------------------------------------- */

int thaw_chat_new(const struct llama_model *model, const char *template_override, struct thaw_chat **out)
{
    struct thaw_chat *chat = calloc(1, sizeof *chat);
    const char *t = template_override;
    char probe[64];
    struct llama_chat_message m = {"user", "hi"};

    if (!chat)
        return THAW_ENOMEM;
    chat->model = model;
    chat->vocab = llama_model_get_vocab(model);
    if (!t)
        t = llama_model_chat_template(model, NULL);
    if (!t) {
        LOG_WRN("the model has no chat template; using chatml (override with --chat-template)");
        t = "chatml";
    }
    chat->tmpl = strdup(t);
    if (!chat->tmpl) {
        free(chat);
        return THAW_ENOMEM;
    }
    if (llama_chat_apply_template(chat->tmpl, &m, 1, true, probe, sizeof probe) < 0) {
        LOG_ERR("chat template is not supported by llama_chat_apply_template: %.60s%s", chat->tmpl,
                strlen(chat->tmpl) > 60 ? "..." : "");
        thaw_chat_free(chat);
        return THAW_EINVAL;
    }
    *out = chat;
    return 0;
}

void thaw_chat_free(struct thaw_chat *chat)
{
    if (!chat)
        return;
    free(chat->tmpl);
    free(chat);
}

const char *thaw_chat_template(const struct thaw_chat *chat) { return chat->tmpl; }

static const char *template_role(const char *role)
{
    /* "developer" is OpenAI's newer name for the system role */
    return strcmp(role, "developer") == 0 ? "system" : role;
}

int thaw_chat_render(const struct thaw_chat *chat, const struct thaw_message *msgs, size_t n,
                     const char *extra_assistant, bool add_assistant, char **out)
{
    size_t n_all = n + (extra_assistant ? 1 : 0);
    struct llama_chat_message *lm = calloc(n_all ? n_all : 1, sizeof *lm);
    size_t cap = 256;
    char *buf = NULL;
    int rc = 0;

    if (!lm)
        return THAW_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        lm[i].role = template_role(msgs[i].role);
        lm[i].content = msgs[i].content;
        cap += strlen(msgs[i].content) * 2 + 32;
    }
    if (extra_assistant) {
        lm[n].role = "assistant";
        lm[n].content = extra_assistant;
        cap += strlen(extra_assistant) * 2 + 32;
    }
    for (int attempt = 0; attempt < 2; attempt++) {
        char *nb = realloc(buf, cap);
        if (!nb) {
            rc = THAW_ENOMEM;
            goto out;
        }
        buf = nb;
        if (cap > INT32_MAX) {
            rc = THAW_ETOOBIG;
            goto out;
        }
        int32_t len = llama_chat_apply_template(chat->tmpl, lm, n_all, add_assistant, buf, (int32_t)cap);
        if (len < 0) {
            rc = THAW_EINVAL;
            goto out;
        }
        if ((size_t)len < cap) {
            buf[len] = '\0';
            *out = buf;
            buf = NULL;
            goto out;
        }
        cap = (size_t)len + 1;
    }
    rc = THAW_EINVAL;
out:
    free(buf);
    free(lm);
    return rc;
}

int thaw_chat_tokenize(const struct thaw_chat *chat, const char *text, llama_token **out, int *n_out)
{
    size_t len = strlen(text);
    int cap = (int)(len + 16);
    llama_token *toks;
    int n;

    if (len > INT32_MAX / 2)
        return THAW_ETOOBIG;
    toks = malloc((size_t)cap * sizeof *toks);
    if (!toks)
        return THAW_ENOMEM;
    n = llama_tokenize(chat->vocab, text, (int32_t)len, toks, cap, true, true);
    if (n < 0) {
        cap = -n;
        llama_token *nt = realloc(toks, (size_t)cap * sizeof *toks);
        if (!nt) {
            free(toks);
            return THAW_ENOMEM;
        }
        toks = nt;
        n = llama_tokenize(chat->vocab, text, (int32_t)len, toks, cap, true, true);
    }
    if (n < 0) {
        free(toks);
        return THAW_EINVAL;
    }
    *out = toks;
    *n_out = n;
    return 0;
}

int thaw_chat_prompt_tokens(const struct thaw_chat *chat, const struct thaw_chat_request *req, llama_token **out,
                            int *n_out)
{
    char *text = NULL;
    int rc = thaw_chat_render(chat, req->messages, req->n_messages, NULL, true, &text);

    if (rc == 0)
        rc = thaw_chat_tokenize(chat, text, out, n_out);
    free(text);
    return rc;
}

/* ---- keys ------------------------------------------------------------------------ */

long thaw_chat_last_assistant(const struct thaw_message *msgs, size_t n)
{
    for (size_t i = n; i-- > 0;)
        if (strcmp(msgs[i].role, "assistant") == 0)
            return (long)i;
    return -1;
}

static void hash_field(crypto_generichash_state *st, const char *s)
{
    uint64_t len = strlen(s);
    unsigned char le[8];

    for (int i = 0; i < 8; i++)
        le[i] = (unsigned char)(len >> (8 * i));
    crypto_generichash_update(st, le, sizeof le);
    crypto_generichash_update(st, (const unsigned char *)s, len);
}

void thaw_chat_key(const uint8_t binding[THAW_KEY_BYTES], const struct thaw_message *msgs, size_t n,
                   const char *extra_assistant, uint8_t out[THAW_KEY_BYTES])
{
    crypto_generichash_state st;

    crypto_generichash_init(&st, NULL, 0, THAW_KEY_BYTES);
    hash_field(&st, "thaw.kv.v1");
    crypto_generichash_update(&st, binding, THAW_KEY_BYTES);
    for (size_t i = 0; i < n; i++) {
        /* the role as the template sees it: "developer" and "system" render alike */
        hash_field(&st, template_role(msgs[i].role));
        hash_field(&st, msgs[i].content);
    }
    if (extra_assistant) {
        hash_field(&st, "assistant");
        hash_field(&st, extra_assistant);
    }
    crypto_generichash_final(&st, out, THAW_KEY_BYTES);
}

void thaw_chat_binding(const uint8_t fingerprint[THAW_KEY_BYTES], const char *settings,
                       const uint8_t namespace_id[THAW_KEY_BYTES], uint8_t out[THAW_KEY_BYTES])
{
    crypto_generichash_state st;

    crypto_generichash_init(&st, NULL, 0, THAW_KEY_BYTES);
    hash_field(&st, "thaw.binding.v2");
    crypto_generichash_update(&st, fingerprint, THAW_KEY_BYTES);
    hash_field(&st, settings);
    if (namespace_id) {
        hash_field(&st, "ns");
        crypto_generichash_update(&st, namespace_id, THAW_KEY_BYTES);
    } else {
        hash_field(&st, "identity");
    }
    crypto_generichash_final(&st, out, THAW_KEY_BYTES);
}

void thaw_chat_namespace(const char *api_key, size_t len, uint8_t out[THAW_KEY_BYTES])
{
    /* a 32-byte BLAKE2b key: the domain tag, zero-padded */
    static const unsigned char tag[crypto_generichash_KEYBYTES] = "thaw.namespace.v1";

    if (!api_key)
        len = 0;
    crypto_generichash(out, THAW_KEY_BYTES, (const unsigned char *)(api_key ? api_key : ""), len, tag, sizeof tag);
}

/* keys.c — namespaces, bindings, conversation keys (keys.h). */
#include "keys.h"

#include "api.h"

#include <sodium.h>
#include <stdio.h>
#include <string.h>

long thaw_keys_last_assistant(const struct thaw_message *msgs, size_t n)
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

void thaw_keys_conversation(const uint8_t binding[THAW_KEY_BYTES], const struct thaw_message *msgs, size_t n,
                            const char *extra_json, uint8_t out[THAW_KEY_BYTES])
{
    crypto_generichash_state st;

    crypto_generichash_init(&st, NULL, 0, THAW_KEY_BYTES);
    hash_field(&st, "thaw.kv.v2");
    crypto_generichash_update(&st, binding, THAW_KEY_BYTES);
    /* the normalised message: role as the template sees it ("developer"
     * renders as "system"), content, tool calls, ids, names, reasoning */
    for (size_t i = 0; i < n; i++)
        hash_field(&st, msgs[i].json);
    if (extra_json)
        hash_field(&st, extra_json);
    crypto_generichash_final(&st, out, THAW_KEY_BYTES);
}

void thaw_keys_reply(const uint8_t binding[THAW_KEY_BYTES], const struct thaw_chat_request *req,
                     const char *reply_json, const int32_t *tokens, int n_tokens, uint8_t out[THAW_KEY_BYTES])
{
    crypto_generichash_state st;

    if (!req->raw) {
        thaw_keys_conversation(binding, req->messages, req->n_messages, reply_json, out);
        return;
    }
    crypto_generichash_init(&st, NULL, 0, THAW_KEY_BYTES);
    hash_field(&st, "thaw.kv.raw.v1");
    crypto_generichash_update(&st, binding, THAW_KEY_BYTES);
    for (int i = 0; i < n_tokens; i++) {
        uint8_t le[4] = {(uint8_t)tokens[i], (uint8_t)(tokens[i] >> 8), (uint8_t)(tokens[i] >> 16),
                         (uint8_t)(tokens[i] >> 24)};
        crypto_generichash_update(&st, le, sizeof le);
    }
    crypto_generichash_final(&st, out, THAW_KEY_BYTES);
}

void thaw_keys_bind_request(const uint8_t binding[THAW_KEY_BYTES], const struct thaw_chat_request *req,
                            uint8_t out[THAW_KEY_BYTES])
{
    crypto_generichash_state st;

    crypto_generichash_init(&st, NULL, 0, THAW_KEY_BYTES);
    hash_field(&st, "thaw.request.v1");
    crypto_generichash_update(&st, binding, THAW_KEY_BYTES);
    hash_field(&st, req->tools_json ? req->tools_json : "");
    hash_field(&st, req->template_kwargs ? req->template_kwargs : "");
    crypto_generichash_final(&st, out, THAW_KEY_BYTES);
}

void thaw_keys_binding(const uint8_t fingerprint[THAW_KEY_BYTES], const char *settings,
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

void thaw_keys_namespace(const char *api_key, size_t len, uint8_t out[THAW_KEY_BYTES])
{
    /* a 32-byte BLAKE2b key: the domain tag, zero-padded */
    static const unsigned char tag[crypto_generichash_KEYBYTES] = "thaw.namespace.v1";

    if (!api_key)
        len = 0;
    crypto_generichash(out, THAW_KEY_BYTES, (const unsigned char *)(api_key ? api_key : ""), len, tag, sizeof tag);
}

void thaw_keys_short(const uint8_t key[THAW_KEY_BYTES], char out[17])
{
    sodium_bin2hex(out, 17, key, 8);
}

void thaw_keys_block_binding(const uint8_t identity[THAW_KEY_BYTES], const uint8_t *ns, uint8_t out[THAW_KEY_BYTES])
{
    static const uint8_t anon[THAW_KEY_BYTES];

    crypto_generichash(out, THAW_KEY_BYTES, ns ? ns : anon, THAW_KEY_BYTES, identity, THAW_KEY_BYTES);
}

void thaw_keys_settings(const struct thaw_keys_settings *s, char *out, size_t cap)
{
    const char *tmpl = s->chat_template ? s->chat_template : "";
    const char *renderer = s->jinja ? "jinja" : "builtin";
    crypto_generichash_state hs;
    uint8_t th[16];
    char hex[2 * sizeof th + 1];

    crypto_generichash_init(&hs, NULL, 0, sizeof th);
    crypto_generichash_update(&hs, (const unsigned char *)tmpl, strlen(tmpl) + 1);
    crypto_generichash_update(&hs, (const unsigned char *)renderer, strlen(renderer) + 1);
    if (s->template_kwargs)
        crypto_generichash_update(&hs, (const unsigned char *)s->template_kwargs, strlen(s->template_kwargs));
    crypto_generichash_final(&hs, th, sizeof th);
    sodium_bin2hex(hex, sizeof hex, th, sizeof th);
    snprintf(out, cap, "swa_full=%d;type_k=%d;type_v=%d;tmpl=%s", (int)s->swa_full, s->type_k, s->type_v, hex);
}

/* keys.c — namespaces, bindings, block bindings, settings strings (keys.h). */
#include "cache/keys.h"

#include <stdio.h>
#include <string.h>

void thaw_keys_hash_field(crypto_generichash_state *st, const char *s)
{
    uint64_t len = strlen(s);
    unsigned char le[8];

    for (int i = 0; i < 8; i++)
        le[i] = (unsigned char)(len >> (8 * i));
    crypto_generichash_update(st, le, sizeof le);
    crypto_generichash_update(st, (const unsigned char *)s, len);
}

void thaw_keys_binding(const uint8_t fingerprint[THAW_KEY_BYTES], const char *settings,
                       const uint8_t namespace_id[THAW_KEY_BYTES], uint8_t out[THAW_KEY_BYTES])
{
    crypto_generichash_state st;

    crypto_generichash_init(&st, NULL, 0, THAW_KEY_BYTES);
    thaw_keys_hash_field(&st, "thaw.binding.v2");
    crypto_generichash_update(&st, fingerprint, THAW_KEY_BYTES);
    thaw_keys_hash_field(&st, settings);
    if (namespace_id) {
        thaw_keys_hash_field(&st, "ns");
        crypto_generichash_update(&st, namespace_id, THAW_KEY_BYTES);
    } else {
        thaw_keys_hash_field(&st, "identity");
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

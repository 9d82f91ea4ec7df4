/* keys.h — what a cached conversation is bound to: tenant namespaces,
 * bindings, block bindings (DESIGN §2 "Keying", §5); the conversation keys
 * over a request's messages are request_keys.h's.
 *
 * The lookup key hashes the conversation truncated at its last assistant
 * message; the store key hashes the conversation plus the reply as the
 * client will echo it. Both are BLAKE2b-256 over a domain tag, a binding
 * (model fingerprint + state-shaping context settings + tenant namespace +
 * the request's tools and template kwargs, which also change the rendered
 * prompt) and each message's normalised JSON (api.h), so no two different
 * conversations, models, tenants or tool lists share a key short of a
 * BLAKE2b collision.
 *
 * Every key, binding, namespace and fingerprint in thaw is THAW_KEY_BYTES;
 * both cache tiers index by such keys. Pure functions: any thread (after
 * sodium_init()).
 */
#ifndef THAW_KEYS_H
#define THAW_KEYS_H

#include "base/key.h"

#include <sodium.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* binding = BLAKE2b-256(fingerprint || settings string || namespace), where
 * the namespace is thaw_keys_namespace() of the request's API key (set by the
 * server, never by a client). NULL namespace: the model's identity, which is
 * no tenant's (written into every .idx). */
void thaw_keys_binding(const uint8_t fingerprint[THAW_KEY_BYTES], const char *settings,
                       const uint8_t namespace_id[THAW_KEY_BYTES], uint8_t out[THAW_KEY_BYTES]);

/* What a binding's settings string is made of: the context settings that
 * change a state's bytes and what shapes the tokens a key stands for. Not
 * the context size nor the slot count: a stored state restores into any
 * slot with room for its cells, so changing -c or -np keeps the cache. */
struct thaw_keys_settings {
    bool swa_full;
    int type_k, type_v;          /* ggml types of the KV cache */
    const char *chat_template;   /* the template's source text */
    bool jinja;                  /* the renderer: jinja or the built-in one */
    const char *template_kwargs; /* server-wide chat_template_kwargs, NULL = none */
};

/* Writes the settings string thaw_keys_binding takes into out[cap]:
 * "swa_full=%d;type_k=%d;type_v=%d;tmpl=" and 32 hex digits of
 * BLAKE2b-128 over the template (with its NUL), the renderer's name (with
 * its NUL) and the kwargs. Truncated to fit (cap >= 96 holds it all). */
void thaw_keys_settings(const struct thaw_keys_settings *s, char *out, size_t cap);

/* A tenant's namespace: BLAKE2b-256 keyed with a fixed domain tag over the
 * API key itself (NULL or "" = the anonymous namespace of a server without
 * keys). Stable across restarts and key reordering, gone with the key, and
 * one-way: the namespace reveals nothing of the key. */
void thaw_keys_namespace(const char *api_key, size_t len, uint8_t out[THAW_KEY_BYTES]);

/* The binding a tenant's blocks are chained under (blocks.h): the model's
 * identity (thaw_keys_binding with no namespace) keyed into the namespace
 * (NULL: the anonymous one). Blocks are shared within a tenant, under one
 * model and its settings; the shared tier computes the same ids. */
void thaw_keys_block_binding(const uint8_t identity[THAW_KEY_BYTES], const uint8_t *ns, uint8_t out[THAW_KEY_BYTES]);

/* A key's first 8 bytes in lowercase hex, NUL-terminated: how logs name a
 * conversation (enough to tell entries apart, never the whole key). */
void thaw_keys_short(const uint8_t key[THAW_KEY_BYTES], char out[17]);

/* Hashes s as one field: its length (u64, little-endian), then its bytes,
 * so no two lists of fields hash alike. For request_keys.c's keys. */
void thaw_keys_hash_field(crypto_generichash_state *st, const char *s);

#endif

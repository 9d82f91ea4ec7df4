/* shared_seal.c — the shared tier's object names and sealed envelope
 * (shared_seal.h): key derivation, names, seal and open. */
#include "cache/shared_seal.h"

#include "base/blob.h"
#include "base/error.h"
#include "base/fmt.h"
#include "base/le.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OBJ_MAGIC "TSO1"
#define ENTRY_MAGIC "TSE1"
#define NONCE_BYTES crypto_aead_xchacha20poly1305_ietf_NPUBBYTES
#define TAG_BYTES crypto_aead_xchacha20poly1305_ietf_ABYTES
#define OBJ_HEADER (4 + NONCE_BYTES)
#define ENTRY_HEADER (4 + 4 + 8 * THAW_PART_COUNT)

static void tag16(const uint8_t key[32], const char *what, const uint8_t v[THAW_KEY_BYTES], char out[17])
{
    crypto_generichash_state st;
    uint8_t h[8];

    crypto_generichash_init(&st, key, 32, sizeof h);
    crypto_generichash_update(&st, (const uint8_t *)what, strlen(what) + 1);
    crypto_generichash_update(&st, v, THAW_KEY_BYTES);
    crypto_generichash_final(&st, h, sizeof h);
    thaw_hex(h, 8, out);
}

int thaw_shared_derive(const void *secret, size_t n_secret, const uint8_t identity[THAW_KEY_BYTES],
                       struct thaw_shared_names *out)
{
    static const char domain[] = "thaw shared tier v1";

    if (!secret || n_secret < 16)
        return THAW_EINVAL;
    crypto_generichash(out->key, sizeof out->key, secret, n_secret, (const uint8_t *)domain, sizeof domain - 1);
    tag16(out->key, "model", identity, out->model_tag);
    return 0;
}

void thaw_shared_name(const struct thaw_shared_names *nm, const uint8_t ns[THAW_KEY_BYTES], char kind,
                      const uint8_t id[THAW_KEY_BYTES], char *out, size_t cap)
{
    char tenant[17], hex[2 * THAW_KEY_BYTES + 1];

    tag16(nm->key, "tenant", ns, tenant);
    thaw_hex(id, THAW_KEY_BYTES, hex);
    snprintf(out, cap, "v1/%s/%s/%c/%s", nm->model_tag, tenant, kind, hex);
}

/* AD = magic | name | NUL | namespace | identity: the object is valid under
 * this name, for this tenant and this model only. */
static size_t make_ad(const char *name, const uint8_t ns[THAW_KEY_BYTES], const uint8_t identity[THAW_KEY_BYTES],
                      uint8_t *ad, size_t cap)
{
    size_t nn = strlen(name);

    if (4 + nn + 1 + 2 * THAW_KEY_BYTES > cap)
        return 0;
    memcpy(ad, OBJ_MAGIC, 4);
    memcpy(ad + 4, name, nn + 1);
    memcpy(ad + 4 + nn + 1, ns, THAW_KEY_BYTES);
    memcpy(ad + 4 + nn + 1 + THAW_KEY_BYTES, identity, THAW_KEY_BYTES);
    return 4 + nn + 1 + 2 * THAW_KEY_BYTES;
}

int thaw_shared_seal(const struct thaw_shared_names *nm, const char *name, const uint8_t ns[THAW_KEY_BYTES],
                     const uint8_t identity[THAW_KEY_BYTES], uint32_t n_tokens,
                     const struct thaw_part_blob parts[THAW_PART_COUNT], void **obj, size_t *n_obj)
{
    uint8_t ad[512];
    size_t n_ad = make_ad(name, ns, identity, ad, sizeof ad), n_plain = ENTRY_HEADER;
    unsigned long long n_ct;

    if (!n_ad)
        return THAW_EINVAL;
    for (int p = 0; p < THAW_PART_COUNT; p++)
        n_plain += parts[p].size;
    if (n_plain + OBJ_HEADER + TAG_BYTES > THAW_SHARED_MAX_OBJECT)
        return THAW_ETOOBIG;
    uint8_t *o = malloc(OBJ_HEADER + n_plain + TAG_BYTES);
    if (!o)
        return THAW_ENOMEM;
    memcpy(o, OBJ_MAGIC, 4);
    randombytes_buf(o + 4, NONCE_BYTES);
    uint8_t *m = o + OBJ_HEADER;
    memcpy(m, ENTRY_MAGIC, 4);
    put_u32(m + 4, n_tokens);
    size_t off = ENTRY_HEADER;
    for (int p = 0; p < THAW_PART_COUNT; p++) {
        put_u64(m + 8 + 8 * p, parts[p].size);
        if (parts[p].size)
            memcpy(m + off, parts[p].data, parts[p].size);
        off += parts[p].size;
    }
    /* in place: libsodium allows the ciphertext over its plaintext */
    crypto_aead_xchacha20poly1305_ietf_encrypt(m, &n_ct, m, n_plain, ad, n_ad, NULL, o + 4, nm->key);
    *obj = o;
    *n_obj = OBJ_HEADER + (size_t)n_ct;
    return 0;
}

int thaw_shared_open_object(const struct thaw_shared_names *nm, const char *name, const uint8_t ns[THAW_KEY_BYTES],
                            const uint8_t identity[THAW_KEY_BYTES], const void *obj, size_t n_obj,
                            uint32_t *n_tokens, struct thaw_part_blob parts[THAW_PART_COUNT])
{
    uint8_t ad[512];
    size_t n_ad = make_ad(name, ns, identity, ad, sizeof ad);
    const uint8_t *o = obj;
    unsigned long long n_plain;

    memset(parts, 0, THAW_PART_COUNT * sizeof *parts);
    if (!n_ad || n_obj < OBJ_HEADER + TAG_BYTES + ENTRY_HEADER || memcmp(o, OBJ_MAGIC, 4) != 0)
        return THAW_ECORRUPT;
    uint8_t *m = malloc(n_obj - OBJ_HEADER);
    if (!m)
        return THAW_ENOMEM;
    if (crypto_aead_xchacha20poly1305_ietf_decrypt(m, &n_plain, NULL, o + OBJ_HEADER, n_obj - OBJ_HEADER, ad, n_ad,
                                                   o + 4, nm->key) != 0 ||
        n_plain < ENTRY_HEADER || memcmp(m, ENTRY_MAGIC, 4) != 0) {
        free(m);
        return THAW_ECORRUPT;
    }
    /* sealed by a replica of this cluster: still, every length is checked */
    uint64_t sum = 0, sizes[THAW_PART_COUNT];
    for (int p = 0; p < THAW_PART_COUNT; p++) {
        sizes[p] = get_u64(m + 8 + 8 * p);
        if (sizes[p] > n_plain || (sum += sizes[p]) > n_plain - ENTRY_HEADER)
            goto bad;
    }
    if (sum != n_plain - ENTRY_HEADER || sizes[THAW_PART_KV] == 0)
        goto bad;
    *n_tokens = get_u32(m + 4);
    size_t off = ENTRY_HEADER;
    for (int p = 0; p < THAW_PART_COUNT; p++) {
        if (!sizes[p])
            continue;
        if (!(parts[p].data = thaw_blob_alloc(sizes[p]))) {
            for (int q = 0; q < p; q++)
                thaw_blob_unref(parts[q].data);
            memset(parts, 0, THAW_PART_COUNT * sizeof *parts);
            free(m);
            return THAW_ENOMEM;
        }
        memcpy(parts[p].data, m + off, sizes[p]);
        parts[p].size = sizes[p];
        off += sizes[p];
    }
    free(m);
    return 0;
bad:
    free(m);
    return THAW_ECORRUPT;
}

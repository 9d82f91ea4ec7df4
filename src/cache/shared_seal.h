/* shared_seal.h — the shared tier's objects (DESIGN §11, cache_shared.h):
 * their names and the sealed envelope around an entry. No I/O: what
 * cache_shared.c PUTs and GETs, and what its unit test forges.
 *
 * Objects are immutable and named under PREFIX/ of the bucket:
 *
 *   v1/<model>/<tenant>/m/<key hex>    a conversation entry (its manifest,
 *                                      or a whole state, and its other parts)
 *   v1/<model>/<tenant>/b/<id hex>     a block (blocks.h)
 *
 * <model> and <tenant> are 16 hex digits of a hash, keyed with the cluster
 * key, of the model's identity and the tenant's namespace: a replica of
 * another model or a request of another tenant computes other names.
 *
 * Every object is sealed with the cluster secret (--kv-shared-secret-file):
 *
 *   "TSO1" | nonce[24] | XChaCha20-Poly1305( entry ), AD = "TSO1" | name |
 *                                             namespace | model identity
 *   entry = "TSE1" | u32 n_tokens | u64 size[3] | part bytes (.kv .ckpt .dft)
 *
 * so an object that was flipped, truncated, copied to another name (another
 * tenant's, another model's) or sealed with another secret fails to open.
 */
#ifndef THAW_SHARED_SEAL_H
#define THAW_SHARED_SEAL_H

#include "base/blob.h" /* the parts of an entry */
#include "base/key.h"

#include <stddef.h>
#include <stdint.h>

#define THAW_SHARED_MAX_OBJECT ((size_t)2 << 30) /* bytes: a larger object is refused */

/* The cluster's keys: derived once from the secret (thaw_shared_derive). */
struct thaw_shared_names {
    uint8_t key[32];    /* the AEAD key derived from the secret */
    char model_tag[17]; /* <model> of the names: 16 hex digits and a NUL */
};

/* Derives the AEAD key from the secret (n_secret bytes) and the model's tag
 * from identity into *out. Returns 0, or THAW_EINVAL for a secret shorter
 * than 16 bytes. */
int thaw_shared_derive(const void *secret, size_t n_secret, const uint8_t identity[THAW_KEY_BYTES],
                       struct thaw_shared_names *out);

/* "v1/<model>/<tenant>/<kind>/<hex>" into out (>= 128 bytes); kind 'm' or 'b'. */
void thaw_shared_name(const struct thaw_shared_names *nm, const uint8_t ns[THAW_KEY_BYTES], char kind,
                      const uint8_t id[THAW_KEY_BYTES], char *out, size_t cap);

/* Seals an entry (parts may be absent) for the object `name` of tenant ns
 * into a malloc'd object (*obj, *n_obj bytes; the caller free()s it).
 * Returns 0, THAW_EINVAL (a name too long for the AD), THAW_ETOOBIG (over
 * THAW_SHARED_MAX_OBJECT) or THAW_ENOMEM. */
int thaw_shared_seal(const struct thaw_shared_names *nm, const char *name, const uint8_t ns[THAW_KEY_BYTES],
                     const uint8_t identity[THAW_KEY_BYTES], uint32_t n_tokens,
                     const struct thaw_part_blob parts[THAW_PART_COUNT], void **obj, size_t *n_obj);

/* Opens an object into blobs (blob.h), one per present part (the caller
 * drops each with thaw_blob_unref; absent parts: NULL, 0). Returns 0,
 * THAW_ECORRUPT (does not open: tampered, truncated, foreign name, other
 * secret; or a malformed entry inside), THAW_ENOMEM; parts all absent on
 * an error. */
int thaw_shared_open_object(const struct thaw_shared_names *nm, const char *name, const uint8_t ns[THAW_KEY_BYTES],
                            const uint8_t identity[THAW_KEY_BYTES], const void *obj, size_t n_obj,
                            uint32_t *n_tokens, struct thaw_part_blob parts[THAW_PART_COUNT]);

#endif

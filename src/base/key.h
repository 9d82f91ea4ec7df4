/* key.h — the one key of thaw: 32 bytes (BLAKE2b-256) naming a
 * conversation, a block, a binding, a tenant's namespace or a model's
 * fingerprint. Every tier indexes by it; keys.h says how each is derived.
 *
 * A key is a `uint8_t[THAW_KEY_BYTES]`, compared with memcmp. A leaf: it
 * includes nothing of thaw, so every storage header can include it.
 */
#ifndef THAW_KEY_H
#define THAW_KEY_H

#define THAW_KEY_BYTES 32

#endif

/* token.h — a token id and a sequence id as the lower layers see them.
 *
 * libllama's llama_token and llama_seq_id are int32_t; the cache tiers and
 * the formats they store (blocks, manifests, snapshots, .kv heads: tokens
 * as i32 little-endian) work on the same bits without including llama.h,
 * so a thaw_token array is a llama_token array and the other way round.
 * A leaf: it includes nothing of thaw.
 */
#ifndef THAW_TOKEN_H
#define THAW_TOKEN_H

#include <stdint.h>

typedef int32_t thaw_token;  /* llama_token */
typedef int32_t thaw_seq_id; /* llama_seq_id */

#endif

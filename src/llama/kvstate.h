/* kvstate.h — a sequence's state as bytes: the .kv and .ckpt blobs.
 *
 * Both cache tiers (RAM and disk) hold the same two blobs, so capture and
 * restore are written once, here.
 *
 *   .kv blob   (little-endian)
 *     u32 magic "TKV1" | u32 version (1) | u32 n_tokens | u32 reserved (0)
 *     u64 state_size
 *     i32 tokens[n_tokens]       the tokens whose KV the state holds
 *     u8  state[state_size]      llama_state_seq_get_data() output
 *
 *   .ckpt blob
 *     u32 magic "TCK1" | u32 version (1) | u32 count | u32 reserved (0)
 *     count x { i32 n_tokens | i32 pos_min | i32 pos_max | u32 flags (THAW_CKPT_*)
 *               u64 size | u8 data[size] }  llama_state_seq_get_data_ext(PARTIAL_ONLY)
 *
 * Parsing validates every length against the blob before reading, so a
 * damaged blob is THAW_ECORRUPT, never an overread. (The disk tier's
 * checksums catch damage first; this is the second line.)
 */
#ifndef THAW_KVSTATE_H
#define THAW_KVSTATE_H

#include "base/token.h"
#include <stddef.h>
#include <stdint.h>

struct llama_context; /* llama.h */

/* ---- .kv ---- */

/* Serialises seq's state with its token list into a blob (blob.h: the
 * caller drops it with thaw_blob_unref).
 * Returns 0, THAW_ENOMEM or THAW_ELLAMA (the state could not be read). */
int thaw_kvstate_capture(struct llama_context *ctx, thaw_seq_id seq, const thaw_token *tokens, int n_tokens,
                         void **out, size_t *n_out);

/* thaw_kvstate_capture into the caller's kept buffer *keep (a blob of
 * *keep_cap bytes, or NULL) when nothing else references it any more and
 * it is large enough; else into a new one (with a quarter of headroom)
 * that replaces it. *out is a new reference to *keep. Reusing memory that
 * was written before spares the page faults of fresh memory, which cost
 * several times the copy itself (measured: 128 MiB of state, 190 ms into
 * fresh pages, 20-25 ms into touched ones). */
int thaw_kvstate_capture_reuse(struct llama_context *ctx, thaw_seq_id seq, const thaw_token *tokens, int n_tokens,
                               void **keep, size_t *keep_cap, void **out, size_t *n_out);

struct thaw_kvstate_view {
    const thaw_token *tokens; /* points into the blob */
    int n_tokens;
    const void *state;         /* points into the blob */
    size_t n_state;
};

/* 1 if blob starts like a .kv blob (magic, and a header's length), else 0. */
int thaw_kvstate_is(const void *blob, size_t n);

/* From a .kv blob's first n bytes (its header at least): where its tokens
 * start (*off) and how many (*n_tokens). 0, THAW_ECORRUPT or
 * THAW_EVERSION. */
int thaw_kvstate_head_tokens(const void *head, size_t n, size_t *off, uint32_t *n_tokens);

/* Validates a .kv blob and points `v` into it (no copy). Returns 0 or
 * THAW_ECORRUPT / THAW_EVERSION. The blob must be 4-byte aligned. */
int thaw_kvstate_parse(const void *blob, size_t n, struct thaw_kvstate_view *v);

/* Bytes before the state in a .kv blob of n_tokens tokens, and writing
 * them (header and tokens) at blob: for a state built in place after them
 * (blocks.c) rather than captured. */
size_t thaw_kvstate_head_size(int n_tokens);
void thaw_kvstate_write_head(void *blob, const thaw_token *tokens, int n_tokens, size_t n_state);

/* Installs the state into seq (cleared first). Returns 0 or THAW_ELLAMA
 * (the seq is then empty). */
int thaw_kvstate_restore(struct llama_context *ctx, thaw_seq_id seq, const struct thaw_kvstate_view *v);

/* Bytes of whole states thaw_kvstate_capture* read out of a context and
 * thaw_kvstate_restore installed, since the start, over every context:
 * with the KV cache in device memory, what stores and restores copied
 * between the device and the host (thaw_kv_*_bytes_total). */
void thaw_kvstate_io_bytes(uint64_t *out, uint64_t *in);

/* ---- .ckpt ---- */

struct thaw_ckpt {
    int n_tokens;       /* tokens in the sequence when taken */
    int32_t pos_min, pos_max; /* positions its (partial) state covers (llama_pos) */
    void *data;         /* malloc'd, owned by the list */
    size_t size;
    uint32_t flags;     /* THAW_CKPT_SNAPSHOT: taken where a hybrid stores a snapshot (snapshots.h) */
};
#define THAW_CKPT_SNAPSHOT 1u

struct thaw_ckpt_list {
    struct thaw_ckpt *v;
    int n, cap;
};

/* Takes a checkpoint of seq (its SWA / recurrent part) holding n_tokens and
 * appends it, dropping the oldest beyond `max_keep` (and any at >= n_tokens).
 * Returns 0, THAW_ENOMEM or THAW_ELLAMA. */
int thaw_ckpt_take(struct thaw_ckpt_list *l, struct llama_context *ctx, thaw_seq_id seq, int n_tokens, int max_keep);

/* Takes a checkpoint of seq into c itself (no list: one kept, its buffer
 * reused; free c->data when done), e.g. the state a speculative verify
 * rolls back to. Returns 0, THAW_ENOMEM or THAW_ELLAMA. */
int thaw_ckpt_save(struct thaw_ckpt *c, struct llama_context *ctx, thaw_seq_id seq, int n_tokens);

/* Installs checkpoint c into seq's partial (SWA / recurrent) memory.
 * Returns 0 or THAW_ELLAMA. */
int thaw_ckpt_restore(const struct thaw_ckpt *c, struct llama_context *ctx, thaw_seq_id seq);

/* Drops checkpoints taken at more than n_tokens. */
void thaw_ckpt_truncate(struct thaw_ckpt_list *l, int n_tokens);
void thaw_ckpt_clear(struct thaw_ckpt_list *l);

/* Serialises the list into a blob (blob.h) (*out NULL and *n_out 0 for an
 * empty list). Returns 0 or THAW_ENOMEM. */
int thaw_ckpt_serialize(const struct thaw_ckpt_list *l, void **out, size_t *n_out);

/* Replaces `l` with the checkpoints in blob (copied). Returns 0,
 * THAW_ECORRUPT / THAW_EVERSION (l left empty) or THAW_ENOMEM. */
int thaw_ckpt_parse(const void *blob, size_t n, struct thaw_ckpt_list *l);

#endif

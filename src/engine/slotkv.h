/* slotkv.h — a slot's sequence in the llama_context: cut back, restored
 * from the cache tiers, captured for them.
 *
 * Besides the decode itself, the one place that changes what a slot's
 * sequence holds. Every removal also tells the tap (kvtap.h), and the
 * slot's bookkeeping (slot.h: tokens, checkpoints, held key) follows each
 * change. Sliding-window and recurrent memory cannot simply be truncated:
 * a rollback goes to the nearest context checkpoint that reaches back far
 * enough, or to nothing (full prefill).
 *
 * A restore is the lookup at the start of a request: the slot itself (it
 * still holds the conversation), then the tiers in kvcache.c's order;
 * every lookup is counted once under its outcome. A store hands the slot's
 * state to the tiers under s->store_key without waiting for I/O: blocks cut
 * straight from the cache's memory when the tap can (kvtap.h), else one
 * whole capture. Engine thread only, but for the assembly of a deferred
 * restore, which runs on the handle's restore thread.
 */
#ifndef THAW_SLOTKV_H
#define THAW_SLOTKV_H

#include "base/config.h"
#include "base/key.h"
#include "base/metrics.h"
#include "cache/kvcache.h"
#include "engine/slot.h"
#include "engine/task.h"
#include "llama/kvstate.h"

#include <llama.h>
#include <stdbool.h>

struct thaw_draft; /* draft.h */
struct thaw_kvtap; /* kvtap.h */

struct thaw_slotkv;

/* What the sequences live in; every pointer must outlive the handle. */
struct thaw_slotkv_params {
    const struct thaw_config *cfg; /* the --kv-cache-*, --cache-ram and --kv-shared* flags */
    struct llama_context *ctx;
    struct thaw_kvtap *tap;        /* NULL = off: stores capture whole states */
    bool tap_verify;               /* THAW_TEST_KVTAP_VERIFY: check every cut against a capture */
    struct thaw_draft *draft;      /* NULL = no speculative decoding */
    int n_swa;                     /* sliding window, 0 = none or --swa-full */
    bool recurrent;                /* recurrent / hybrid memory */
    uint8_t identity[THAW_KEY_BYTES]; /* model + settings (keys.h), written into every .idx */
    struct thaw_metrics *metrics;  /* lookups, stores; must outlive the handle */
    struct thaw_disk_cache *disk_store; /* the process's shared --kv-cache-dir (kvcache.h: disk_store);
                                         * NULL: cfg->kv_cache_dir is opened for this context alone */
    /* called on the restore thread when a deferred restore is assembled
     * (thaw_slotkv_restore): wakes the engine; NULL = nothing to wake */
    void (*restored)(void *ud);
    void *restored_ud;
};

/* Opens the cache tiers the flags ask for (kvcache.h), with blocks only
 * when the context's state layout passes kvlayout.c's round trip on slot
 * 0's still empty sequence, and cut from the tap only when the tap passes
 * its own; with cfg->embedding none (nothing is stored or restored: the
 * slots' sequences are only cleared). Returns 0, THAW_ENOMEM or
 * thaw_kvcache_open's error. */
int thaw_slotkv_new(const struct thaw_slotkv_params *p, struct thaw_slotkv **out);
/* Closes the tiers (what the disk writer holds is written first), frees
 * the reused capture buffer and the handle. NULL: no-op. */
void thaw_slotkv_free(struct thaw_slotkv *k);

/* The tiers, for what the engine asks of them directly (prefetch, the
 * shared tier's fetches, metrics); owned by k. */
struct thaw_kvcache *thaw_slotkv_cache(const struct thaw_slotkv *k);

/* Removes the slot's positions >= p (0: all) from its sequence and from
 * what the tap knows of it; the slot's bookkeeping is the caller's. Returns
 * llama_memory_seq_rm's verdict. */
bool thaw_slotkv_rm(struct thaw_slotkv *k, const struct thaw_slot *s, int p);

/* Empties the slot's sequence (thaw_slot_forget). */
void thaw_slotkv_clear(struct thaw_slotkv *k, struct thaw_slot *s);

/* The longest prefix of at most n tokens the slot can resume at, and the
 * checkpoint that takes it there (*ckpt NULL: a plain truncation does). */
int thaw_slotkv_rollback_target(const struct thaw_slotkv *k, const struct thaw_slot *s, int n,
                                const struct thaw_ckpt **ckpt);

/* Truncates the slot's sequence to at most n tokens, as close to n as its
 * memory allows. Returns the new length (0: the sequence was emptied). */
int thaw_slotkv_rollback(struct thaw_slotkv *k, struct thaw_slot *s, int n);

/* The lookup at the start of t on slot s, which holds n_past tokens of its
 * prompt: the slot itself, then the cache tiers; a hit is installed (and
 * the slot holds t's lookup key). Sets s->timings.cache_source and
 * restore_ms on a hit. Returns the prompt tokens the slot holds afterwards
 * (0 when a bad entry emptied it).
 *
 * `defer` (other slots are decoding): a keyed hit whose blocks must be
 * read and assembled, or whose checksum must be waited for, is handed to
 * the restore thread instead (kvcache.h, thaw_kvcache_find_deferred), so
 * the other slots' streams go on meanwhile: then THAW_SLOTKV_RESTORING,
 * s->restore is set, the slot must stay out of every batch, and
 * thaw_slotkv_restore_resume finishes the lookup once
 * thaw_slotkv_restore_ready says so (params.restored wakes the engine
 * then). Only the install (libllama's copy into the sequence) and what
 * follows stay on the engine thread. */
#define THAW_SLOTKV_RESTORING (-1000)
int thaw_slotkv_restore(struct thaw_slotkv *k, struct thaw_slot *s, const struct thaw_task *t, int n_past,
                        bool defer);
bool thaw_slotkv_restore_ready(const struct thaw_slot *s);
/* Waits for s's assembly if it is still running (at shutdown), then
 * finishes the lookup as thaw_slotkv_restore would have; s->restore is
 * cleared. Returns as thaw_slotkv_restore. */
int thaw_slotkv_restore_resume(struct thaw_slotkv *k, struct thaw_slot *s, const struct thaw_task *t);

/* Whether a slot holding n_tokens will be stored when its reply ends (a
 * tier is on, and n_tokens reaches --kv-cache-min-tokens). */
bool thaw_slotkv_will_store(const struct thaw_slotkv *k, int n_tokens);

/* Stores the slot's state (its checkpoints and draft too) under
 * s->store_key; the slot then holds that key. Not when it holds fewer than
 * min_tokens tokens; a failed capture is logged and dropped. */
void thaw_slotkv_store(struct thaw_slotkv *k, struct thaw_slot *s);

/* The whole blocks of the slot's first n tokens (its prompt, while the
 * reply is generated) go to the disk ahead of the turn's store, which
 * then writes only the reply's blocks and the manifest: a reply is
 * durable that much sooner (kvcache.h, thaw_kvcache_store_ahead). Blocks
 * cut from the tap only (no capture: that would cost the engine a copy of
 * the whole state), none for recurrent memory; best effort. */
void thaw_slotkv_store_ahead(struct thaw_slotkv *k, struct thaw_slot *s, int n);

/* After a reply (s->store_key derived, s->task still set): moves the slot
 * to FIXUP. canon[0..n_canon) (moved in; NULL: not known) are the tokens
 * the next turn will present for this conversation. When the slot's tokens
 * differ from them and the sequence can roll back to their common prefix
 * (within the reply and a little more), it does, and FIXUP re-decodes the
 * rest; otherwise the state is stored as generated (FIXUP with nothing to
 * re-decode, so the store waits for a moment nobody decodes). */
void thaw_slotkv_prepare_store(struct thaw_slotkv *k, struct thaw_slot *s, llama_token *canon, int n_canon);

#endif

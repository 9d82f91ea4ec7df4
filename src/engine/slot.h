/* slot.h — one sequence of the llama_context and the request it serves.
 *
 * A slot's phases and the legal moves between them (DESIGN §4, STYLE 15),
 * each performed by thaw_slot_move, with what it does besides the phase:
 *
 *   from -> to       when                              side effects
 *   IDLE -> PREFILL  admitted a task (engine slot_start) takes the task and
 *                                                      its sampler, resets the
 *                                                      request's fields and
 *                                                      what n-gram verdicts
 *                                                      taught (ngram.h)
 *   PREFILL -> GEN   first token sampled               -
 *   PREFILL -> IDLE  failed or cancelled               releases task + sampler
 *   GEN -> IDLE      finished, failed or cancelled     releases task + sampler
 *   PREFILL -> FIXUP finished at once (EOG) / finished releases task + sampler,
 *   GEN -> FIXUP     and re-decodes the canonical form takes the fix-up tokens
 *   FIXUP -> IDLE    stored, cut short or failed       frees the fix-up tokens
 *
 * Every move updates the busy gauges (metrics slots_busy: every phase but
 * IDLE; requests_processing: PREFILL and GEN), so they always equal the
 * number of slots in those phases.
 *
 * PREFILL and GEN hold a task; FIXUP runs after the reply has been sent:
 * the slot re-decodes the reply's tail as the next turn will present it
 * (DESIGN §2 "Beyond the seed"), then stores.
 *
 * What the KV holds (`n_tokens`, the checkpoints, `holds_key`) is kept here
 * too: thaw_slot_forget, thaw_slot_truncate and thaw_slot_hold are its only
 * writers besides the decode loop appending tokens. The llama calls that
 * change the sequence itself are engine.c's.
 *
 * The struct is open to engine.c, which drives the decode loop over its
 * fields, and to slotkv.c, which changes what its sequence holds (one
 * layer's private state, split out so the phases live in one place); only
 * slot.c writes `phase` and `holds_key`. Engine thread only.
 */
#ifndef THAW_SLOT_H
#define THAW_SLOT_H

#include "api/api.h"
#include "base/buf.h"
#include "base/metrics.h"
#include "cache/keys.h"
#include "cache/kvcache.h"
#include "engine/task.h"
#include "llama/kvstate.h"

#include <llama.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum thaw_slot_phase {
    THAW_SLOT_IDLE,    /* no task; the KV stays for reuse */
    THAW_SLOT_PREFILL, /* decoding the prompt */
    THAW_SLOT_GEN,     /* sampling the reply */
    THAW_SLOT_FIXUP,   /* reply sent; re-decoding its canonical form, then store */
    THAW_SLOT_PHASE_COUNT
};

struct thaw_token_probs; /* api/logprobs.h */
struct thaw_slot_restore; /* slotkv.c */

struct thaw_slot {
    int id;                     /* == llama seq_id */
    enum thaw_slot_phase phase; /* written by thaw_slot_move only */
    struct thaw_task *task;     /* set in PREFILL and GEN */

    llama_token *tokens; /* tokens whose KV the sequence holds, n_tokens of cap_tokens */
    int n_tokens, cap_tokens;

    struct thaw_ckpt_list ckpts; /* partial-memory snapshots for rollback (SWA / recurrent) */

    /* the request in progress */
    struct thaw_slot_restore *restore; /* PREFILL: a restore assembled off the engine thread (slotkv.h); the slot
                                        * stays out of every batch until the engine resumes it */
    int n_prompt_done;      /* prompt tokens already in the KV */
    llama_token next_token; /* GEN: sampled, waits to be decoded */
    llama_token *drafts;    /* GEN with speculation on: the proposal after next_token
                               (n-grams' or the draft model's), n_drafts */
    int n_drafts;
    /* speculation on a recurrent target, whose state cannot drop a
     * rejected draft: the state before the verify batch (spec_ckpt), and
     * the verdict between the verify's two halves (generate.c) */
    struct thaw_ckpt spec_ckpt;
    int spec_accepted;                    /* drafts the target agreed with */
    llama_token spec_last;                /* the target's token after them */
    struct thaw_token_probs *spec_probs;  /* the emitted tokens' (logprobs), or NULL */
    int spec_base;                        /* n_tokens before the verify batch while the state holds more
                                           * than stays (replayed: thaw_gen_spec_settle); -1 = none */
    int spec_kv_end;                      /* where the state ends after the verify batch */
    struct thaw_ngram *ngram; /* the n-gram drafter over this slot's tokens (ngram.h); NULL = none */
    int i_batch;    /* row of this slot's logits in the current batch, -1 = none */
    int n_in_batch; /* tokens this slot put in the current batch */
    struct llama_sampler *smpl;
    struct thaw_buf gen; /* reply bytes so far (NUL-terminated) */
    size_t n_sent;    /* bytes of gen handed to the task */
    size_t stop_hold; /* longest stop string - 1: bytes held back while streaming */
    const char *stop_word; /* the request's own stop string the reply ended on (in task->req), or NULL */
    int n_decoded;    /* tokens sampled */
    int64_t t_start_us, t_prompt_done_us;
    struct thaw_timings timings;

    int64_t last_used_us;
    uint8_t ns[THAW_KEY_BYTES]; /* the tenant whose tokens the KV holds (n_tokens
                                   > 0) */
    bool holds_key;             /* held_key names the conversation in the KV (thaw_slot_hold) */
    uint8_t held_key[THAW_KEY_BYTES];

    /* the key this turn's conversation was looked up under: its previous
     * turn, which this turn's store supersedes in the RAM tier */
    bool has_prev_key;
    uint8_t prev_key[THAW_KEY_BYTES];

    /* FIXUP: decode fix[n_tokens..n_fix) then store under store_key */
    llama_token *fix;
    int n_fix;
    int64_t fix_since_us; /* when the slot entered FIXUP */
    bool stored_early;    /* FIXUP: what it held was stored before its re-decoding (engine.c) */
    uint8_t store_key[THAW_KEY_BYTES];
    /* the request's cache_control marks as retention hints for what this
     * turn stores (kvcache.h), set with store_key */
    struct thaw_kvcache_retain retain[THAW_API_MAX_RETAIN];
    int n_retain;
    int store_parts_at; /* > 0: the next turn presents tokens that part from the stored ones at this
                         * position (stored as generated: no rollback reached the canonical form) */

    struct thaw_slots_view *view; /* published to at each move (slots_view.h); NULL = none */
};

/* An IDLE slot for sequence `id`, holding nothing (caller storage). */
void thaw_slot_init(struct thaw_slot *s, int id);

/* Frees what the slot owns (tokens, reply text, fix-up tokens, drafts,
 * checkpoints). The task and sampler must have been released. */
void thaw_slot_free(struct thaw_slot *s);

/* Whether the table above allows from -> to (a move to the same phase never
 * is). */
bool thaw_slot_move_legal(enum thaw_slot_phase from, enum thaw_slot_phase to);

/* What a move takes in; only the fields its target phase names are read. */
struct thaw_slot_enter {
    struct thaw_task *task;     /* -> PREFILL: the task; the caller's reference moves to the slot */
    struct llama_sampler *smpl; /* -> PREFILL: its sampler (moves to the slot), NULL when it could not be made */
    llama_token *fix;           /* -> FIXUP: the tokens to re-decode up to (moved to the slot, n_fix of
                                   them); NULL: nothing to re-decode, store what the slot holds */
    int n_fix;
};

/* The one writer of s->phase: moves the slot to `to`, performs the move's
 * side effects (the table above; `in` may be NULL for moves that take
 * nothing) and updates m->slots_busy (m may be NULL). An illegal move is a
 * bug in the engine: it is logged and the process aborts, whatever NDEBUG
 * says (a lost busy count would stall admission silently). */
void thaw_slot_move(struct thaw_slot *s, enum thaw_slot_phase to, const struct thaw_slot_enter *in,
                    struct thaw_metrics *m);

/* How many of slots[0..n) are in each phase: count[phase]. */
void thaw_slot_count(const struct thaw_slot *slots, int n, int count[THAW_SLOT_PHASE_COUNT]);

/* ---- what the KV holds ---- */

/* The sequence was emptied: no tokens, no checkpoints, no key. */
void thaw_slot_forget(struct thaw_slot *s);

/* The sequence was cut to its first n (<= n_tokens) tokens: checkpoints
 * past n go, and a shorter sequence no longer holds its conversation (only
 * a prefix of it). */
void thaw_slot_truncate(struct thaw_slot *s, int n);

/* The KV now holds the conversation `key` names (restored or stored);
 * NULL: no conversation any more. */
void thaw_slot_hold(struct thaw_slot *s, const uint8_t *key);

/* Whether the KV holds the conversation `key` names. */
bool thaw_slot_holds(const struct thaw_slot *s, const uint8_t key[THAW_KEY_BYTES]);

/* ---- the reply's text ---- */

/* The request's timings at its end (now_us): prompt_n, prompt_ms (restore
 * time excluded), predicted_n and predicted_ms. */
void thaw_slot_finish_timings(struct thaw_slot *s, int64_t now_us);

/* Hands the task every byte of the reply that can no longer change:
 * complete UTF-8, and not a possible beginning of a stop string (unless
 * `final`). */
void thaw_slot_flush_text(struct thaw_slot *s, bool final);

/* The earliest occurrence in s->gen of any of the task's stop strings that
 * ends at or after byte `from`, or NULL. *which (may be NULL) gets the
 * string's index: below task->req.n_stop one of the request's, above it
 * one the template added (task->gen.stops). */
const char *thaw_slot_find_stop(const struct thaw_slot *s, size_t from, int *which);

/* "idle", "prefill", "gen", "fixup". */
const char *thaw_slot_phase_name(enum thaw_slot_phase p);

/* Room for n tokens in s->tokens. Returns 0 or THAW_ENOMEM. */
int thaw_slot_reserve(struct thaw_slot *s, int n);

/* Appends n reply bytes to s->gen (kept NUL-terminated). Returns 0 or
 * THAW_ENOMEM (s->gen unchanged; later appends fail too until the slot takes
 * its next request). */
int thaw_slot_gen_append(struct thaw_slot *s, const char *p, size_t n);

#endif

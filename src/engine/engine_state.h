/* engine_state.h — the engine's state, shared by the files that make it
 * up: engine.c (the loop, admission, lifecycle), generate.c (a reply's
 * tokens) and prepare.c (a request made ready: it reads the settings fixed
 * at start-up only). Nothing else includes it: engine.h is the engine's
 * interface.
 * Engine thread only, except where a field says otherwise. */
#ifndef THAW_ENGINE_STATE_H
#define THAW_ENGINE_STATE_H

#include "engine/engine.h"
#include "engine/slot.h"
#include "llama/placement.h"
#include "llama/vision.h"

#include <llama.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

struct thaw_engine {
    const struct thaw_config *cfg;
    struct thaw_metrics *metrics;
    struct thaw_slots_view *view; /* GET /slots (slots_view.h) */

    struct llama_model *model;
    const struct llama_vocab *vocab;
    struct llama_context *ctx;
    struct thaw_chat *chat;
    struct thaw_vision *vision; /* --mmproj: the projector (vision.h); NULL = text only */
    struct thaw_sched *sched;
    char *model_name;
    uint8_t fingerprint[THAW_KEY_BYTES];
    char settings[256];        /* the context settings that shape the state's bytes */
    double fixup_us_per_tok;   /* decode cost of a FIXUP token alone (moving average), 0 = unknown */
    double prompt_us_per_tok;  /* decode cost of a token in a prompt piece beside streams (moving average), 0 = unknown */
    bool batch_fixup_only;     /* the batch in flight holds FIXUP tokens only */
    bool fixup_awaited;        /* a queued request waits for a FIXUP slot to finish (admit): full speed */
    struct thaw_threads *threads; /* the context's CPU threadpools (threads.h); NULL: ggml's per graph */
    struct thaw_kvtap *tap;    /* where the KV cache's cells are: stores cut blocks from it (kvtap.h); NULL = off */
    bool tap_verify;           /* THAW_TEST_KVTAP_VERIFY: check every cut against a capture */
    struct thaw_slotkv *skv;   /* the slots' sequences: rollback, restore, store (slotkv.h) */
    struct thaw_placement placement; /* where the model and context sit (GET /props), read once at start */

    struct thaw_slot *slots;
    int n_slots;
    int n_ctx_slot;            /* tokens per sequence */
    int max_token_bytes;       /* longest piece of text one token stands for */
    int n_swa;                 /* sliding window, 0 = none or --swa-full */
    bool recurrent;            /* recurrent / hybrid memory: cannot roll back without a checkpoint */
    bool partial;              /* n_swa > 0 || recurrent: checkpoints needed */

    struct thaw_draft *draft;  /* NULL = no speculative decoding */
    struct thaw_kvcache *kv;   /* the cache tiers (kvcache.h), skv's */
    uint8_t identity[THAW_KEY_BYTES]; /* model + settings, written into every .idx */
    struct llama_batch batch;  /* n_batch tokens */
    struct llama_batch spec_batch; /* speculation on a recurrent target: the tokens a rejected draft's
                                    * rollback decodes again (thaw_gen_spec_settle) */
    int n_batch;
    int n_ubatch;              /* tokens per micro-batch: the longest prompt an embedding takes */

    /* --embedding (embed.c): every task is EMBED or RERANK */
    bool embedding;
    int pooling;               /* enum llama_pooling_type of the context (-1 without --embedding) */
    int n_embd_out;            /* floats per vector */
    int n_cls_out;             /* the rank head's outputs (pooling rank) */

    pthread_t thread;
    atomic_bool stop;

    /* the reasoning budget requests default to: --reasoning-budget and its
     * message, changed at run time by POST /props (--props); any thread,
     * under props_mu (thaw_engine_reasoning_get / _set) */
    pthread_mutex_t props_mu;
    int reasoning_budget;            /* -1 unlimited */
    char *reasoning_budget_message;  /* NULL = none */
};

/* engine.c: the slot's request or post-reply work ends (the slot is free
 * again); or fails, its task answered with status and msg and its KV
 * cleared. */
void thaw_engine_slot_idle(struct thaw_engine *e, struct thaw_slot *s);
void thaw_engine_slot_fail(struct thaw_engine *e, struct thaw_slot *s, int status, const char *msg);

/* generate.c: samples the slot's row idx of the last decode into *tok,
 * and its probabilities into *probs when the request wants them (probs
 * may be NULL otherwise). Returns 0, or nonzero once the slot has failed
 * (logged, the task answered). */
struct thaw_token_probs;
int thaw_gen_sample(struct thaw_engine *e, struct thaw_slot *s, int idx, llama_token *tok,
                    struct thaw_token_probs *probs);
/* Takes one sampled token: text out, its probabilities (the request's
 * logprobs: `probs`, from thaw_gen_sample) recorded with its bytes, stop
 * conditions, the next decode (the slot stays in GEN) or the reply's end
 * (FIXUP or IDLE). */
void thaw_gen_take_token(struct thaw_engine *e, struct thaw_slot *s, llama_token tok,
                         const struct thaw_token_probs *probs);
/* Asks the draft for up to `room` tokens after the slot's next token, into
 * s->drafts; returns how many (0: none worth verifying). */
int thaw_gen_draft(struct thaw_engine *e, struct thaw_slot *s, int room);
/* The target's verdict on the slot's drafts, once the batch holding them
 * is decoded: the matching ones kept, the samples emitted, the rest rolled
 * back. In two halves on a recurrent target: _sample takes the target's
 * samples (from the last decode's logits), _take emits them and brings the
 * state back to what stays, which may decode again (thaw_gen_spec_settle):
 * every slot's rows are sampled before any slot's _take. _sample returns
 * 0, or nonzero once the slot failed. */
void thaw_gen_verify(struct thaw_engine *e, struct thaw_slot *s);
int thaw_gen_verify_sample(struct thaw_engine *e, struct thaw_slot *s);
void thaw_gen_verify_take(struct thaw_engine *e, struct thaw_slot *s);

/* embed.c: an EMBED or RERANK task enters slot s (IDLE -> PREFILL, its
 * sequence emptied; returns 0); a step's batch is whole prompts of such
 * slots, at most n_ubatch tokens in all; after the decode each answered
 * slot's task gets its vectors (or fails) and the slot is idle and empty. */
int thaw_embed_start(struct thaw_engine *e, struct thaw_slot *s, struct thaw_task *t);
void thaw_embed_build_batch(struct thaw_engine *e);
void thaw_embed_after_decode(struct thaw_engine *e, int64_t t0, int64_t t1);

#endif

/* engine.c — model + context, the decode loop, batching across slots.
 *
 * Map:
 *   ---- slots ----        a slot's end (idle, failed)
 *   ---- admission ----    queued task -> the slot the scheduler picks
 *   ---- the loop ----     one llama_batch for every active slot per step
 *   ---- lifecycle ----    load model, context, thread; shutdown
 *
 * Who does what for it: slot.c moves a slot between phases (IDLE -> PREFILL
 * -> GEN -> (FIXUP) -> IDLE; slot.h has the table, thaw_slot_move is the
 * only place a phase, the busy gauge or what a move releases changes);
 * scheduler.c plans each step (which slot a task gets, what post-reply work
 * may run); slotkv.c changes what a slot's sequence holds (rollback,
 * restore from the cache tiers, store to them). FIXUP happens after the
 * reply has been sent: the slot re-decodes the reply's tail as the next
 * turn will present it (the canonical rendering, DESIGN §2 "Beyond the
 * seed") so the stored state matches the next request token for token,
 * then stores it.
 *
 * generate.c takes each sampled token (text out, stop strings, the
 * reply's end, speculative drafts and their verdict); under --embedding
 * embed.c builds each step's batch (whole prompts) and answers after the
 * decode instead, on the same queue, admission and slots; engine_state.h
 * is the state these files share.
 *
 * Only engine_main() and what it calls touch e->ctx.
 */
#include "engine/engine.h"

#include "api/template.h"
#include "base/error.h"
#include "base/log.h"
#include "base/testhooks.h"
#include "engine/draft.h"
#include "engine/engine_state.h"
#include "engine/ngram.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/slotkv.h"
#include "engine/slots_view.h"
#include "llama/fingerprint.h"
#include "llama/kvtap.h"
#include "llama/params.h"
#include "llama/threads.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- slots --------------------------------------------------------------------- */

/* At shutdown the re-decoding left gets this part of --shutdown-timeout,
 * at full speed (the rest is for storing and writing what it made). */
static int64_t shutdown_fixup_us(const struct thaw_engine *e)
{
    return (int64_t)e->cfg->shutdown_timeout_s * 1000000 / 4;
}

/* Ends the slot's request or post-reply work: the slot is free again. */
void thaw_engine_slot_idle(struct thaw_engine *e, struct thaw_slot *s)
{
    thaw_slot_move(s, THAW_SLOT_IDLE, NULL, e->metrics);
}

void thaw_engine_slot_fail(struct thaw_engine *e, struct thaw_slot *s, int status, const char *msg)
{
    if (s->task)
        thaw_task_fail(s->task, status, msg);
    thaw_slotkv_clear(e->skv, s); /* its KV may be half-written */
    thaw_engine_slot_idle(e, s);
}

/* ---- admission ---------------------------------------------------------------- */

static int slot_started(struct thaw_engine *e, struct thaw_slot *s, struct thaw_task *t, int n_past,
                        int64_t t_restore);
static bool engine_alone(const struct thaw_engine *e, const struct thaw_slot *except);

static int slot_start(struct thaw_engine *e, struct thaw_slot *s, struct thaw_task *t)
{
    const struct thaw_chat_request *req = &t->req;

    thaw_slot_move(s, THAW_SLOT_PREFILL, &(struct thaw_slot_enter){.task = t, .smpl = thaw_sampler_new(e->vocab, &e->cfg->sampling, e->n_ctx_slot, t)},
                   e->metrics);
    if (!s->smpl && t->gen.grammar) {
        thaw_engine_slot_fail(e, s, 400, "the grammar for this request (its grammar, json_schema, response_format or tools) does not compile");
        return THAW_EINVAL;
    }
    if (!s->smpl || thaw_slot_reserve(s, t->n_prompt + 1) != 0) {
        thaw_engine_slot_fail(e, s, 500, "out of memory");
        return THAW_ENOMEM;
    }

    if (memcmp(s->ns, t->ns, THAW_KEY_BYTES) != 0) {
        thaw_slotkv_clear(e->skv, s); /* another tenant's tokens: never a prefix for this one */
        memcpy(s->ns, t->ns, THAW_KEY_BYTES);
    }
    int n_past = req->cache_prompt ? thaw_lcp(s->tokens, s->n_tokens, t->prompt, t->n_prompt) : 0;
    if (n_past > 0)
        s->timings.cache_source = "slot";
    /* (a prompt with images too: every reuse is bounded by a token prefix
     * match, and an image's placeholders pin its bytes and the projector,
     * vision.h) */
    int64_t t_restore = thaw_now_us();
    if (thaw_kvcache_enabled(e->kv)) {
        /* beside other slots' work, a restore's blocks are read and
         * assembled on the restore thread (slotkv.h): the slot waits out of
         * the batches, and slot_resume installs them */
        n_past = thaw_slotkv_restore(e->skv, s, t, n_past, !engine_alone(e, s));
        if (n_past == THAW_SLOTKV_RESTORING) {
            thaw_metrics_hold(e->metrics, THAW_HOLD_RESTORE, thaw_now_us() - t_restore);
            return 0;
        }
    }
    return slot_started(e, s, t, n_past, t_restore);
}

/* A slot's deferred restore is assembled: installed now, and its request
 * goes on where slot_start left it. */
static void slot_resume(struct thaw_engine *e, struct thaw_slot *s)
{
    int64_t t_restore = thaw_now_us();
    int n_past = thaw_slotkv_restore_resume(e->skv, s, s->task);

    slot_started(e, s, s->task, n_past, t_restore);
}

/* The rest of a request's start once the lookup is done (n_past: the
 * prompt tokens the slot holds; t_restore: when this piece of the lookup
 * began on the engine thread, for its hold). */
static int slot_started(struct thaw_engine *e, struct thaw_slot *s, struct thaw_task *t, int n_past,
                        int64_t t_restore)
{
    /* at least one prompt token must be decoded to get logits to sample from */
    if (n_past >= t->n_prompt)
        n_past = t->n_prompt - 1;
    /* never resume inside an image: its positions attend to each other */
    n_past = thaw_vision_prompt_back_off(t->vision, n_past);
    n_past = thaw_slotkv_rollback(e->skv, s, n_past);
    if (thaw_vision_prompt_back_off(t->vision, n_past) != n_past) /* a checkpoint inside an image */
        n_past = thaw_slotkv_rollback(e->skv, s, thaw_vision_prompt_back_off(t->vision, n_past));
    if (thaw_kvcache_enabled(e->kv) || e->partial) /* a lookup, restore or rollback could have run */
        thaw_metrics_hold(e->metrics, THAW_HOLD_RESTORE, thaw_now_us() - t_restore);
    if (s->timings.restore_ms > 0) {
        char hex[17];
        thaw_keys_short(t->lookup_key, hex);
        LOG_INF("slot %d: restored %s from %s in %.1f ms: %d of %d prompt tokens reused%s", s->id, hex,
                s->timings.cache_source, s->timings.restore_ms, n_past, t->n_prompt,
                n_past == 0 ? " (no checkpoint reaches back to where it diverges)" : "");
    }
    if (n_past == 0)
        s->timings.cache_source = "none";
    s->n_prompt_done = n_past;
    s->timings.cache_n = n_past;
    /* Anthropic's cache_creation_input_tokens, told when the stream opens:
     * a prompt long enough to be stored with its reply (slot_finish clears
     * it when the reply is not stored after all) */
    s->timings.cache_new_n = thaw_slotkv_will_store(e->skv, t->n_prompt) ? t->n_prompt - n_past : 0;
    thaw_task_started(t, n_past, s->timings.cache_new_n, s->timings.cache_source);
    if (thaw_task_progress(t, n_past, thaw_now_us() - s->t_start_us) != 0)
        LOG_WRN("slot %d: out of memory for a progress report", s->id);
    atomic_fetch_add(&e->metrics->prompt_cached_tokens, (uint64_t)n_past);
    LOG_DBG("slot %d: start, prompt %d tokens, %d reused (%s)", s->id, t->n_prompt, n_past, s->timings.cache_source);
    return 0;
}

/* THAW_TEST_FIXUP_HOLD (testhooks.h): the slot's re-decoding waits for a
 * request that needs the slot, or for shutdown. */
static bool fixup_held(const struct thaw_engine *e, const struct thaw_slot *s)
{
    return thaw_test_hook(THAW_HOOK_FIXUP_HOLD) && s->phase == THAW_SLOT_FIXUP && s->n_tokens < s->n_fix &&
           !e->fixup_awaited && !atomic_load(&e->stop);
}

/* Cuts a slot's post-reply work short for a request that needs the slot
 * (t; NULL at shutdown):
 * its tokens are a prefix of the conversation as the next turn presents
 * it, so that is what is stored (the next turn prefills the rest). Not
 * stored when `t` is that very next turn: it continues on these tokens and
 * stores when it is done. */
static void slot_cut_fixup(struct thaw_engine *e, struct thaw_slot *s, const struct thaw_task *t)
{
    bool next_turn = t && t->has_lookup_key && memcmp(t->lookup_key, s->store_key, THAW_KEY_BYTES) == 0;

    if (t)
        LOG_DBG("slot %d: post-reply work cut short at %d of %d tokens for a waiting request%s", s->id,
                s->n_tokens, s->n_fix, next_turn ? " (its next turn)" : "");
    else
        LOG_WRN("slot %d: shutdown: post-reply work stopped at %d of %d tokens after %.1f s; storing those", s->id,
                s->n_tokens, s->n_fix, (double)shutdown_fixup_us(e) / 1e6);
    atomic_fetch_add(&e->metrics->fixups_cut, 1);
    if (next_turn)
        thaw_slot_hold(s, s->store_key);
    else
        thaw_slotkv_store(e->skv, s);
    thaw_engine_slot_idle(e, s);
}

/* Slot s as the scheduler sees it for task t (scheduler.h). A task that
 * names its slot (llama-server's id_slot) sees every other slot as taken:
 * it waits for its own. */
static struct thaw_slot_view slot_view(const struct thaw_slot *s, const struct thaw_task *t)
{
    /* another tenant's prefix is no prefix: it must not be reused, nor
     * steer the choice (its timing would leak it) */
    bool same_ns = memcmp(s->ns, t->ns, THAW_KEY_BYTES) == 0;
    bool mine = t->req.id_slot < 0 || t->req.id_slot == s->id;

    return (struct thaw_slot_view){
        .idle = mine && s->phase == THAW_SLOT_IDLE,
        .fixup = mine && s->phase == THAW_SLOT_FIXUP,
        .tokens = s->tokens,
        .n_tokens = same_ns ? s->n_tokens : 0,
        .last_used_us = s->last_used_us,
        .holds_key = t->has_lookup_key && thaw_slot_holds(s, t->lookup_key),
        .next_turn = s->phase == THAW_SLOT_FIXUP && same_ns && t->has_lookup_key &&
                     memcmp(t->lookup_key, s->store_key, THAW_KEY_BYTES) == 0,
        .fix_left = s->phase == THAW_SLOT_FIXUP ? s->n_fix - s->n_tokens : 0,
    };
}

/* Slots whose restore is being assembled (slotkv.h). */
static int restoring(const struct thaw_engine *e)
{
    int n = 0;

    for (int i = 0; i < e->n_slots; i++)
        n += e->slots[i].restore != NULL;
    return n;
}

/* Whether a slot's restore is assembled, waiting to be installed. A
 * kick that a pop took in between would otherwise be lost to the wait. */
static bool restore_ready(const struct thaw_engine *e)
{
    for (int i = 0; i < e->n_slots; i++)
        if (thaw_slotkv_restore_ready(&e->slots[i]))
            return true;
    return false;
}

/* Moves queued tasks into slots where the scheduler says
 * (thaw_sched_admit: an idle slot, or one whose post-reply work it cuts
 * short or waits for). `block` waits for a task when no slot is busy
 * (nothing else to do). Returns the number of busy slots. */
static int admit(struct thaw_engine *e, bool block)
{
    struct thaw_slot_view *views = NULL;
    int count[THAW_SLOT_PHASE_COUNT], held = 0;

    e->fixup_awaited = false;
    /* kept turn-end snapshots of slots idle long enough (kvcache.h); the
     * wait below ends when the next one is due */
    int64_t due_us = thaw_kvcache_flush_idle(e->kv);
    thaw_slot_count(e->slots, e->n_slots, count);
    for (int i = 0; i < e->n_slots; i++)
        held += fixup_held(e, &e->slots[i]);
    int busy = e->n_slots - count[THAW_SLOT_IDLE];
    int n_restoring = restoring(e);
    int working = busy - held;
    int open = count[THAW_SLOT_IDLE] + count[THAW_SLOT_FIXUP];
    while (open > 0) {
        /* (a restore's end wakes the wait: slotkv's restored callback) */
        bool wait = block && working == n_restoring && !atomic_load(&e->stop);
        struct thaw_task *t = wait ? thaw_sched_pop_for(e->sched, due_us) : thaw_sched_pop(e->sched, false);
        if (!t)
            break;
        atomic_store(&e->metrics->queue_depth, thaw_sched_depth(e->sched));
        if (!thaw_task_client_alive(t)) {
            thaw_task_fail(t, 499, "cancelled");
            thaw_task_release(t);
            continue;
        }
        if (!views && !(views = calloc((size_t)e->n_slots, sizeof *views))) {
            thaw_task_fail(t, 500, "out of memory");
            thaw_task_release(t);
            break;
        }
        for (int i = 0; i < e->n_slots; i++)
            views[i] = slot_view(&e->slots[i], t);
        const struct thaw_sched_task_view tv = {t->prompt, t->n_prompt, t->req.cache_prompt};
        const struct thaw_sched_params sp = {e->cfg->slot_prompt_similarity, e->cfg->fixup_wait_ms,
                                             e->fixup_us_per_tok};
        struct thaw_sched_admission a = thaw_sched_admit(views, e->n_slots, &tv, &sp);
        if (a.action == THAW_SCHED_NONE || a.action == THAW_SCHED_WAIT) {
            /* NONE: its id_slot is busy (otherwise it cannot happen while
             * open > 0); WAIT: finish that FIXUP at full speed, then come back */
            thaw_sched_unpop(e->sched, t);
            e->fixup_awaited = a.action == THAW_SCHED_WAIT;
            break;
        }
        struct thaw_slot *s = &e->slots[a.slot];
        if (a.action == THAW_SCHED_CUT) {
            bool was_held = fixup_held(e, s);
            slot_cut_fixup(e, s, t);
            busy--;
            working -= !was_held;
        }
        open--;
        if ((t->kind == THAW_TASK_CHAT ? slot_start(e, s, t) : thaw_embed_start(e, s, t)) == 0) {
            busy++;
            working++;
            n_restoring += s->restore != NULL;
        }
    }
    free(views);
    return busy;
}

/* ---- the loop ------------------------------------------------------------------ */

static void batch_add(struct llama_batch *b, llama_token tok, llama_pos pos, llama_seq_id seq, bool logits)
{
    int i = b->n_tokens++;

    b->token[i] = tok;
    b->pos[i] = pos;
    b->n_seq_id[i] = 1;
    b->seq_id[i][0] = seq;
    b->logits[i] = logits;
}

/* A hybrid's prefill stops at p, a snapshot position (snapshots.h): the end
 * of the leading system messages, every --checkpoint-every-n-tokens; the
 * recurrent state exists there only between two decodes. */
static bool snapshot_at(const struct thaw_engine *e, const struct thaw_slot *s, int p)
{
    const struct thaw_task *t = s->task;

    /* (in a prompt with images too: a snapshot is stored by its tokens,
     * whose placeholders pin each image's bytes (vision.h); never inside an
     * image) */
    if (!e->recurrent || e->cfg->ctx_checkpoints == 0 || !t || p <= 0 || p >= t->n_prompt ||
        thaw_vision_prompt_back_off(t->vision, p) != p)
        return false;
    return p == t->n_branch || (e->cfg->checkpoint_every > 0 && p % e->cfg->checkpoint_every == 0);
}

/* A hybrid's prefill also stops where its generation prompt starts: the
 * next turn renders the reply as history from there (the assistant's
 * opening without "<think>\n", say), so the canonical form (slotkv.h) can
 * only be re-decoded from a checkpoint at or before it. In RAM only: the
 * turn's stored end supersedes it. */
static bool gen_prompt_at(const struct thaw_engine *e, const struct thaw_slot *s, int p)
{
    const struct thaw_task *t = s->task;

    return e->recurrent && e->cfg->ctx_checkpoints > 0 && t && t->n_gen_prompt > 0 && p > 0 &&
           p == t->n_prompt - t->n_gen_prompt && thaw_vision_prompt_back_off(t->vision, p) == p;
}

/* A context checkpoint of the slot's recurrent state where it stands
 * (snap: stored as a snapshot with the turn, snapshots.h). */
static void keep_state(struct thaw_engine *e, struct thaw_slot *s, bool snap)
{
    int64_t tc = thaw_now_us();

    if (thaw_ckpt_take(&s->ckpts, e->ctx, s->id, s->n_tokens, e->cfg->ctx_checkpoints) != 0)
        LOG_WRN("slot %d: could not take a context checkpoint", s->id);
    else if (snap)
        s->ckpts.v[s->ckpts.n - 1].flags |= THAW_CKPT_SNAPSHOT;
    thaw_metrics_hold(e->metrics, snap ? THAW_HOLD_SNAPSHOT : THAW_HOLD_CHECKPOINT, thaw_now_us() - tc);
}

/* Every prefilling slot whose next prompt position starts an image: the
 * projector encodes it and its embeddings are decoded into the slot's
 * sequence, one image per slot per step (alone: an embeddings batch holds
 * no tokens, and Gemma 3 decodes an image with non-causal attention). */
static void eval_images(struct thaw_engine *e)
{
    for (int i = 0; i < e->n_slots; i++) {
        struct thaw_slot *s = &e->slots[i];
        if (s->phase != THAW_SLOT_PREFILL || s->restore || !s->task || !s->task->vision)
            continue;
        struct thaw_task *t = s->task;
        int img = thaw_vision_prompt_at(t->vision, s->n_prompt_done), pos, n;
        if (img < 0)
            continue;
        thaw_vision_prompt_span(t->vision, img, &pos, &n);
        int64_t t0 = thaw_now_us();
        if (thaw_vision_eval(e->vision, e->ctx, t->vision, img, s->id, e->n_batch) != 0) {
            thaw_engine_slot_fail(e, s, 500, "the image could not be encoded or decoded");
            continue;
        }
        int64_t t1 = thaw_now_us();
        thaw_metrics_hold(e->metrics, THAW_HOLD_IMAGE, t1 - t0);
        memcpy(s->tokens + s->n_tokens, t->prompt + pos, (size_t)n * sizeof(llama_token));
        s->n_tokens += n;
        s->n_prompt_done += n;
        atomic_fetch_add(&e->metrics->prompt_tokens, (uint64_t)n);
        atomic_fetch_add(&e->metrics->prompt_us, (uint64_t)(t1 - t0));
        LOG_DBG("slot %d: image %d of the prompt (%d positions at %d) in %.1f ms", s->id, img + 1, n, pos,
                (double)(t1 - t0) / 1000.0);
        /* a hybrid's state right after an image is a snapshot: where another
         * conversation sending the same image (after the same text) goes on
         * with other words, so its prefix lookup resumes past the image */
        if (e->recurrent && e->cfg->ctx_checkpoints > 0 && s->n_prompt_done < t->n_prompt)
            keep_state(e, s, true);
        if (thaw_task_progress(t, s->n_prompt_done, t1 - s->t_start_us) != 0)
            LOG_WRN("slot %d: out of memory for a progress report", s->id);
    }
}

/* Fills e->batch: first the next token of every generating slot (so
 * generation never waits behind a long prompt), then prompt tokens, then
 * FIXUP tokens (nobody waits for those). */
static void build_batch(struct thaw_engine *e)
{
    struct llama_batch *b = &e->batch;

    b->n_tokens = 0;
    for (int i = 0; i < e->n_slots; i++) {
        struct thaw_slot *s = &e->slots[i];
        s->i_batch = -1;
        s->n_in_batch = 0;
        if (s->phase != THAW_SLOT_GEN)
            continue;
        /* (no drafts over an image's placeholders: they are no vocabulary ids) */
        s->n_drafts = s->drafts && !s->task->vision ? thaw_gen_draft(e, s, e->n_batch - b->n_tokens - 1) : 0;
        if (s->n_drafts > 0 && e->recurrent) { /* what a rejected draft rolls back to (thaw_gen_verify_take) */
            int64_t tc = thaw_now_us();
            if (thaw_ckpt_save(&s->spec_ckpt, e->ctx, s->id, s->n_tokens) != 0) {
                LOG_WRN("slot %d: no checkpoint of its recurrent state: this step goes without its draft", s->id);
                s->n_drafts = 0;
            }
            thaw_metrics_hold(e->metrics, THAW_HOLD_CHECKPOINT, thaw_now_us() - tc);
        }
        s->i_batch = b->n_tokens;
        batch_add(b, s->next_token, s->n_tokens, s->id, true);
        for (int k = 0; k < s->n_drafts; k++)
            batch_add(b, s->drafts[k], s->n_tokens + 1 + k, s->id, true);
        s->n_in_batch = 1 + s->n_drafts;
    }
    /* beside generating streams, a prompt goes one micro-batch a step (scheduler.h) */
    const int room = thaw_sched_batch_room(b->n_tokens, e->n_batch, e->n_ubatch, e->prompt_us_per_tok);
    for (int i = 0; i < e->n_slots && b->n_tokens < room; i++) {
        struct thaw_slot *s = &e->slots[i];
        if (s->phase != THAW_SLOT_PREFILL || s->restore) /* (a restore being assembled: not yet) */
            continue;
        const struct thaw_task *t = s->task;
        while (s->n_prompt_done + s->n_in_batch < t->n_prompt && b->n_tokens < room) {
            int p = s->n_prompt_done + s->n_in_batch;
            if (s->n_in_batch > 0 && (snapshot_at(e, s, p) || gen_prompt_at(e, s, p)))
                break; /* checkpointed after this decode (after_decode) */
            if (thaw_vision_prompt_at(t->vision, p) >= 0)
                break; /* an image: decoded on its own (eval_images) */
            bool last = p == t->n_prompt - 1;
            if (last)
                s->i_batch = b->n_tokens;
            batch_add(b, t->prompt[p], p, s->id, last);
            s->n_in_batch++;
        }
    }
    /* FIXUP: post-reply work nobody waits for, within the scheduler's
     * budget (scheduler.h); a request that needs its slot cuts it short
     * (admit) */
    int count[THAW_SLOT_PHASE_COUNT], fixup_tokens = 0;
    thaw_slot_count(e->slots, e->n_slots, count);
    bool free_now = e->fixup_awaited || count[THAW_SLOT_PREFILL] + count[THAW_SLOT_GEN] == 0;
    int fixup_room = thaw_sched_fixup_room(count[THAW_SLOT_PREFILL], count[THAW_SLOT_GEN], e->fixup_awaited,
                                           e->fixup_us_per_tok, e->n_batch);
    int64_t now = thaw_now_us();
    for (int i = 0; i < e->n_slots && b->n_tokens < room && fixup_room > 0; i++) {
        struct thaw_slot *s = &e->slots[i];
        if (s->phase != THAW_SLOT_FIXUP || fixup_held(e, s) || !thaw_sched_fixup_due(free_now, now - s->fix_since_us))
            continue;
        while (s->n_tokens + s->n_in_batch < s->n_fix && b->n_tokens < room && fixup_room-- > 0) {
            int p = s->n_tokens + s->n_in_batch;
            batch_add(b, s->fix[p], p, s->id, false);
            s->n_in_batch++;
            fixup_tokens++;
        }
    }
    e->batch_fixup_only = fixup_tokens > 0 && fixup_tokens == b->n_tokens;
}

/* No slot prefilling or generating (but `except`, NULL: none): work on
 * the engine thread slows nobody. */
static bool engine_alone(const struct thaw_engine *e, const struct thaw_slot *except)
{
    for (int i = 0; i < e->n_slots; i++)
        if (&e->slots[i] != except && (e->slots[i].phase == THAW_SLOT_PREFILL || e->slots[i].phase == THAW_SLOT_GEN))
            return false;
    return true;
}

/* Stores a FIXUP slot's state (slotkv.h), counting how long after the
 * reply's end its first store went (the re-decode and the wait for the
 * engine, or none when stored early). */
static void store_reply(struct thaw_engine *e, struct thaw_slot *s)
{
    if (!thaw_slotkv_will_store(e->skv, s->n_tokens))
        return; /* too short to store (--kv-cache-min-tokens) */
    if (!s->stored_early || s->n_tokens < s->n_fix) { /* the reply's first store */
        atomic_fetch_add(&e->metrics->reply_stores, 1);
        atomic_fetch_add(&e->metrics->reply_store_wait_us, (uint64_t)(thaw_now_us() - s->fix_since_us));
    }
    thaw_slotkv_store(e->skv, s);
}

/* A store costs only the tokens not stored yet: the tap cut their rows as
 * they were written (kvtap.h). Otherwise a store is a capture of the whole
 * sequence, whose cost grows with the conversation. */
static bool store_is_cheap(const struct thaw_engine *e)
{
    return e->tap && thaw_kvtap_ready(e->tap);
}

/* FIXUP slots whose canonical tokens are all in: store, and free the slot.
 * A capture waits, as the re-decoding does, for a moment when no other
 * slot decodes (or THAW_FIXUP_DEFER_US, or `force` at shutdown): its cost
 * grows with the conversation (libllama captures a sequence only whole).
 * A store from the tap goes at once: the reply is durable as soon as the
 * writer commits it, at the cost of a few new tokens' rows. */
static void finish_fixups(struct thaw_engine *e, bool force)
{
    bool free_now = force || e->fixup_awaited || engine_alone(e, NULL) || store_is_cheap(e);
    int64_t now = thaw_now_us();

    for (int i = 0; i < e->n_slots; i++) {
        struct thaw_slot *s = &e->slots[i];
        if (s->phase != THAW_SLOT_FIXUP || s->n_tokens < s->n_fix ||
            !thaw_sched_fixup_due(free_now, now - s->fix_since_us))
            continue;
        store_reply(e, s);
        thaw_engine_slot_idle(e, s);
    }
}

/* A re-decoding expected to take longer than this (its tokens x the
 * measured cost of one) is not waited for: the reply is stored first. */
#define THAW_EARLY_STORE_US 20000.0

/* FIXUP slots whose re-decoding will not be done soon (another slot
 * prefills or generates, a request is queued, or the re-decode itself is
 * long or of unknown cost) store what they hold now, once: a prefix of
 * the conversation as the next turn presents it (the reply's tokens up to
 * where the canonical form parts from them), so a reply is on disk within
 * the writer's commit, not when the engine gets to it, and a crash or
 * restart in between costs the next turn only the few tokens past that
 * point. The store after the re-decoding supersedes it under the same key
 * (its full blocks are the same ones: not written twice; the manifest and
 * its tail are). Only where a store is cheap (the tap); not on recurrent
 * memory, whose turn-end snapshot is a whole state and kept for later
 * anyway. */
static void store_early(struct thaw_engine *e)
{
    if (!store_is_cheap(e) || e->recurrent || !thaw_kvcache_enabled(e->kv))
        return;
    bool soon = (e->fixup_awaited || engine_alone(e, NULL)) && thaw_sched_depth(e->sched) == 0;
    for (int i = 0; i < e->n_slots; i++) {
        struct thaw_slot *s = &e->slots[i];
        if (s->phase != THAW_SLOT_FIXUP || s->stored_early || s->n_tokens >= s->n_fix || fixup_held(e, s) ||
            !thaw_slotkv_will_store(e->skv, s->n_tokens))
            continue;
        if (soon && e->fixup_us_per_tok > 0 && (s->n_fix - s->n_tokens) * e->fixup_us_per_tok <= THAW_EARLY_STORE_US)
            continue;
        s->stored_early = true;
        atomic_fetch_add(&e->metrics->stores_early, 1);
        store_reply(e, s);
    }
}

/* After a successful decode: record what each slot's KV now holds, sample. */
static void after_decode(struct thaw_engine *e, int64_t t0, int64_t t1)
{
    int n_prompt_tokens = 0, n_gen_tokens = 0;
    uint64_t n_tokens_max = atomic_load(&e->metrics->n_tokens_max);

    for (int i = 0; i < e->n_slots; i++) {
        struct thaw_slot *s = &e->slots[i];
        if (s->n_in_batch == 0)
            continue;
        if (s->phase == THAW_SLOT_GEN) {
            n_gen_tokens += s->n_in_batch;
            if (s->n_drafts == 0)
                s->tokens[s->n_tokens++] = s->next_token;
            /* else: thaw_gen_verify decides how many of the batch's tokens stay */
        } else if (s->phase == THAW_SLOT_FIXUP) {
            memcpy(s->tokens + s->n_tokens, s->fix + s->n_tokens, (size_t)s->n_in_batch * sizeof(llama_token));
            s->n_tokens += s->n_in_batch;
        } else {
            memcpy(s->tokens + s->n_tokens, s->task->prompt + s->n_prompt_done,
                   (size_t)s->n_in_batch * sizeof(llama_token));
            s->n_tokens += s->n_in_batch;
            s->n_prompt_done += s->n_in_batch;
            n_prompt_tokens += s->n_in_batch;
            if (thaw_task_progress(s->task, s->n_prompt_done, t1 - s->t_start_us) != 0)
                LOG_WRN("slot %d: out of memory for a progress report", s->id);
        }
        if ((uint64_t)s->n_tokens > n_tokens_max)
            n_tokens_max = (uint64_t)s->n_tokens;
    }
    atomic_store(&e->metrics->n_tokens_max, n_tokens_max); /* this thread is its only writer */
    atomic_fetch_add(&e->metrics->prompt_tokens, (uint64_t)n_prompt_tokens);
    if (n_prompt_tokens > 0)
        atomic_fetch_add(&e->metrics->prompt_us, (uint64_t)(t1 - t0));
    /* what a prompt piece beside streams costs (build_batch sizes them) */
    e->prompt_us_per_tok =
        thaw_sched_prompt_cost(e->prompt_us_per_tok, t1 - t0, e->batch.n_tokens, n_prompt_tokens, n_gen_tokens);
    if (e->batch_fixup_only)
        e->fixup_us_per_tok = thaw_sched_fixup_cost(e->fixup_us_per_tok, t1 - t0, e->batch.n_tokens);
    finish_fixups(e, false);

    for (int i = 0; i < e->n_slots; i++) {
        struct thaw_slot *s = &e->slots[i];
        /* a prefill that stopped at a snapshot position or before the
         * generation prompt: keep the state there */
        if (s->phase != THAW_SLOT_PREFILL || s->n_in_batch == 0 || s->i_batch >= 0)
            continue;
        bool snap = snapshot_at(e, s, s->n_tokens);
        if (snap || gen_prompt_at(e, s, s->n_tokens))
            keep_state(e, s, snap);
    }
    for (int i = 0; i < e->n_slots; i++) {
        struct thaw_slot *s = &e->slots[i];
        if (!s->task || s->i_batch < 0)
            continue;
        if (s->phase == THAW_SLOT_PREFILL) {
            s->t_prompt_done_us = thaw_now_us();
            if (thaw_slot_reserve(s, s->n_tokens + s->task->max_tokens + 1) != 0) {
                thaw_engine_slot_fail(e, s, 500, "out of memory");
                continue;
            }
            /* the prompt's end is where the next turn will most likely need
             * to roll back to on SWA / recurrent memory: keep a checkpoint */
            if (e->partial && e->cfg->ctx_checkpoints > 0) {
                int64_t tc = thaw_now_us();
                if (thaw_ckpt_take(&s->ckpts, e->ctx, s->id, s->n_tokens, e->cfg->ctx_checkpoints) != 0)
                    LOG_WRN("slot %d: could not take a context checkpoint", s->id);
                thaw_metrics_hold(e->metrics, THAW_HOLD_CHECKPOINT, thaw_now_us() - tc);
            }
        }
        if (s->phase == THAW_SLOT_GEN && s->n_drafts > 0) {
            if (!e->recurrent)
                thaw_gen_verify(e, s);
            else if (thaw_gen_verify_sample(e, s) == 0)
                s->n_in_batch = -1; /* taken below, once every slot's rows are sampled */
            continue;
        }
        llama_token tok;
        struct thaw_token_probs probs;
        if (thaw_gen_sample(e, s, s->i_batch, &tok, &probs) != 0)
            continue;
        thaw_gen_take_token(e, s, tok, &probs);
    }
    /* a recurrent target's verdicts: their rollback decodes again */
    for (int i = 0; i < e->n_slots; i++)
        if (e->slots[i].n_in_batch == -1 && e->slots[i].phase == THAW_SLOT_GEN) {
            e->slots[i].n_in_batch = 0;
            thaw_gen_verify_take(e, &e->slots[i]);
        }
    store_early(e); /* the replies that just finished */
}

static void fail_batch(struct thaw_engine *e, int rc)
{
    char msg[96];

    snprintf(msg, sizeof msg, "llama_decode failed (%d)", rc);
    LOG_ERR("%s: failing the requests in this batch", msg);
    for (int i = 0; i < e->n_slots; i++) {
        struct thaw_slot *s = &e->slots[i];
        if (s->n_in_batch > 0)
            thaw_engine_slot_fail(e, s, 500, msg);
    }
}

/* At shutdown: every FIXUP slot's re-decoding is finished and stored (the
 * replies are out; these states are what the next turns want from disk).
 * Nobody waits for a decode any more, so in full batches; bounded: what is
 * not done after shutdown_fixup_us() is stored as far as it got, as when
 * a request cuts the work short. */
static void drain_fixups(struct thaw_engine *e)
{
    int64_t deadline = thaw_now_us() + shutdown_fixup_us(e);

    e->fixup_awaited = true;
    while (thaw_now_us() < deadline) {
        build_batch(e);
        if (e->batch.n_tokens == 0)
            break;
        if (llama_decode(e->ctx, e->batch) != 0) {
            fail_batch(e, -1);
            break;
        }
        after_decode(e, 0, 0);
    }
    finish_fixups(e, true);
    for (int i = 0; i < e->n_slots; i++)
        if (e->slots[i].phase == THAW_SLOT_FIXUP)
            slot_cut_fixup(e, &e->slots[i], NULL);
}

static void *engine_main(void *arg)
{
    struct thaw_engine *e = arg;

    while (!atomic_load(&e->stop)) {
        /* restores assembled meanwhile go in; cancelled requests (client
         * gone) free their slot (one still restoring, once it is in) */
        for (int i = 0; i < e->n_slots; i++) {
            struct thaw_slot *s = &e->slots[i];
            if (thaw_slotkv_restore_ready(s))
                slot_resume(e, s);
            if (s->task && !s->restore && !thaw_task_client_alive(s->task)) {
                LOG_INF("slot %d: client went away, request cancelled", s->id);
                thaw_task_fail(s->task, 499, "cancelled");
                thaw_engine_slot_idle(e, s);
            }
        }
        if (admit(e, true) == 0)
            continue;
        store_early(e); /* before a prompt just admitted makes a re-decode wait */
        if (e->vision)
            eval_images(e);
        if (e->embedding)
            thaw_embed_build_batch(e);
        else
            build_batch(e);
        if (e->batch.n_tokens == 0) {
            finish_fixups(e, true); /* nothing decodes */
            if (restoring(e) && !restore_ready(e)) /* until one is assembled (its kick), not in a spin */
                thaw_sched_wait_kick(e->sched, 100000);
            continue;
        }
        int64_t t0 = thaw_now_us();
        int rc = llama_decode(e->ctx, e->batch);
        int64_t t1 = thaw_now_us();
        thaw_metrics_hold(e->metrics, e->batch_fixup_only ? THAW_HOLD_FIXUP : THAW_HOLD_DECODE, t1 - t0);
        atomic_fetch_add(&e->metrics->decode_calls, 1);
        atomic_fetch_add(&e->metrics->busy_slot_decodes, (uint64_t)atomic_load(&e->metrics->requests_processing));
        if (rc != 0) {
            fail_batch(e, rc);
            continue;
        }
        if (e->embedding)
            thaw_embed_after_decode(e, t0, t1);
        else
            after_decode(e, t0, t1);
    }
    for (int i = 0; i < e->n_slots; i++) {
        struct thaw_slot *s = &e->slots[i];
        if (s->restore) /* its assembly is waited for, its hit ended */
            slot_resume(e, s);
        if (s->task) {
            thaw_task_fail(s->task, 503, "the server is shutting down");
            thaw_engine_slot_idle(e, s);
        }
    }
    drain_fixups(e);
    return NULL;
}

/* A deferred restore is assembled (on the restore thread): wake the
 * engine if it waits for work. */
static void restored(void *ud)
{
    struct thaw_engine *e = ud;

    thaw_sched_kick(e->sched);
}

/* A task that waited for the shared tier's fetch: on to the queue now
 * (from the fetch thread). */
struct fetch_wait {
    struct thaw_engine *e;
    struct thaw_task *t;
};

static void shared_fetched(void *ud)
{
    struct fetch_wait *w = ud;
    int rc = thaw_sched_push(w->e->sched, w->t);

    if (rc == 0)
        atomic_store(&w->e->metrics->queue_depth, thaw_sched_depth(w->e->sched));
    else
        thaw_task_fail(w->t, 503,
                       rc == THAW_ESHUTDOWN ? "the server is shutting down"
                                            : "the server is busy: every slot is working and the queue is full; retry later");
    thaw_task_release(w->t);
    free(w);
}

int thaw_engine_submit(struct thaw_engine *e, struct thaw_task *t)
{
    uint8_t key[THAW_KEY_BYTES];
    bool has_key = t->has_lookup_key;
    int rc;

    if (t->kind != THAW_TASK_CHAT) {
        /* decoded whole in one micro-batch, nothing generated after it
         * (embed.c); the route says which limit a prompt is over */
        if (t->n_prompt < 1 || t->n_prompt > e->n_ctx_slot || t->n_prompt > e->n_ubatch || !e->embedding)
            return THAW_ECTXFULL;
        rc = thaw_sched_push(e->sched, t);
        if (rc == 0)
            atomic_store(&e->metrics->queue_depth, thaw_sched_depth(e->sched));
        return rc;
    }
    if (t->n_prompt < 1 || t->n_prompt >= e->n_ctx_slot)
        return THAW_ECTXFULL;
    /* never more than the slot can hold after the prompt: every size the
     * engine derives from max_tokens stays within the slot's context */
    if (t->max_tokens <= 0 || t->max_tokens > e->n_ctx_slot - t->n_prompt)
        t->max_tokens = e->n_ctx_slot - t->n_prompt;
    if (has_key)
        memcpy(key, t->lookup_key, THAW_KEY_BYTES);
    /* What the local tiers lack may be in the shared tier: the task waits
     * for that fetch on a fetch thread (never this one, never the engine's),
     * which queues it afterwards. */
    if (t->req.cache_prompt && thaw_kvcache_enabled(e->kv) && !atomic_load(&e->stop)) {
        struct fetch_wait *w = malloc(sizeof *w);
        if (w) {
            *w = (struct fetch_wait){e, t};
            thaw_task_retain(t);
            if (thaw_kvcache_fetch_shared(e->kv, has_key ? key : NULL, t->ns, t->prompt, t->n_prompt, shared_fetched,
                                          w) == 0)
                return 0;
            thaw_task_release(t);
            free(w);
        }
    }
    rc = thaw_sched_push(e->sched, t);
    if (rc == 0)
        atomic_store(&e->metrics->queue_depth, thaw_sched_depth(e->sched));
    /* Start the disk reads now: while the task waits for a slot (or the
     * engine finishes a step), the kernel brings the entry into memory.
     * Harmless when a slot or the RAM tier serves it instead. */
    if (rc == 0 && has_key)
        thaw_kvcache_prefetch(e->kv, key);
    return rc;
}

/* Whether the slots draft: n-gram kinds or a draft model (an embedding
 * server generates nothing to draft). */
static bool speculative(const struct thaw_config *cfg)
{
    return !cfg->embedding && ((cfg->draft_path && cfg->draft_max > 0) || thaw_ngram_enabled(cfg));
}

static void log_speculation(const struct thaw_config *cfg, bool draft)
{
    char kinds[160] = "";
    static const char *const names[THAW_SPEC_N_NGRAM] = {"ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod"};

    for (int k = 0; k < THAW_SPEC_N_NGRAM; k++) {
        const struct thaw_spec_ngram *p = &cfg->spec_ngram[k];
        size_t l = strlen(kinds);
        if (cfg->spec_types & (1u << k))
            snprintf(kinds + l, sizeof kinds - l, "%s%s (n %d, m %d)", l ? ", " : "", names[k], p->size_n, p->size_m);
    }
    if (kinds[0])
        LOG_INF("speculative decoding: n-gram drafts from each slot's conversation: %s%s", kinds,
                draft ? "; then the draft model" : "");
}

/* ---- lifecycle ------------------------------------------------------------------ */

/* What --embedding serves, logged at start: the pooling, the vectors'
 * width, and that no KV cache is kept for them. */
static void log_embedding(const struct thaw_engine *e)
{
    static const char *const names[] = {"none", "mean", "cls", "last", "rank"};
    const char *pooling = e->pooling >= 0 && e->pooling <= 4 ? names[e->pooling] : "?";

    if (e->pooling == LLAMA_POOLING_TYPE_RANK)
        LOG_INF("embeddings: pooling rank (the rank head's %d outputs; /rerank serves its scores)", e->n_cls_out);
    else
        LOG_INF("embeddings: pooling %s, %d floats per vector, --embd-normalize %d%s", pooling, e->n_embd_out,
                e->cfg->embd_normalize, e->pooling == LLAMA_POOLING_TYPE_NONE ? " (pooling none: not normalised)" : "");
    LOG_INF("embeddings: the KV cache is not used for embeddings: each prompt is computed afresh in one "
            "micro-batch (-ub %d tokens at most), nothing is stored or restored; chat routes answer 501",
            e->n_ubatch < e->n_batch ? e->n_ubatch : e->n_batch);
    if (e->cfg->kv_cache_dir || e->cfg->kv_shared)
        LOG_WRN("--kv-cache-dir / --kv-shared: no effect with --embedding (nothing is stored)");
    if (e->cfg->reranking && e->n_cls_out < 1)
        LOG_WRN("--rerank: the model has no rank head outputs: scores will be meaningless");
}

int thaw_engine_new(const struct thaw_config *cfg, struct thaw_metrics *metrics, struct thaw_disk_cache *kv_store,
                    const struct thaw_load_progress *progress, struct thaw_engine **out)
{
    struct thaw_engine *e = calloc(1, sizeof *e);
    int rc = 0;
    int64_t t0 = thaw_now_us();

    if (!e)
        return THAW_ENOMEM;
    e->cfg = cfg;
    e->metrics = metrics;
    pthread_mutex_init(&e->props_mu, NULL);
    e->reasoning_budget = cfg->reasoning_budget;
    if (cfg->reasoning_budget_message && *cfg->reasoning_budget_message &&
        !(e->reasoning_budget_message = strdup(cfg->reasoning_budget_message))) {
        rc = THAW_ENOMEM;
        goto error;
    }

    if ((rc = thaw_fingerprint_file(cfg->model_path, e->fingerprint)) != 0) {
        LOG_ERR("cannot read model %s: %s", cfg->model_path, thaw_strerror(rc));
        goto error;
    }
    struct llama_context_params cp;
    /* --embedding keeps no KV cache: no tap to cut it */
    if ((rc = thaw_params_open(cfg, cfg->kv_cache_dir && cfg->kv_tap && !cfg->embedding, progress, &e->model, &e->ctx,
                               &e->tap, &e->threads, &cp)) != 0)
        goto error;
    if ((rc = thaw_placement_init(&e->placement, e->model, e->ctx)) != 0)
        goto error;
    thaw_placement_log(&e->placement);
    e->tap_verify = e->tap && thaw_test_hook(THAW_HOOK_KVTAP_VERIFY) != 0;
    e->vocab = llama_model_get_vocab(e->model);
    e->max_token_bytes = thaw_tokens_max_bytes(e->vocab); /* admission's bound (thaw_api_admit) */
    e->n_ctx_slot = (int)llama_n_ctx_seq(e->ctx);
    e->n_batch = (int)llama_n_batch(e->ctx);
    e->n_ubatch = (int)llama_n_ubatch(e->ctx);
    e->embedding = cfg->embedding;
    e->pooling = cfg->embedding ? (int)llama_pooling_type(e->ctx) : -1;
    e->n_embd_out = llama_model_n_embd_out(e->model);
    e->n_cls_out = (int)llama_model_n_cls_out(e->model);
    e->n_swa = cfg->swa_full ? 0 : llama_model_n_swa(e->model);
    e->recurrent = llama_model_is_recurrent(e->model) || llama_model_is_hybrid(e->model);
    e->partial = e->n_swa > 0 || e->recurrent;
    if (e->partial && cfg->ctx_checkpoints == 0)
        LOG_WRN("%s model with --ctx-checkpoints 0: a returning conversation can only reuse its prefix when it "
                "matches exactly", e->recurrent ? "recurrent" : "sliding-window");
    /* Not the context size nor the slot count: a stored state restores
     * into any slot with room for its cells (blocks take the restoring
     * slot's frame; a whole state that does not fit fails to load and is
     * served by prefill), so changing -c or -np keeps the cache. */
    struct thaw_chat_params chp = {cfg->chat_template, cfg->jinja, cfg->chat_template_kwargs, cfg->reasoning_format};
    if ((rc = thaw_chat_new(e->model, &chp, &e->chat)) != 0)
        goto error;
    if (cfg->mmproj_path) {
        char verr[512] = "";
        int64_t tv = thaw_now_us();
        struct thaw_vision_params vp = {cfg->mmproj_path, cfg->mmproj_offload, cfg->n_threads_batch,
                                        cfg->image_min_tokens, cfg->image_max_tokens,
                                        cp.flash_attn_type != LLAMA_FLASH_ATTN_TYPE_DISABLED, {0}};
        /* what makes an image's KV: the projector's bytes and how many
         * tokens it makes of an image (vision.h's placeholders) */
        uint8_t fp[THAW_KEY_BYTES];
        char settings[64];
        if ((rc = thaw_fingerprint_file(cfg->mmproj_path, fp)) != 0) {
            LOG_ERR("--mmproj: cannot read %s: %s", cfg->mmproj_path, thaw_strerror(rc));
            goto error;
        }
        snprintf(settings, sizeof settings, "thaw.vision.v1 min %d max %d", cfg->image_min_tokens,
                 cfg->image_max_tokens);
        crypto_generichash_state hs;
        crypto_generichash_init(&hs, NULL, 0, sizeof vp.identity);
        crypto_generichash_update(&hs, fp, sizeof fp);
        crypto_generichash_update(&hs, (const unsigned char *)settings, strlen(settings));
        crypto_generichash_final(&hs, vp.identity, sizeof vp.identity);
        if (progress && progress->fn)
            progress->fn(progress->ud, "mmproj_model", 0.0f);
        if ((rc = thaw_vision_new(e->model, &vp, &e->vision, verr, sizeof verr)) != 0) {
            LOG_ERR("--mmproj: %s", rc == THAW_EINVAL ? verr : thaw_strerror(rc));
            goto error;
        }
        if (progress && progress->fn)
            progress->fn(progress->ud, "mmproj_model", 1.0f);
        LOG_INF("projector %s loaded in %.0f ms: requests may carry images", cfg->mmproj_path,
                (double)(thaw_now_us() - tv) / 1000.0);
    }
    const struct thaw_keys_settings ks = {cp.swa_full, (int)cp.type_k, (int)cp.type_v, thaw_chat_template(e->chat),
                                          cfg->jinja, cfg->chat_template_kwargs};
    thaw_keys_settings(&ks, e->settings, sizeof e->settings);

    if (cfg->alias) {
        e->model_name = strdup(cfg->alias);
    } else {
        const char *slash = strrchr(cfg->model_path, '/');
        e->model_name = strdup(slash ? slash + 1 : cfg->model_path);
    }
    e->n_slots = cfg->n_parallel;
    e->slots = calloc((size_t)e->n_slots, sizeof *e->slots);
    e->batch = llama_batch_init(e->n_batch, 0, 1);
    if (!e->model_name || !e->slots || !e->batch.token) {
        rc = THAW_ENOMEM;
        goto error;
    }
    if (!(e->view = thaw_slots_view_new(e->n_slots, e->n_ctx_slot, speculative(cfg)))) {
        rc = THAW_ENOMEM;
        goto error;
    }
    for (int i = 0; i < e->n_slots; i++) {
        thaw_slot_init(&e->slots[i], i);
        e->slots[i].view = e->view;
    }
    metrics->slots_total = e->n_slots;
    metrics->ram_budget_bytes = cfg->cache_ram_mib << 20;
    metrics->disk_budget_bytes = cfg->kv_cache_dir ? cfg->kv_cache_max_mib << 20 : 0;
    if ((rc = thaw_sched_new(cfg->max_queue, &e->sched)) != 0)
        goto error;
    thaw_keys_binding(e->fingerprint, e->settings, NULL, e->identity);
    bool use_draft = cfg->draft_path && cfg->draft_max > 0;
    if (speculative(cfg)) {
        /* a recurrent target rolls a rejected draft back through a
         * checkpoint of its state taken before each verify (generate.c) */
        if (e->recurrent && !(e->spec_batch = llama_batch_init(THAW_NGRAM_MAX + 2, 0, 1)).token) {
            rc = THAW_ENOMEM;
            goto error;
        }
        if (use_draft && (rc = thaw_draft_new(cfg, e->model, e->n_slots, &e->draft)) != 0)
            goto error;
        int n_max = thaw_ngram_max_draft(cfg); /* the n-gram kinds are tried first, then the draft */
        if (use_draft && cfg->draft_max > n_max)
            n_max = cfg->draft_max;
        for (int i = 0; i < e->n_slots; i++) {
            struct thaw_slot *s = &e->slots[i];
            if (!(s->drafts = malloc((size_t)(n_max + 1) * sizeof(llama_token)))) {
                rc = THAW_ENOMEM;
                goto error;
            }
            if ((rc = thaw_ngram_new(cfg, e->n_ctx_slot, &s->ngram)) != 0)
                goto error;
        }
        log_speculation(cfg, e->draft != NULL);
    }
    struct thaw_slotkv_params skp = {
        .restored = restored,
        .restored_ud = e,
        .cfg = cfg,
        .ctx = e->ctx,
        .tap = e->tap,
        .tap_verify = e->tap_verify,
        .draft = e->draft,
        .n_swa = e->n_swa,
        .recurrent = e->recurrent,
        .metrics = metrics,
        .disk_store = kv_store,
    };
    memcpy(skp.identity, e->identity, THAW_KEY_BYTES);
    if ((rc = thaw_slotkv_new(&skp, &e->skv)) != 0)
        goto error;
    e->kv = thaw_slotkv_cache(e->skv);

    char desc[128];
    llama_model_desc(e->model, desc, sizeof desc);
    LOG_INF("model %s: %s, %.1fM params, %d slots x %d tokens%s, loaded in %.0f ms", e->model_name, desc,
            (double)llama_model_n_params(e->model) / 1e6, e->n_slots, e->n_ctx_slot,
            e->n_swa ? " (sliding window)" : "", (double)(thaw_now_us() - t0) / 1000.0);

    if (e->embedding)
        log_embedding(e);

    atomic_init(&e->stop, false);
    if ((rc = -pthread_create(&e->thread, NULL, engine_main, e)) != 0)
        goto error;
    *out = e;
    return 0;

error:
    if (e->slots)
        for (int i = 0; i < e->n_slots; i++)
            thaw_slot_free(&e->slots[i]);
    thaw_slotkv_free(e->skv); /* and the cache tiers */
    thaw_draft_free(e->draft);
    thaw_sched_free(e->sched);
    if (e->batch.token)
        llama_batch_free(e->batch);
    if (e->spec_batch.token)
        llama_batch_free(e->spec_batch);
    free(e->slots);
    thaw_slots_view_free(e->view);
    free(e->model_name);
    thaw_chat_free(e->chat);
    thaw_vision_free(e->vision);
    if (e->ctx)
        llama_free(e->ctx);
    thaw_threads_free(e->threads);
    thaw_kvtap_free(e->tap); /* after the context that calls it */
    if (e->model)
        llama_model_free(e->model);
    thaw_placement_free(&e->placement);
    free(e);
    return rc;
}

void thaw_engine_stop(struct thaw_engine *e)
{
    struct thaw_task *t;

    if (atomic_exchange(&e->stop, true))
        return;
    thaw_sched_close(e->sched);
    pthread_join(e->thread, NULL);
    thaw_kvcache_stop_fetches(e->kv); /* their tasks fail against the closed queue */
    while ((t = thaw_sched_pop(e->sched, false)) != NULL) {
        thaw_task_fail(t, 503, "the server is shutting down");
        thaw_task_release(t);
    }
}

void thaw_engine_free(struct thaw_engine *e)
{
    if (!e)
        return;
    thaw_engine_stop(e);
    thaw_sched_free(e->sched);
    thaw_slotkv_free(e->skv); /* closes the tiers: writes what is still queued */
    for (int i = 0; i < e->n_slots; i++)
        thaw_slot_free(&e->slots[i]);
    thaw_draft_free(e->draft);
    free(e->slots);
    thaw_slots_view_free(e->view);
    llama_batch_free(e->batch);
    if (e->spec_batch.token)
        llama_batch_free(e->spec_batch);
    thaw_chat_free(e->chat);
    thaw_vision_free(e->vision);
    free(e->model_name);
    llama_free(e->ctx);
    thaw_threads_free(e->threads);
    thaw_kvtap_free(e->tap);
    llama_model_free(e->model);
    thaw_placement_free(&e->placement);
    free(e->reasoning_budget_message);
    pthread_mutex_destroy(&e->props_mu);
    free(e);
}

const struct thaw_chat *thaw_engine_chat(const struct thaw_engine *e) { return e->chat; }

int thaw_engine_biases(const struct thaw_engine *e, const struct thaw_chat_request *req, int32_t **tok,
                       float **val)
{
    return thaw_sampler_biases(e->vocab, &e->cfg->sampling, req, tok, val);
}

int thaw_engine_reasoning_get(struct thaw_engine *e, int *budget, char **message)
{
    int rc = 0;

    pthread_mutex_lock(&e->props_mu);
    *budget = e->reasoning_budget;
    *message = NULL;
    if (e->reasoning_budget_message && !(*message = strdup(e->reasoning_budget_message)))
        rc = THAW_ENOMEM;
    pthread_mutex_unlock(&e->props_mu);
    return rc;
}

int thaw_engine_reasoning_set(struct thaw_engine *e, int budget, const char *message)
{
    char *m = message && *message ? strdup(message) : NULL;

    if (message && *message && !m)
        return THAW_ENOMEM;
    pthread_mutex_lock(&e->props_mu);
    e->reasoning_budget = budget;
    if (message) {
        free(e->reasoning_budget_message);
        e->reasoning_budget_message = m;
    }
    pthread_mutex_unlock(&e->props_mu);
    return 0;
}

struct thaw_slots_view *thaw_engine_slots_view(const struct thaw_engine *e) { return e->view; }
const char *thaw_engine_model_name(const struct thaw_engine *e) { return e->model_name; }
int thaw_engine_n_ctx_slot(const struct thaw_engine *e) { return e->n_ctx_slot; }
int thaw_engine_max_token_bytes(const struct thaw_engine *e) { return e->max_token_bytes; }
int thaw_engine_n_ctx_train(const struct thaw_engine *e) { return llama_model_n_ctx_train(e->model); }
int thaw_engine_pooling(const struct thaw_engine *e) { return e->pooling; }
int thaw_engine_max_embed_tokens(const struct thaw_engine *e)
{
    return e->n_ubatch < e->n_batch ? e->n_ubatch : e->n_batch;
}
bool thaw_engine_recurrent(const struct thaw_engine *e)
{
    return e->recurrent;
}
uint64_t thaw_engine_n_params(const struct thaw_engine *e) { return llama_model_n_params(e->model); }
const struct thaw_placement *thaw_engine_placement(const struct thaw_engine *e) { return &e->placement; }
void thaw_engine_model_meta(const struct thaw_engine *e, struct thaw_model_meta *m)
{
    *m = (struct thaw_model_meta){llama_model_n_params(e->model), llama_model_size(e->model),
                                  llama_vocab_n_tokens(e->vocab), (int)llama_vocab_type(e->vocab),
                                  llama_model_n_ctx_train(e->model), llama_model_n_embd(e->model), e->n_ctx_slot,
                                  e->vision != NULL};
}

void thaw_engine_binding(const struct thaw_engine *e, const uint8_t namespace_id[THAW_KEY_BYTES],
                         uint8_t out[THAW_KEY_BYTES])
{
    thaw_keys_binding(e->fingerprint, e->settings, namespace_id, out);
}

void thaw_engine_metrics(void *ud, char *buf, size_t cap, size_t *len)
{
    struct thaw_engine *e = ud;

    thaw_kvcache_metrics(e->kv, buf, cap, len);
}

/* slot.c — a slot's phases, the one function that moves between them and
 * what each move does (slot.h has the table), what the slot's KV holds, and
 * its reply's text on the way out. */
#include "engine/slot.h"

#include "engine/ngram.h"
#include "engine/slots_view.h"

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/utf8.h"
#include "llama/tokens.h"

#include <stdlib.h>
#include <string.h>

/* legal[from][to], the table of slot.h */
static const bool legal[THAW_SLOT_PHASE_COUNT][THAW_SLOT_PHASE_COUNT] = {
    [THAW_SLOT_IDLE] = {[THAW_SLOT_PREFILL] = true},
    [THAW_SLOT_PREFILL] = {[THAW_SLOT_IDLE] = true, [THAW_SLOT_GEN] = true, [THAW_SLOT_FIXUP] = true},
    [THAW_SLOT_GEN] = {[THAW_SLOT_IDLE] = true, [THAW_SLOT_FIXUP] = true},
    [THAW_SLOT_FIXUP] = {[THAW_SLOT_IDLE] = true},
};

void thaw_slot_init(struct thaw_slot *s, int id)
{
    memset(s, 0, sizeof *s);
    s->id = id;
    s->phase = THAW_SLOT_IDLE;
    s->i_batch = -1;
    s->spec_base = -1;
}

void thaw_slot_free(struct thaw_slot *s)
{
    free(s->tokens);
    thaw_buf_free(&s->gen);
    free(s->fix);
    free(s->drafts);
    thaw_ngram_free(s->ngram);
    s->ngram = NULL;
    thaw_ckpt_clear(&s->ckpts);
    free(s->spec_ckpt.data);
    free(s->spec_probs);
    memset(&s->spec_ckpt, 0, sizeof s->spec_ckpt);
    s->spec_probs = NULL;
    s->tokens = s->fix = s->drafts = NULL;
    s->n_tokens = s->cap_tokens = s->n_fix = 0;
}

bool thaw_slot_move_legal(enum thaw_slot_phase from, enum thaw_slot_phase to)
{
    if ((unsigned)from >= THAW_SLOT_PHASE_COUNT || (unsigned)to >= THAW_SLOT_PHASE_COUNT)
        return false;
    return legal[from][to];
}

const char *thaw_slot_phase_name(enum thaw_slot_phase p)
{
    static const char *const names[THAW_SLOT_PHASE_COUNT] = {"idle", "prefill", "gen", "fixup"};

    return (unsigned)p < THAW_SLOT_PHASE_COUNT ? names[p] : "?";
}

/* IDLE -> PREFILL: the slot takes the task and starts its request afresh. */
static void enter_prefill(struct thaw_slot *s, const struct thaw_slot_enter *in)
{
    const struct thaw_task *t = in->task;

    s->task = in->task;
    s->smpl = in->smpl;
    memset(&s->timings, 0, sizeof s->timings);
    s->timings.cache_source = "none";
    /* a new reply: the memory is kept, an earlier failed allocation forgotten */
    if (s->gen.data)
        thaw_buf_truncate(&s->gen, 0);
    s->gen.len = 0;
    s->gen.oom = false;
    s->n_sent = 0;
    s->n_decoded = 0;
    s->i_batch = -1;
    s->stop_hold = 0; /* the longest stop string - 1: held back while streaming */
    s->stop_word = NULL;
    thaw_ngram_begin(s->ngram); /* what the last request's verdicts taught is not this one's */
    for (int i = 0; i < t->req.n_stop + t->gen.n_stops; i++) {
        size_t l = strlen(i < t->req.n_stop ? t->req.stop[i] : t->gen.stops[i - t->req.n_stop]);
        if (l > 0 && l - 1 > s->stop_hold)
            s->stop_hold = l - 1;
    }
    s->t_start_us = thaw_now_us();
    /* this turn's store supersedes the entry it was looked up under */
    s->has_prev_key = t->has_lookup_key;
    if (t->has_lookup_key)
        memcpy(s->prev_key, t->lookup_key, THAW_KEY_BYTES);
}

/* PREFILL or GEN -> IDLE or FIXUP: the request is over; the KV stays. */
static void release_task(struct thaw_slot *s)
{
    if (s->smpl) {
        llama_sampler_free(s->smpl);
        s->smpl = NULL;
    }
    thaw_task_release(s->task);
    s->task = NULL;
    s->i_batch = -1;
    s->last_used_us = thaw_now_us();
}

void thaw_slot_move(struct thaw_slot *s, enum thaw_slot_phase to, const struct thaw_slot_enter *in,
                    struct thaw_metrics *m)
{
    static const struct thaw_slot_enter none;
    enum thaw_slot_phase from = s->phase;

    if (!thaw_slot_move_legal(from, to)) {
        LOG_ERR("slot %d: illegal phase move %s -> %s", s->id, thaw_slot_phase_name(from), thaw_slot_phase_name(to));
        abort();
    }
    if (!in)
        in = &none;
    if (to == THAW_SLOT_PREFILL)
        enter_prefill(s, in);
    if ((from == THAW_SLOT_PREFILL || from == THAW_SLOT_GEN) && to != THAW_SLOT_GEN)
        release_task(s);
    if (to == THAW_SLOT_FIXUP) {
        free(s->fix);
        s->fix = in->fix;
        s->n_fix = in->fix ? in->n_fix : s->n_tokens;
        s->fix_since_us = thaw_now_us();
        s->stored_early = false;
    }
    if (from == THAW_SLOT_FIXUP) {
        free(s->fix);
        s->fix = NULL;
        s->n_fix = 0;
    }
    s->phase = to;
    thaw_slots_view_publish(s->view, s);
    if (!m)
        return;
    /* busy = every phase but IDLE */
    if (from == THAW_SLOT_IDLE)
        atomic_fetch_add(&m->slots_busy, 1);
    else if (to == THAW_SLOT_IDLE)
        atomic_fetch_sub(&m->slots_busy, 1);
    /* processing a request = PREFILL or GEN: the task is taken and released above */
    if (to == THAW_SLOT_PREFILL)
        atomic_fetch_add(&m->requests_processing, 1);
    else if ((from == THAW_SLOT_PREFILL || from == THAW_SLOT_GEN) && to != THAW_SLOT_GEN)
        atomic_fetch_sub(&m->requests_processing, 1);
}

void thaw_slot_count(const struct thaw_slot *slots, int n, int count[THAW_SLOT_PHASE_COUNT])
{
    memset(count, 0, THAW_SLOT_PHASE_COUNT * sizeof *count);
    for (int i = 0; i < n; i++)
        if ((unsigned)slots[i].phase < THAW_SLOT_PHASE_COUNT)
            count[slots[i].phase]++;
}

/* ---- what the KV holds ---- */

void thaw_slot_forget(struct thaw_slot *s)
{
    s->n_tokens = 0;
    s->holds_key = false;
    thaw_ckpt_clear(&s->ckpts);
}

void thaw_slot_truncate(struct thaw_slot *s, int n)
{
    if (n < s->n_tokens)
        s->holds_key = false; /* it now holds a prefix of that conversation only */
    s->n_tokens = n;
    thaw_ckpt_truncate(&s->ckpts, n);
}

void thaw_slot_hold(struct thaw_slot *s, const uint8_t *key)
{
    s->holds_key = key != NULL;
    if (key)
        memcpy(s->held_key, key, THAW_KEY_BYTES);
}

bool thaw_slot_holds(const struct thaw_slot *s, const uint8_t key[THAW_KEY_BYTES])
{
    return s->holds_key && memcmp(s->held_key, key, THAW_KEY_BYTES) == 0;
}

/* ---- the reply's text ---- */

void thaw_slot_finish_timings(struct thaw_slot *s, int64_t now_us)
{
    if (!s->t_prompt_done_us)
        s->t_prompt_done_us = now_us;
    s->timings.prompt_n = s->task->n_prompt - s->timings.cache_n;
    s->timings.prompt_ms = (double)(s->t_prompt_done_us - s->t_start_us) / 1000.0 - s->timings.restore_ms;
    s->timings.predicted_n = s->n_decoded;
    s->timings.predicted_ms = (double)(now_us - s->t_prompt_done_us) / 1000.0;
}

void thaw_slot_flush_text(struct thaw_slot *s, bool final)
{
    size_t end = s->gen.len;

    if (!final) {
        end = end > s->stop_hold ? end - s->stop_hold : 0;
        end = thaw_utf8_complete_len(s->gen.data, end);
    }
    if (end > s->n_sent) {
        struct thaw_timings live = s->timings, *lp = NULL;
        if (s->task->req.timings_per_token && s->task->req.stream) { /* as thaw_slot_finish_timings, not kept */
            int64_t now = thaw_now_us(), done = s->t_prompt_done_us ? s->t_prompt_done_us : now;
            live.prompt_n = s->task->n_prompt - live.cache_n;
            live.prompt_ms = (double)(done - s->t_start_us) / 1000.0 - live.restore_ms;
            live.predicted_n = s->n_decoded;
            live.predicted_ms = (double)(now - done) / 1000.0;
            lp = &live;
        }
        thaw_task_emit(s->task, s->gen.data + s->n_sent, end - s->n_sent, lp);
        s->n_sent = end;
    }
}

const char *thaw_slot_find_stop(const struct thaw_slot *s, size_t from, int *which)
{
    const struct thaw_task *t = s->task;
    const char *best = NULL;

    for (int i = 0; i < t->req.n_stop + t->gen.n_stops; i++) {
        const char *stop = i < t->req.n_stop ? t->req.stop[i] : t->gen.stops[i - t->req.n_stop];
        size_t l = strlen(stop);
        size_t start = from >= l ? from - l + 1 : 0;
        const char *hit = memmem(s->gen.data + start, s->gen.len - start, stop, l);
        if (hit && (!best || hit < best)) {
            best = hit;
            if (which)
                *which = i;
        }
    }
    return best;
}

int thaw_slot_reserve(struct thaw_slot *s, int n)
{
    return thaw_tokens_reserve(&s->tokens, &s->cap_tokens, n);
}

int thaw_slot_gen_append(struct thaw_slot *s, const char *p, size_t n)
{
    return thaw_buf_append(&s->gen, p, n);
}

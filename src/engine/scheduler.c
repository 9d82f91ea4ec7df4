/* scheduler.c — bounded FIFO of tasks, and the plan of an engine step:
 * slot choice, admission, the FIXUP budget (scheduler.h has the policy). */
#include "engine/scheduler.h"

#include "base/error.h"

#include <stdlib.h>
#include <time.h>

struct thaw_sched {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct thaw_task **ring; /* size entries: cap, plus one for a task put back */
    int cap, size, head, count;
    bool closed, kicked;
};

int thaw_sched_new(int max_queue, struct thaw_sched **out)
{
    struct thaw_sched *s = calloc(1, sizeof *s);

    if (!s)
        return THAW_ENOMEM;
    s->cap = max_queue > 0 ? max_queue : 1;
    s->size = s->cap + 1;
    s->ring = calloc((size_t)s->size, sizeof *s->ring);
    if (!s->ring) {
        free(s);
        return THAW_ENOMEM;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    *out = s;
    return 0;
}

void thaw_sched_free(struct thaw_sched *s)
{
    struct thaw_task *t;

    if (!s)
        return;
    while ((t = thaw_sched_pop(s, false)) != NULL) {
        thaw_task_fail(t, 503, "the server is shutting down");
        thaw_task_release(t);
    }
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s->ring);
    free(s);
}

int thaw_sched_push(struct thaw_sched *s, struct thaw_task *t)
{
    int rc = 0;

    pthread_mutex_lock(&s->mu);
    if (s->closed) {
        rc = THAW_ESHUTDOWN;
    } else if (s->count >= s->cap) {
        rc = THAW_EBUSY;
    } else {
        thaw_task_retain(t);
        s->ring[(s->head + s->count) % s->size] = t;
        s->count++;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

struct thaw_task *thaw_sched_pop(struct thaw_sched *s, bool wait)
{
    return wait ? thaw_sched_pop_for(s, -1) : thaw_sched_pop_for(s, 0);
}

struct thaw_task *thaw_sched_pop_for(struct thaw_sched *s, int64_t wait_us)
{
    struct thaw_task *t = NULL;
    struct timespec until;

    if (wait_us > 0) {
        clock_gettime(CLOCK_REALTIME, &until); /* the condition variable's clock */
        int64_t ns = (int64_t)until.tv_nsec + wait_us % 1000000 * 1000;
        until.tv_sec += (time_t)(wait_us / 1000000 + ns / 1000000000);
        until.tv_nsec = (long)(ns % 1000000000);
    }
    pthread_mutex_lock(&s->mu);
    while (wait_us != 0 && s->count == 0 && !s->kicked && !s->closed) {
        if (wait_us < 0)
            pthread_cond_wait(&s->cv, &s->mu);
        else if (pthread_cond_timedwait(&s->cv, &s->mu, &until) != 0)
            break; /* ETIMEDOUT */
    }
    s->kicked = false;
    if (s->count > 0) {
        t = s->ring[s->head];
        s->head = (s->head + 1) % s->size;
        s->count--;
    }
    pthread_mutex_unlock(&s->mu);
    return t;
}

void thaw_sched_unpop(struct thaw_sched *s, struct thaw_task *t)
{
    pthread_mutex_lock(&s->mu);
    /* room is certain: the ring has one entry beyond cap, and only the
     * engine thread pops and puts back, one task at a time */
    s->head = (s->head + s->size - 1) % s->size;
    s->ring[s->head] = t;
    s->count++;
    pthread_mutex_unlock(&s->mu);
}

int thaw_sched_depth(struct thaw_sched *s)
{
    int n;

    pthread_mutex_lock(&s->mu);
    n = s->count;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void thaw_sched_kick(struct thaw_sched *s)
{
    pthread_mutex_lock(&s->mu);
    s->kicked = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void thaw_sched_wait_kick(struct thaw_sched *s, int64_t wait_us)
{
    struct timespec until;

    clock_gettime(CLOCK_REALTIME, &until);
    int64_t ns = (int64_t)until.tv_nsec + wait_us % 1000000 * 1000;
    until.tv_sec += (time_t)(wait_us / 1000000 + ns / 1000000000);
    until.tv_nsec = (long)(ns % 1000000000);
    pthread_mutex_lock(&s->mu);
    while (!s->kicked && !s->closed)
        if (pthread_cond_timedwait(&s->cv, &s->mu, &until) != 0)
            break; /* ETIMEDOUT */
    s->kicked = false;
    pthread_mutex_unlock(&s->mu);
}

void thaw_sched_close(struct thaw_sched *s)
{
    pthread_mutex_lock(&s->mu);
    s->closed = true;
    s->kicked = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* ---- planning a step ------------------------------------------------------------- */

/* thaw_sched_pick_slot among the slots with `fixup` (else `idle`) set. */
static int pick(const struct thaw_slot_view *slots, int n_slots, bool fixup, const llama_token *prompt, int n_prompt,
                float similarity)
{
    int best = -1, lru = -1;
    float best_sim = 0;

    for (int i = 0; i < n_slots; i++) {
        if (fixup ? !slots[i].fixup : !slots[i].idle)
            continue;
        if (slots[i].holds_key)
            return i;
        if (similarity > 0 && n_prompt > 0) {
            int lcp = thaw_lcp(slots[i].tokens, slots[i].n_tokens, prompt, n_prompt);
            float sim = (float)lcp / (float)n_prompt;
            if (sim > similarity && sim > best_sim) {
                best_sim = sim;
                best = i;
            }
        }
        if (lru < 0 || slots[i].last_used_us < slots[lru].last_used_us)
            lru = i;
    }
    return best >= 0 ? best : lru;
}

int thaw_sched_pick_slot(const struct thaw_slot_view *slots, int n_slots, const llama_token *prompt, int n_prompt,
                         float similarity)
{
    return pick(slots, n_slots, false, prompt, n_prompt, similarity);
}

/* The FIXUP slot worth taking over for t rather than an idle slot holding
 * `have` tokens of its prompt, or -1: the one storing t's conversation (t
 * is its next turn), else one holding more of the prompt than cutting its
 * FIXUP short costs its own conversation (the tokens it has left to
 * re-decode, which that conversation's next turn then prefills). */
static int fixup_worth_taking(const struct thaw_slot_view *slots, int n_slots, const struct thaw_sched_task_view *t,
                              int have)
{
    int best = -1, best_gain = 0;

    for (int i = 0; i < n_slots; i++) {
        if (!slots[i].fixup)
            continue;
        if (slots[i].next_turn)
            return i;
        int gain = thaw_lcp(slots[i].tokens, slots[i].n_tokens, t->prompt, t->n_prompt) - have;
        if (gain > slots[i].fix_left && gain > best_gain) {
            best_gain = gain;
            best = i;
        }
    }
    return best;
}

struct thaw_sched_admission thaw_sched_admit(const struct thaw_slot_view *slots, int n_slots,
                                             const struct thaw_sched_task_view *t, const struct thaw_sched_params *p)
{
    float sim = t->cache_prompt ? p->similarity : 0;
    /* idle slots first; with none idle, the FIXUP ones as if idle */
    int i = pick(slots, n_slots, false, t->prompt, t->n_prompt, sim);

    if (i < 0)
        i = pick(slots, n_slots, true, t->prompt, t->n_prompt, sim);
    if (i < 0)
        return (struct thaw_sched_admission){THAW_SCHED_NONE, -1};
    if (t->cache_prompt && slots[i].idle) {
        int f = fixup_worth_taking(slots, n_slots, t, thaw_lcp(slots[i].tokens, slots[i].n_tokens, t->prompt,
                                                                t->n_prompt));
        if (f >= 0)
            i = f; /* not a cold slot while a warm one only finishes post-reply work */
    }
    if (!slots[i].fixup)
        return (struct thaw_sched_admission){THAW_SCHED_START, i};
    /* Only its store left: wait for that. Else, by default, cut: the tokens
     * left are the cut conversation's to prefill at its next turn, inside
     * that turn's batch (cheaper a token than a batch of their own now, and
     * never paid if it does not return), while waiting puts them all on
     * this request's first token (seed workload: 2 of 4 turn-2s waited
     * ~100 ms each at 250). --fixup-wait-ms > 0 waits when what is left
     * costs at most that, at what FIXUP tokens have cost so far. */
    if (slots[i].fix_left == 0 ||
        (p->fixup_wait_ms > 0 && (double)slots[i].fix_left * p->fixup_us_per_tok <= 1000.0 * p->fixup_wait_ms))
        return (struct thaw_sched_admission){THAW_SCHED_WAIT, i};
    return (struct thaw_sched_admission){THAW_SCHED_CUT, i};
}

int thaw_sched_batch_room(int n_gen_tokens, int n_batch, int n_ubatch, double us_per_tok)
{
    if (n_gen_tokens <= 0)
        return n_batch;
    int least = THAW_PROMPT_CHUNK_MIN < n_ubatch ? THAW_PROMPT_CHUNK_MIN : n_ubatch;
    int chunk = n_ubatch - n_gen_tokens; /* the rest of one micro-batch */
    if (us_per_tok > 0 && THAW_STREAM_STEP_US / us_per_tok - n_gen_tokens < chunk)
        chunk = (int)(THAW_STREAM_STEP_US / us_per_tok) - n_gen_tokens;
    if (chunk < least)
        chunk = least > 0 ? least : 1;
    return n_gen_tokens + chunk < n_batch ? n_gen_tokens + chunk : n_batch;
}

int thaw_sched_fixup_room(int n_prefill, int n_gen, bool awaited, double fixup_us_per_tok, int n_batch)
{
    if (awaited)
        return n_batch;
    if (n_prefill > 0)
        return 0;
    if (n_gen > 0)
        return THAW_FIXUP_PIGGYBACK;
    if (fixup_us_per_tok <= 0)
        return 4; /* a small first batch measures the cost */
    double n = THAW_FIXUP_SLICE_US / fixup_us_per_tok;
    return n < 1 ? 1 : n > n_batch ? n_batch : (int)n;
}

bool thaw_sched_fixup_due(bool free_now, int64_t waited_us)
{
    return free_now || waited_us >= THAW_FIXUP_DEFER_US;
}

double thaw_sched_fixup_cost(double fixup_us_per_tok, int64_t batch_us, int n_tokens)
{
    if (batch_us <= 0 || n_tokens <= 0)
        return fixup_us_per_tok;
    double per = (double)batch_us / n_tokens;
    return fixup_us_per_tok > 0 ? 0.7 * fixup_us_per_tok + 0.3 * per : per;
}

double thaw_sched_prompt_cost(double prompt_us_per_tok, int64_t batch_us, int n_tokens, int n_prompt, int n_gen)
{
    if (n_prompt < THAW_PROMPT_CHUNK_MIN / 2 || (n_gen == 0 && prompt_us_per_tok > 0))
        return prompt_us_per_tok;
    return thaw_sched_fixup_cost(prompt_us_per_tok, batch_us, n_tokens);
}

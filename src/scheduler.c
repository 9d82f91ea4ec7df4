/* scheduler.c — bounded FIFO of tasks and slot selection. */
#include "scheduler.h"

#include "error.h"

#include <stdlib.h>

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
    struct thaw_task *t = NULL;

    pthread_mutex_lock(&s->mu);
    while (wait && s->count == 0 && !s->kicked && !s->closed)
        pthread_cond_wait(&s->cv, &s->mu);
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

void thaw_sched_close(struct thaw_sched *s)
{
    pthread_mutex_lock(&s->mu);
    s->closed = true;
    s->kicked = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* ---- slot choice ---------------------------------------------------------------- */

int thaw_sched_pick_slot(const struct thaw_slot_view *slots, int n_slots, const llama_token *prompt, int n_prompt,
                         float similarity)
{
    int best = -1, lru = -1;
    float best_sim = 0;

    for (int i = 0; i < n_slots; i++) {
        if (!slots[i].idle)
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

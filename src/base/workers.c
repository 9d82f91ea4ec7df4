/* workers.c — the background worker pool (workers.h).
 *
 * One mutex guards the queue (a doubly linked FIFO, so a wait can take a
 * job back from anywhere in it) and every job's state. A job moves
 *
 *   QUEUED --worker takes it--> RUNNING --fn returns--> DONE
 *   QUEUED --wait takes it back--> (run by the waiter) DONE
 *   LOCAL (submit refused) --wait--> (run by the waiter) DONE
 *
 * and `done` is broadcast at every DONE a worker sets; waiters of jobs a
 * worker runs sleep on it. free sets `stopping`: workers leave only once
 * the queue is empty, so what was submitted before free still runs.
 */
#include "base/workers.h"

#include "base/error.h"

#include <errno.h>
#include <stdlib.h>

/* a job's state, under mu; `local` and `waited` are the submitter's own
 * (set in submit and wait, read by no worker) */
enum { JOB_LOCAL, JOB_QUEUED, JOB_RUNNING, JOB_DONE };

struct thaw_workers {
    pthread_mutex_t mu;
    pthread_cond_t work; /* a job was queued, or stopping */
    pthread_cond_t done; /* a worker finished a job */
    struct thaw_job *head, *tail;
    int stopping;
    uint32_t n_threads;
    pthread_t *th;
};

struct thaw_workers_params thaw_workers_default_params(void)
{
    return (struct thaw_workers_params){2, NULL};
}

static int default_create(pthread_t *th, void *(*fn)(void *), void *arg)
{
    return pthread_create(th, NULL, fn, arg);
}

/* Under mu. */
static void unlink_job(struct thaw_workers *w, struct thaw_job *j)
{
    if (j->prev)
        j->prev->next = j->next;
    else
        w->head = j->next;
    if (j->next)
        j->next->prev = j->prev;
    else
        w->tail = j->prev;
    j->prev = j->next = NULL;
}

static void *worker_main(void *arg)
{
    struct thaw_workers *w = arg;

    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->head && !w->stopping)
            pthread_cond_wait(&w->work, &w->mu);
        struct thaw_job *j = w->head;
        if (!j)
            break; /* stopping, and drained */
        unlink_job(w, j);
        j->state = JOB_RUNNING;
        pthread_mutex_unlock(&w->mu);
        j->fn(j->arg);
        pthread_mutex_lock(&w->mu);
        j->state = JOB_DONE; /* j may be gone once mu is released */
        pthread_cond_broadcast(&w->done);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int thaw_workers_new(const struct thaw_workers_params *p, struct thaw_workers **out)
{
    int (*create)(pthread_t *, void *(*)(void *), void *) = p->create ? p->create : default_create;
    struct thaw_workers *w;
    int err = 0;

    *out = NULL;
    if (p->n_threads == 0)
        return THAW_EINVAL;
    if (!(w = calloc(1, sizeof *w)))
        return THAW_ENOMEM;
    if (!(w->th = calloc(p->n_threads, sizeof *w->th)))
        goto err_calloc;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->work, NULL);
    pthread_cond_init(&w->done, NULL);
    for (uint32_t i = 0; i < p->n_threads; i++) {
        int e = create(&w->th[w->n_threads], worker_main, w);
        if (e == 0)
            w->n_threads++;
        else
            err = e;
    }
    if (w->n_threads == 0)
        goto err_threads;
    *out = w;
    return 0;

err_threads:
    pthread_cond_destroy(&w->done);
    pthread_cond_destroy(&w->work);
    pthread_mutex_destroy(&w->mu);
    free(w->th);
    free(w);
    return err > 0 ? -err : -EAGAIN;
err_calloc:
    free(w);
    return THAW_ENOMEM;
}

void thaw_workers_free(struct thaw_workers *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    w->stopping = 1;
    pthread_cond_broadcast(&w->work);
    pthread_mutex_unlock(&w->mu);
    for (uint32_t i = 0; i < w->n_threads; i++)
        pthread_join(w->th[i], NULL);
    pthread_cond_destroy(&w->done);
    pthread_cond_destroy(&w->work);
    pthread_mutex_destroy(&w->mu);
    free(w->th);
    free(w);
}

uint32_t thaw_workers_threads(const struct thaw_workers *w)
{
    return w ? w->n_threads : 0;
}

int thaw_workers_submit(struct thaw_workers *w, struct thaw_job *job, void (*fn)(void *arg), void *arg)
{
    int rc = 0;

    job->fn = fn;
    job->arg = arg;
    job->prev = job->next = NULL;
    job->state = JOB_LOCAL;
    job->local = 1;
    job->waited = 0;
    if (!w)
        return THAW_EINVAL;
    pthread_mutex_lock(&w->mu);
    if (w->stopping) {
        rc = THAW_ESHUTDOWN;
    } else {
        job->local = 0;
        job->state = JOB_QUEUED;
        job->prev = w->tail;
        if (w->tail)
            w->tail->next = job;
        else
            w->head = job;
        w->tail = job;
        pthread_cond_signal(&w->work);
    }
    pthread_mutex_unlock(&w->mu);
    return rc;
}

int thaw_workers_wait(struct thaw_workers *w, struct thaw_job *job)
{
    int here;

    if (job->waited) /* waited for already */
        return 0;
    if (job->local) { /* never queued: no worker can see it */
        here = 1;
    } else {
        pthread_mutex_lock(&w->mu);
        if ((here = job->state == JOB_QUEUED))
            unlink_job(w, job);
        while (!here && job->state != JOB_DONE)
            pthread_cond_wait(&w->done, &w->mu);
        pthread_mutex_unlock(&w->mu);
    }
    if (here)
        job->fn(job->arg);
    job->waited = 1;
    return !here;
}

/* workers.h — the background worker pool: N threads, one job queue, one
 * shutdown path (redis bio.c). Work that runs beside a request (a checksum
 * while the state is installed, GETs of a shared-tier run) is handed over
 * here; nobody creates a thread per request (STYLE 16).
 *
 *   submit   puts a job (caller storage, no allocation) at the queue's end
 *   wait     returns once the job has run: a job no worker has taken yet is
 *            taken back and run on the waiter's own thread, so a wait never
 *            waits for a queue (a busy pool, or none, costs parallelism,
 *            never progress)
 *   free     drains: every job still queued runs, on the workers, before
 *            the threads are joined
 *
 * Jobs must not wait for other jobs' progress that only a worker can make:
 * what a job waits for is its submitter's (which a wait then steals back
 * if need be). Threads: any thread submits and waits; new and free on one.
 */
#ifndef THAW_WORKERS_H
#define THAW_WORKERS_H

#include <pthread.h>
#include <stdint.h>

struct thaw_workers;

struct thaw_workers_params {
    uint32_t n_threads; /* >= 1 */
    /* thread creation (fault injection, STYLE 8); NULL = pthread_create.
     * Returns 0 or an errno value, as pthread_create does */
    int (*create)(pthread_t *th, void *(*fn)(void *), void *arg);
};

struct thaw_workers_params thaw_workers_default_params(void);

/* One job: caller storage that must stay put from submit until its wait
 * returns. The fields are the pool's. */
struct thaw_job {
    void (*fn)(void *arg);
    void *arg;
    struct thaw_job *prev, *next; /* in the queue */
    int state;                    /* enum in workers.c, under the pool's lock */
    int local, waited;            /* the submitter's: refused by submit; wait returned */
};

/* Starts the threads. Returns 0 (*out set; some threads may have failed to
 * start: thaw_workers_threads says how many run), THAW_EINVAL (n_threads
 * 0), THAW_ENOMEM, or -errno when not even one thread started (*out NULL).
 * Free with thaw_workers_free. */
int thaw_workers_new(const struct thaw_workers_params *p, struct thaw_workers **out);

/* Runs what is still queued (on the workers), joins them, frees w. No
 * thread may be in submit or wait. NULL: no-op. */
void thaw_workers_free(struct thaw_workers *w);

/* Threads running (0 for NULL). */
uint32_t thaw_workers_threads(const struct thaw_workers *w);

/* Queues fn(arg) in job. Returns 0, or THAW_EINVAL (w NULL) / THAW_ESHUTDOWN
 * (free has begun): not queued, and thaw_workers_wait runs it on the
 * waiter's thread. Either way the job must be waited for before its storage
 * goes. */
int thaw_workers_submit(struct thaw_workers *w, struct thaw_job *job, void (*fn)(void *arg), void *arg);

/* Returns once job has run: at once if it has, after it if a worker runs
 * it now, or after running it here if no worker has taken it (w may be
 * NULL then). Returns 1 when the job ran on a worker, 0 when it ran here
 * (or, for a job waited for already, nothing ran). */
int thaw_workers_wait(struct thaw_workers *w, struct thaw_job *job);

#endif

/* test_workers.c — the worker pool: jobs run once each, a wait takes back
 * a job no worker has started, free drains what is queued, and a pool that
 * cannot start (all) its threads or is gone still runs every job. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "base/error.h"
#include "base/workers.h"

struct rec {
    atomic_int runs;
    pthread_t ran_on;
};

static void count(void *arg)
{
    struct rec *r = arg;
    r->ran_on = pthread_self();
    atomic_fetch_add(&r->runs, 1);
}

/* a job that holds its worker until the test opens the gate */
struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int entered, open;
};

static void hold(void *arg)
{
    struct gate *g = arg;
    pthread_mutex_lock(&g->mu);
    g->entered = 1;
    pthread_cond_broadcast(&g->cv);
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void gate_wait_entered(struct gate *g)
{
    pthread_mutex_lock(&g->mu);
    while (!g->entered)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void gate_open(struct gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static struct thaw_workers *pool(uint32_t n)
{
    struct thaw_workers_params p = thaw_workers_default_params();
    struct thaw_workers *w;
    p.n_threads = n;
    assert_int_equal(thaw_workers_new(&p, &w), 0);
    assert_int_equal(thaw_workers_threads(w), n);
    return w;
}

static void test_submit_wait(void **state)
{
    struct thaw_workers *w = pool(3);
    enum { N = 64 };
    struct thaw_job jobs[N];
    struct rec recs[N] = {0};

    (void)state;
    for (int i = 0; i < N; i++)
        assert_int_equal(thaw_workers_submit(w, &jobs[i], count, &recs[i]), 0);
    for (int i = N - 1; i >= 0; i--) {
        thaw_workers_wait(w, &jobs[i]);
        assert_int_equal(atomic_load(&recs[i].runs), 1); /* done when wait returns */
    }
    for (int i = 0; i < N; i++) {
        assert_int_equal(thaw_workers_wait(w, &jobs[i]), 0); /* a second wait: nothing runs again */
        assert_int_equal(atomic_load(&recs[i].runs), 1);
    }
    thaw_workers_free(w);
}

/* the only worker is held: a queued job is run by its waiter, once */
static void test_wait_takes_back(void **state)
{
    struct thaw_workers *w = pool(1);
    struct gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    struct thaw_job jg, jb;
    struct rec rb = {0};

    (void)state;
    assert_int_equal(thaw_workers_submit(w, &jg, hold, &g), 0);
    gate_wait_entered(&g);
    assert_int_equal(thaw_workers_submit(w, &jb, count, &rb), 0);
    assert_int_equal(thaw_workers_wait(w, &jb), 0); /* ran here */
    assert_int_equal(atomic_load(&rb.runs), 1);
    assert_true(pthread_equal(rb.ran_on, pthread_self()));
    gate_open(&g);
    assert_int_equal(thaw_workers_wait(w, &jg), 1); /* ran on the worker */
    thaw_workers_free(w);
    assert_int_equal(atomic_load(&rb.runs), 1); /* the worker never saw it */
}

struct freer {
    struct thaw_workers *w;
    pthread_t self;
};

static void *free_main(void *arg)
{
    struct freer *f = arg;
    f->self = pthread_self();
    thaw_workers_free(f->w);
    return NULL;
}

/* free with jobs queued behind a held worker: they all run, on the worker;
 * a submit once free has begun is refused and runs on its waiter */
static void test_shutdown_drains(void **state)
{
    struct thaw_workers *w = pool(1);
    struct gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    enum { N = 5 };
    struct thaw_job jg, jobs[N], probe;
    struct rec recs[N] = {0}, rp = {0};
    struct freer f = {w, 0};
    pthread_t th;

    (void)state;
    assert_int_equal(thaw_workers_submit(w, &jg, hold, &g), 0);
    gate_wait_entered(&g);
    for (int i = 0; i < N; i++)
        assert_int_equal(thaw_workers_submit(w, &jobs[i], count, &recs[i]), 0);
    assert_int_equal(pthread_create(&th, NULL, free_main, &f), 0);
    /* until free has begun, a probe is queued and taken back at once */
    int rc;
    while ((rc = thaw_workers_submit(w, &probe, count, &rp)) == 0)
        assert_int_equal(thaw_workers_wait(w, &probe), 0);
    assert_int_equal(rc, THAW_ESHUTDOWN);
    int before = atomic_load(&rp.runs);
    assert_int_equal(thaw_workers_wait(NULL, &probe), 0); /* refused: runs here, no pool needed */
    assert_int_equal(atomic_load(&rp.runs), before + 1);
    gate_open(&g);
    pthread_join(th, NULL);
    for (int i = 0; i < N; i++) {
        assert_int_equal(atomic_load(&recs[i].runs), 1);
        assert_false(pthread_equal(recs[i].ran_on, pthread_self()));
        assert_false(pthread_equal(recs[i].ran_on, f.self));
    }
}

static void test_no_pool(void **state)
{
    struct thaw_job j;
    struct rec r = {0};

    (void)state;
    assert_int_equal(thaw_workers_submit(NULL, &j, count, &r), THAW_EINVAL);
    assert_int_equal(atomic_load(&r.runs), 0);
    assert_int_equal(thaw_workers_wait(NULL, &j), 0);
    assert_int_equal(atomic_load(&r.runs), 1);
    assert_int_equal(thaw_workers_threads(NULL), 0);
    thaw_workers_free(NULL);
}

static atomic_int n_create;
static int fail_every_other(pthread_t *th, void *(*fn)(void *), void *arg)
{
    if (atomic_fetch_add(&n_create, 1) % 2)
        return EAGAIN;
    return pthread_create(th, NULL, fn, arg);
}

static int fail_all(pthread_t *th, void *(*fn)(void *), void *arg)
{
    (void)th, (void)fn, (void)arg;
    return EPERM;
}

static void test_create_fails(void **state)
{
    struct thaw_workers_params p = thaw_workers_default_params();
    struct thaw_workers *w = (void *)1;
    struct thaw_job j;
    struct rec r = {0};

    (void)state;
    p.n_threads = 0;
    assert_int_equal(thaw_workers_new(&p, &w), THAW_EINVAL);
    assert_null(w);
    p.n_threads = 4;
    p.create = fail_all;
    assert_int_equal(thaw_workers_new(&p, &w), -EPERM);
    assert_null(w);
    p.create = fail_every_other;
    assert_int_equal(thaw_workers_new(&p, &w), 0);
    assert_int_equal(thaw_workers_threads(w), 2); /* what started, runs */
    assert_int_equal(thaw_workers_submit(w, &j, count, &r), 0);
    thaw_workers_wait(w, &j);
    assert_int_equal(atomic_load(&r.runs), 1);
    thaw_workers_free(w);
}

/* many submitters and waiters at once (for the sanitizers): each job once */
struct storm {
    struct thaw_workers *w;
    atomic_long *sum;
};

static void add_one(void *arg)
{
    atomic_fetch_add((atomic_long *)arg, 1);
}

static void *storm_main(void *arg)
{
    struct storm *s = arg;
    enum { M = 500, BATCH = 16 };
    struct thaw_job jobs[BATCH];

    for (int i = 0; i < M; i += BATCH) {
        for (int k = 0; k < BATCH; k++)
            if (thaw_workers_submit(s->w, &jobs[k], add_one, s->sum) != 0)
                atomic_fetch_add(s->sum, 1000000); /* fails the sum: never refused here */
        for (int k = BATCH - 1; k >= 0; k--)
            thaw_workers_wait(s->w, &jobs[k]);
    }
    return NULL;
}

static void test_storm(void **state)
{
    struct thaw_workers *w = pool(4);
    atomic_long sum = 0;
    struct storm s = {w, &sum};
    pthread_t th[3];

    (void)state;
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&th[i], NULL, storm_main, &s), 0);
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    thaw_workers_free(w);
    assert_int_equal(atomic_load(&sum), 3 * 512); /* 3 submitters x 32 batches of 16 */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_submit_wait),   cmocka_unit_test(test_wait_takes_back),
        cmocka_unit_test(test_shutdown_drains), cmocka_unit_test(test_no_pool),
        cmocka_unit_test(test_create_fails),  cmocka_unit_test(test_storm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

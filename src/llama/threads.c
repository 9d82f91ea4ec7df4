/* threads.c — long-lived CPU threadpools for a llama context (threads.h). */
#include "llama/threads.h"

#include "base/cpumask.h"
#include "base/error.h"
#include "base/log.h"

#include <ggml-backend.h>
#include <ggml-cpu.h>
#include <stdlib.h>
#include <string.h>

/* The CPU backend is a module loaded at run time (one per CPU variant):
 * its threadpool functions are reached through its registry, as
 * llama-server does, not linked. */
typedef struct ggml_threadpool *(*pool_new_fn)(struct ggml_threadpool_params *);
typedef void (*pool_free_fn)(struct ggml_threadpool *);

struct thaw_threads {
    struct ggml_threadpool *gen;
    struct ggml_threadpool *batch; /* NULL: gen serves both */
    pool_free_fn free_fn;
};

_Static_assert(THAW_MAX_CPUS == GGML_MAX_N_THREADS, "a -C mask is ggml's cpumask");

static struct ggml_threadpool_params pool_params(int n_threads, const struct thaw_cpu_cfg *c)
{
    struct ggml_threadpool_params p;

    ggml_threadpool_params_init(&p, n_threads);
    if (c->mask_valid)
        memcpy(p.cpumask, c->mask, sizeof p.cpumask);
    p.prio = (enum ggml_sched_priority)c->prio;
    p.poll = (uint32_t)c->poll;
    p.strict_cpu = c->strict != 0;
    return p;
}

int thaw_threads_attach(struct llama_context *ctx, int n_threads, const struct thaw_cpu_cfg *gen, int n_threads_batch,
                        const struct thaw_cpu_cfg *batch, struct thaw_threads **out)
{
    *out = NULL;
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!cpu) {
        LOG_WRN("threads: no CPU backend loaded, so no threadpool to attach");
        return 0;
    }
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(cpu);
    pool_new_fn new_fn = (pool_new_fn)ggml_backend_reg_get_proc_address(reg, "ggml_threadpool_new");
    pool_free_fn free_fn = (pool_free_fn)ggml_backend_reg_get_proc_address(reg, "ggml_threadpool_free");
    if (!new_fn || !free_fn) {
        LOG_WRN("threads: the CPU backend has no threadpool API; ggml makes threads per graph");
        return 0;
    }
    struct thaw_threads *t = calloc(1, sizeof *t);
    if (!t)
        return THAW_ENOMEM;
    t->free_fn = free_fn;
    struct ggml_threadpool_params pg = pool_params(n_threads, gen), pb = pool_params(n_threads_batch, batch);
    if (!ggml_threadpool_params_match(&pg, &pb)) {
        t->batch = new_fn(&pb);
        if (!t->batch)
            goto fail;
        pg.paused = true; /* llama starts the pool a graph needs and pauses the other */
    }
    t->gen = new_fn(&pg);
    if (!t->gen)
        goto fail;
    llama_attach_threadpool(ctx, t->gen, t->batch);
    if (t->batch)
        LOG_INF("threads: %d for generation (poll %d), %d for prompts (poll %d), kept between graphs%s", n_threads,
                gen->poll, n_threads_batch, batch->poll, gen->mask_valid || batch->mask_valid ? ", placed by -C/-Cr" : "");
    else
        LOG_INF("threads: %d for generation and prompts (poll %d), kept between graphs%s", n_threads, gen->poll,
                gen->mask_valid ? ", placed by -C/-Cr" : "");
    *out = t;
    return 0;
fail:
    LOG_WRN("threads: could not start a threadpool of %d threads; ggml makes threads per graph",
             t->batch ? n_threads : n_threads_batch);
    thaw_threads_free(t);
    return 0;
}

void thaw_threads_free(struct thaw_threads *t)
{
    if (!t)
        return;
    if (t->gen)
        t->free_fn(t->gen);
    if (t->batch)
        t->free_fn(t->batch);
    free(t);
}

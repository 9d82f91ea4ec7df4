/* threads.h — the CPU threads a llama context computes its graphs on.
 *
 * Without a threadpool attached, ggml's CPU backend makes one for every
 * graph it computes (one a decoded token) and joins it after: on a machine
 * whose cores are busy with other work, each token then waits for the
 * scheduler to start fresh threads, and decode ran at a fraction of
 * llama-server's speed, which attaches long-lived pools
 * (common/common.cpp common_threadpools). thaw attaches them the same way:
 * one pool for generation (-t) and, when its settings differ, one for
 * prompt processing (-tb), with llama-server's placement settings (-C, -Cr,
 * --cpu-strict, --prio, --poll and their -batch forms).
 */
#ifndef THAW_THREADS_H
#define THAW_THREADS_H

#include <stdbool.h>

#include <llama.h>

struct thaw_cpu_cfg;

/* The pools attached to one context; free them after llama_free(ctx). */
struct thaw_threads;

/* Makes the pools (gen for -t, batch for -tb) and attaches them to ctx. When no CPU backend is loaded
 * (there is nothing to attach) or a pool cannot be made, logs why and
 * leaves ctx with ggml's own per-graph threads: *out is NULL and the
 * return is still 0. */
int thaw_threads_attach(struct llama_context *ctx, int n_threads, const struct thaw_cpu_cfg *gen, int n_threads_batch,
                        const struct thaw_cpu_cfg *batch, struct thaw_threads **out);

void thaw_threads_free(struct thaw_threads *t);

#endif

/* cpumask.h — llama-server's CPU placement settings (-C, -Cr, --cpu-strict,
 * --prio, --poll and their -batch forms), parsed; llama/threads.c makes
 * the threadpools they describe.
 */
#ifndef THAW_CPUMASK_H
#define THAW_CPUMASK_H

#include <stdbool.h>

#define THAW_MAX_CPUS 512 /* ggml's GGML_MAX_N_THREADS (threads.c checks) */

struct thaw_cpu_cfg {
    bool mask[THAW_MAX_CPUS]; /* the CPUs -C / -Cr named; used when mask_valid */
    bool mask_valid;
    int prio;   /* --prio: -1 low, 0 normal, 1 medium, 2 high, 3 realtime */
    int poll;   /* --poll: 0..100, how long a waiting thread spins before it sleeps */
    int strict; /* --cpu-strict: 0 | 1 */
};

/* -C: a hex mask, the last digit CPUs 0..3, an optional 0x; -Cr: "lo-hi",
 * either side may be empty (from CPU 0, to the last). The CPUs named are
 * added to mask, as llama-server's parse_cpu_mask / parse_cpu_range do.
 * Return false on a malformed value (mask unchanged). */
bool thaw_cpumask_parse_hex(const char *s, bool mask[THAW_MAX_CPUS]);
bool thaw_cpumask_parse_range(const char *s, bool mask[THAW_MAX_CPUS]);

#endif

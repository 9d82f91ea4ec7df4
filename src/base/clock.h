/* clock.h — the process clock. A leaf: it includes nothing of thaw. */
#ifndef THAW_CLOCK_H
#define THAW_CLOCK_H

#include <stdint.h>

/* Microseconds of CLOCK_MONOTONIC: for durations and deadlines only (it
 * means nothing across processes or restarts). Any thread. */
int64_t thaw_now_us(void);

#endif

/* clock.c — the process clock (clock.h). */
#include "base/clock.h"

#include <time.h>

int64_t thaw_now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

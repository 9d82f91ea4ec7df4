/* cpumask.c — -C / -Cr values (cpumask.h). */
#include "base/cpumask.h"

#include "base/fmt.h"

#include <stddef.h>
#include <string.h>

bool thaw_cpumask_parse_hex(const char *s, bool mask[THAW_MAX_CPUS])
{
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X'))
        s += 2;
    size_t n = strlen(s);
    if (n == 0 || n * 4 > THAW_MAX_CPUS)
        return false;
    for (size_t i = 0; i < n; i++)
        if (thaw_hex_digit(s[i]) < 0)
            return false;
    for (size_t i = 0; i < n; i++) {
        int v = thaw_hex_digit(s[n - 1 - i]);
        for (int b = 0; b < 4; b++)
            if (v & (1 << b))
                mask[i * 4 + (size_t)b] = true;
    }
    return true;
}

/* [s, end) as a CPU index; empty gives dflt */
static bool parse_index(const char *s, const char *end, size_t dflt, size_t *out)
{
    size_t v = 0;

    if (s == end) {
        *out = dflt;
        return true;
    }
    for (; s < end; s++) {
        if (*s < '0' || *s > '9')
            return false;
        v = v * 10 + (size_t)(*s - '0');
        if (v >= THAW_MAX_CPUS)
            return false;
    }
    *out = v;
    return true;
}

bool thaw_cpumask_parse_range(const char *s, bool mask[THAW_MAX_CPUS])
{
    const char *dash = strchr(s, '-');
    size_t lo, hi;

    if (!dash || !parse_index(s, dash, 0, &lo) || !parse_index(dash + 1, dash + strlen(dash), THAW_MAX_CPUS - 1, &hi) ||
        lo > hi)
        return false;
    for (size_t i = lo; i <= hi; i++)
        mask[i] = true;
    return true;
}

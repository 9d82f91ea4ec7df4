/* fmt.c — text forms of bytes: hex digits, human-readable sizes and ages. */
#include "base/fmt.h"

#include "base/error.h"

#include <inttypes.h>
#include <stdio.h>

void thaw_hex(const uint8_t *b, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";

    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[2 * n] = '\0';
}

int thaw_hex_digit(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

int thaw_unhex(const char *s, size_t n, uint8_t *out)
{
    for (size_t i = 0; i < n; i++) {
        int hi = thaw_hex_digit(s[2 * i]), lo;

        if (hi < 0)
            return THAW_EINVAL;
        lo = thaw_hex_digit(s[2 * i + 1]);
        if (lo < 0)
            return THAW_EINVAL;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

void thaw_fmt_bytes(uint64_t n, char out[24])
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    int u = 0;

    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(out, 24, "%llu B", (unsigned long long)n);
    else
        snprintf(out, 24, "%.1f %s", v, unit[u]);
}

void thaw_fmt_ago(int64_t then, int64_t now, char out[24])
{
    int64_t d = now - then;

    if (then == 0) {
        snprintf(out, 24, "-");
        return;
    }
    if (d < 0)
        snprintf(out, 24, "in the future");
    else if (d < 120)
        snprintf(out, 24, "%" PRId64 "s ago", d);
    else if (d < 2 * 3600)
        snprintf(out, 24, "%" PRId64 "m ago", d / 60);
    else if (d < 2 * 86400)
        snprintf(out, 24, "%" PRId64 "h ago", d / 3600);
    else
        snprintf(out, 24, "%" PRId64 "d ago", d / 86400);
}

/* utf8.c — UTF-8 boundary detection and sanitising. */
#include "base/utf8.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Length of the valid sequence at s[0..n), 0 if invalid, -1 if it is a valid
 * but truncated start. */
static int seq_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    int len;
    uint32_t cp;

    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
        cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n)
            return -1;
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
        return 0;
    return len;
}

size_t thaw_utf8_complete_len(const char *s, size_t n)
{
    size_t i = 0;

    while (i < n) {
        int l = seq_len((const unsigned char *)s + i, n - i);
        if (l < 0)
            return i;
        i += l ? (size_t)l : 1;
    }
    return n;
}

char *thaw_utf8_sanitize(const char *s, size_t n)
{
    char *out = malloc(n * 3 + 1); /* each bad byte may become 3 bytes */
    size_t o = 0, i = 0;

    if (!out)
        return NULL;
    while (i < n) {
        int l = seq_len((const unsigned char *)s + i, n - i);
        if (l > 0) {
            memcpy(out + o, s + i, (size_t)l);
            o += (size_t)l;
            i += (size_t)l;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += 1;
        }
    }
    out[o] = '\0';
    return out;
}

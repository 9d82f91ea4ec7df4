/* buf.c — the growable byte buffer and the whole-file read (buf.h). */
#include "base/buf.h"

#include "base/error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int thaw_buf_reserve(struct thaw_buf *b, size_t n)
{
    if (b->oom)
        return THAW_ENOMEM;
    if (n > (size_t)-1 / 2 - b->len - 1)
        goto oom;
    size_t need = b->len + n + 1;
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap *= 2;
    char *d = realloc(b->data, cap);
    if (!d)
        goto oom;
    if (!b->data)
        d[0] = '\0';
    b->data = d;
    b->cap = cap;
    return 0;
oom:
    b->oom = true;
    return THAW_ENOMEM;
}

int thaw_buf_append(struct thaw_buf *b, const void *p, size_t n)
{
    int rc = thaw_buf_reserve(b, n);
    if (rc)
        return rc;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int thaw_buf_puts(struct thaw_buf *b, const char *s)
{
    return thaw_buf_append(b, s, strlen(s));
}

int thaw_buf_vprintf(struct thaw_buf *b, const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0)
        return THAW_EINVAL;
    int rc = thaw_buf_reserve(b, (size_t)n);
    if (rc)
        return rc;
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    b->len += (size_t)n;
    return 0;
}

int thaw_buf_printf(struct thaw_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = thaw_buf_vprintf(b, fmt, ap);
    va_end(ap);
    return rc;
}

void thaw_buf_truncate(struct thaw_buf *b, size_t n)
{
    if (n < b->len) {
        b->len = n;
        b->data[n] = '\0';
    }
}

char *thaw_buf_steal(struct thaw_buf *b)
{
    char *d = b->data;
    *b = (struct thaw_buf){0};
    return d;
}

void thaw_buf_free(struct thaw_buf *b)
{
    free(b->data);
    *b = (struct thaw_buf){0};
}

int thaw_read_file(const char *path, size_t max, char **out, size_t *n)
{
    *out = NULL;
    if (n)
        *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return -errno;
    struct thaw_buf b = {0};
    int rc = 0;
    for (;;) {
        if ((rc = thaw_buf_reserve(&b, 1 << 14)))
            goto out;
        size_t room = b.cap - b.len - 1;
        size_t got = fread(b.data + b.len, 1, room, f);
        b.len += got;
        b.data[b.len] = '\0';
        if (max && b.len > max) {
            rc = THAW_ETOOBIG;
            goto out;
        }
        if (got < room) {
            if (ferror(f))
                rc = errno ? -errno : -EIO;
            break;
        }
    }
out:
    fclose(f);
    if (rc) {
        thaw_buf_free(&b);
        return rc;
    }
    if (!b.data && (rc = thaw_buf_reserve(&b, 0)))
        return rc;
    if (n)
        *n = b.len;
    *out = thaw_buf_steal(&b);
    return 0;
}

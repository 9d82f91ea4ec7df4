/* buf.h — the one growable byte buffer (sds-style), and the one whole-file
 * read.
 *
 * A struct thaw_buf lives in the caller's storage; `struct thaw_buf b = {0}`
 * is an empty buffer. Its bytes are always followed by a NUL (once anything
 * was appended), so text built in it is a C string as it stands. Growth is
 * geometric. On a failed allocation the buffer keeps what it had and the
 * call returns THAW_ENOMEM; every later append also fails (b->oom), so a
 * builder may append many pieces and check once at the end.
 *
 * Not thread-safe: one owner at a time.
 */
#ifndef THAW_BUF_H
#define THAW_BUF_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

struct thaw_buf {
    char *data; /* len bytes, then a NUL; NULL while nothing was appended */
    size_t len; /* bytes held, excluding the NUL */
    size_t cap; /* bytes allocated (>= len + 1 once data != NULL) */
    bool oom;   /* an allocation failed: the buffer is short; appends fail */
};

/* Makes room for n more bytes (and the NUL). 0, or THAW_ENOMEM. */
int thaw_buf_reserve(struct thaw_buf *b, size_t n);
/* Appends n bytes of p (n == 0 is fine; p may then be NULL). 0, or
 * THAW_ENOMEM. */
int thaw_buf_append(struct thaw_buf *b, const void *p, size_t n);
/* Appends the C string s. 0, or THAW_ENOMEM. */
int thaw_buf_puts(struct thaw_buf *b, const char *s);
/* Appends printf-formatted text. 0, or THAW_ENOMEM (also THAW_EINVAL for a
 * format error). */
int thaw_buf_printf(struct thaw_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int thaw_buf_vprintf(struct thaw_buf *b, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
/* Drops the last bytes so that len becomes n (n <= len); keeps the memory. */
void thaw_buf_truncate(struct thaw_buf *b, size_t n);
/* Hands the bytes to the caller (free() them; NULL when nothing was ever
 * appended) and leaves b empty. */
char *thaw_buf_steal(struct thaw_buf *b);
/* Frees the bytes and leaves b empty ({0}). */
void thaw_buf_free(struct thaw_buf *b);

/* Reads the whole file at path into *out (malloc'd, NUL-terminated; the
 * caller frees it) and its size into *n (may be NULL). A file over max
 * bytes is THAW_ETOOBIG (max 0: no limit). 0, -errno (open/read), or
 * THAW_ENOMEM; *out is NULL on failure. */
int thaw_read_file(const char *path, size_t max, char **out, size_t *n);

#endif

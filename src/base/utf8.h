/* utf8.h — the two UTF-8 questions a token stream raises: where the last
 * complete character ends, and how to make arbitrary bytes valid. */
#ifndef THAW_UTF8_H
#define THAW_UTF8_H

#include <stddef.h>

/* Length of the longest prefix of s[0..n) that does not end inside an
 * incomplete multi-byte sequence (invalid bytes count as complete: they are
 * replaced later). Streaming sends only this much. */
size_t thaw_utf8_complete_len(const char *s, size_t n);

/* Copies s[0..n) into a new NUL-terminated string with every invalid or
 * truncated sequence replaced by U+FFFD. Caller frees; NULL on ENOMEM. */
char *thaw_utf8_sanitize(const char *s, size_t n);

#endif

/* fmt.h — text forms of bytes: hex digits (keys in file and object names,
 * logs), human-readable sizes and ages. A leaf. */
#ifndef THAW_FMT_H
#define THAW_FMT_H

#include <stddef.h>
#include <stdint.h>

/* Writes n bytes as 2n lowercase hex digits and a NUL into out (2n+1). */
void thaw_hex(const uint8_t *b, size_t n, char *out);
/* "123 B", "4.5 MiB": a human-readable size into out[24]. */
void thaw_fmt_bytes(uint64_t n, char out[24]);
/* "45s ago", "12m ago", "3h ago", "2d ago" (then and now: Unix seconds)
 * into out[24]; "-" when then is 0 (unknown), "in the future" past now. */
void thaw_fmt_ago(int64_t then, int64_t now, char out[24]);
/* Parses exactly 2n hex digits (either case) of s into out. 0, or
 * THAW_EINVAL (out partly written). */
int thaw_unhex(const char *s, size_t n, uint8_t *out);

/* One hex digit's value (either case), or -1. */
int thaw_hex_digit(char ch);

#endif

/* error.h — thaw's error codes.
 *
 * Convention (everywhere in thaw): 0 is success, a failed system call returns
 * -errno, and thaw's own failures are the negative codes below, generated
 * from one table so that the enum and thaw_strerror() can never disagree.
 * The codes sit far below any errno value.
 */
#ifndef THAW_ERROR_H
#define THAW_ERROR_H

#include <stddef.h>

#define THAW_ERRNO_MAP(X)                                                    \
    X(NOTFOUND, "not found")                                                 \
    X(CORRUPT, "corrupt data (checksum or format mismatch)")                 \
    X(VERSION, "unsupported format version")                                 \
    X(MISMATCH, "belongs to another model or context configuration")         \
    X(INVAL, "invalid argument")                                             \
    X(TOOBIG, "too large")                                                   \
    X(BUSY, "queue full")                                                    \
    X(NOMEM, "out of memory")                                                \
    X(CTXFULL, "prompt does not fit in the context")                         \
    X(LLAMA, "llama.cpp call failed")                                        \
    X(SHUTDOWN, "server is shutting down")                                   \
    X(CANCELLED, "cancelled")                                                \
    X(LOCKED, "in use by another process")                                   \
    X(LAYOUT, "unknown llama.cpp state layout")                              \
    X(EXIST, "already exists")                                                 \
    X(TIMEDOUT, "timed out")                                                 \
    X(STORE, "object store request failed")                                  \
    X(PENDING, "not ready yet: the caller is woken when it may be")

enum thaw_error {
    THAW_ERR_BASE_ = -100000,
#define THAW_ERR_ENUM_(name, msg) THAW_E##name,
    THAW_ERRNO_MAP(THAW_ERR_ENUM_)
#undef THAW_ERR_ENUM_
    THAW_ERR_END_
};

/* Human-readable text for 0, a thaw code or a -errno value. Never NULL; the
 * string is static (or thread-local for errno texts) and must not be freed. */
const char *thaw_strerror(int err);

/* Writes a one-line reason (printf format) into why (n_why bytes; NULL or 0:
 * nothing) and returns rc: `return thaw_why(why, n, THAW_ELAYOUT, "...")`. */
int thaw_why(char *why, size_t n_why, int rc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#endif

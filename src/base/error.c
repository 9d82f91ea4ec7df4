/* error.c — thaw_strerror(): text for thaw codes and -errno values. */
#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int thaw_why(char *why, size_t n_why, int rc, const char *fmt, ...)
{
    if (why && n_why) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, n_why, fmt, ap);
        va_end(ap);
    }
    return rc;
}

const char *thaw_strerror(int err)
{
    static _Thread_local char buf[128];

    if (err == 0)
        return "success";
    switch (err) {
#define THAW_ERR_CASE_(name, msg) \
    case THAW_E##name:            \
        return msg;
        THAW_ERRNO_MAP(THAW_ERR_CASE_)
#undef THAW_ERR_CASE_
    default:
        break;
    }
    if (err < 0 && err > THAW_ERR_BASE_) {
        const char *s = strerror_r(-err, buf, sizeof buf);
        return s;
    }
    return "unknown error";
}

/* error.c — thaw_strerror(): text for thaw codes and -errno values. */
#include "error.h"

#include <string.h>

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

/* webui.c — looks up the embedded page's files (the table is generated). */
#include "http/webui.h"

#include <string.h>

/* default-src 'none' and then only what the page uses: its own modules and
 * styles, fetch() to this origin (the API), and the data: favicon. No
 * 'unsafe-inline' anywhere, no frames, no forms posting elsewhere. */
#define WEBUI_CSP                                                                                                      \
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "              \
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

/* name, value pairs, one a line */
/* clang-format off */
const char *const thaw_webui_headers[] = {
    "Content-Security-Policy", WEBUI_CSP,
    "X-Content-Type-Options", "nosniff",
    "Referrer-Policy", "no-referrer",
    "Cache-Control", "no-cache", /* revalidate: a rebuilt thaw serves its new page at once */
    NULL,
};
/* clang-format on */

const struct thaw_webui_file *thaw_webui_find(const char *path)
{
    for (size_t i = 0; i < thaw_webui_n_files; i++)
        if (strcmp(thaw_webui_files[i].path, path) == 0)
            return &thaw_webui_files[i];
    return NULL;
}

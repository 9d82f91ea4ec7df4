/* webui.h — the chat page's files (webui/ and its npm libraries), embedded
 * in the binary at build time by cmake/embed.cmake.
 *
 * The page itself only calls the API (/v1/chat/completions, /cache, with the
 * key the person types in); it is public like /health, so a browser can load
 * it before it knows a key. Every file is served with the page's
 * Content-Security-Policy: scripts, styles and connections from this origin
 * only, no inline script.
 */
#ifndef THAW_WEBUI_H
#define THAW_WEBUI_H

#include <stdbool.h>
#include <stddef.h>

struct thaw_webui_file {
    const char *path;         /* URL path: "/" (index.html) or "/webui/..." */
    const char *content_type; /* static string */
    const unsigned char *data;
    size_t n_data; /* bytes of data */
};

/* The generated table (build/webui_files.c); empty when the build found no
 * libraries (scripts/setup.sh installs them into .deps/webui). */
extern const struct thaw_webui_file thaw_webui_files[];
extern const size_t thaw_webui_n_files;

/* The file served at `path`, or NULL: never a file outside the table. */
const struct thaw_webui_file *thaw_webui_find(const char *path);

/* Headers for every file: name, value, ..., NULL (static). */
extern const char *const thaw_webui_headers[];

#endif

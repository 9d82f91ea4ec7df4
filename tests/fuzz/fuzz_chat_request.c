/* fuzz_chat_request.c — libFuzzer target: a request body through what the
 * server does with it before it needs the model (server.c route_chat).
 *
 * The route is a chain of stages; each answers 0 or a thaw error, and a
 * THAW_EINVAL's message becomes the client's 400 body. stage() checks every
 * answer the same way:
 *   - the code is one the stage may return (0, THAW_EINVAL, THAW_ENOMEM);
 *   - a THAW_EINVAL message is non-empty, NUL-terminated, and makes a JSON
 *     body (thaw_api_error_json, as set_error does), so the client learns
 *     what to fix.
 * After the parse stage, the request must hold what api.h promises
 * (check_parsed); the model-free uses of it follow (conversation key).
 *
 * Any input: no crash, leak, overread or UB, and no broken promise (abort(),
 * which libFuzzer reports as a crash). Build: cmake -DTHAW_FUZZ=ON with
 * clang; run: scripts/fuzz.sh.
 */
#include "api/api.h"
#include "api/chat.h"
#include "api/request_keys.h"
#include "base/error.h"
#include "cache/keys.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* One stage's answer rc, with its message in err[errlen] when THAW_EINVAL.
 * Aborts on a broken promise; returns rc (0: go on to the next stage). */
static int stage(int rc, const char *err, size_t errlen)
{
    if (rc != 0 && rc != THAW_EINVAL && rc != THAW_ENOMEM)
        abort();
    if (rc == THAW_EINVAL) {
        char *body;
        if (err[0] == '\0' || !memchr(err, '\0', errlen))
            abort();
        if (!(body = thaw_api_error_json(400, err)))
            abort(); /* the client would get a 400 with an empty body */
        free(body);
    }
    return rc;
}

/* What api.h promises about a request thaw_api_parse_chat accepted. */
static void check_parsed(const struct thaw_chat_request *req)
{
    static const char *const roles[] = {"system", "user", "assistant", "developer", "tool"};

    if (!req->messages || req->n_messages == 0)
        abort();
    for (size_t i = 0; i < req->n_messages; i++) {
        const struct thaw_message *m = &req->messages[i];
        int known = 0;
        if (!m->role || !m->content)
            abort();
        for (size_t r = 0; r < sizeof roles / sizeof roles[0]; r++)
            known |= strcmp(m->role, roles[r]) == 0;
        if (!known)
            abort();
        (void)strlen(m->content); /* NUL-terminated inside its allocation */
    }
    /* each image: its bytes (within the limit) or a file:// path, and its key tag */
    for (size_t i = 0; i < req->n_images; i++) {
        const struct thaw_image *img = &req->images[i];
        if (!!img->data == !!img->path || (img->data && (img->len == 0 || img->len > THAW_VISION_MAX_IMAGE_BYTES)) ||
            (strncmp(img->tag, "sha256:", 7) != 0 && strncmp(img->tag, "file:", 5) != 0))
            abort();
    }
    if (req->n_stop < 0 || req->n_stop > THAW_API_MAX_STOP)
        abort();
    for (int i = 0; i < req->n_stop; i++)
        if (!req->stop[i] || req->stop[i][0] == '\0')
            abort();
    if (req->max_tokens < -1 || req->top_k < 0 || !isfinite(req->temperature) || req->temperature < 0 ||
        req->temperature > 2 || !(req->top_p >= 0 && req->top_p <= 1) || !(req->min_p >= 0 && req->min_p <= 1))
        abort();
}

/* The server's model-free use of an admitted request: the lookup key of the
 * conversation up to its last assistant message. */
static void derive_key(const struct thaw_chat_request *req)
{
    static const uint8_t binding[THAW_KEY_BYTES] = {1, 2, 3};
    uint8_t key[THAW_KEY_BYTES];
    long last = thaw_request_keys_last_assistant(req->messages, req->n_messages);

    if (last < -1 || last >= (long)req->n_messages)
        abort();
    if (last >= 0)
        thaw_request_keys_conversation(binding, req->messages, (size_t)last + 1, NULL, key);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct thaw_chat_request req;
    char err[256] = "";
    int rc;

    if ((rc = stage(thaw_api_parse_chat((const char *)data, size, true, &req, err, sizeof err), err,
                    sizeof err)) != 0)
        return 0; /* `req` is empty (api.h) */
    check_parsed(&req);

    /* route_chat's checks after the parse, in its order: admission against
     * a 4096-token slot whose longest token is 64 bytes */
    if (rc == 0)
        rc = stage(thaw_api_admit(&req, 4096, 64, err, sizeof err), err, sizeof err);

    if (rc == 0)
        derive_key(&req);
    thaw_chat_request_free(&req);
    return 0;
}

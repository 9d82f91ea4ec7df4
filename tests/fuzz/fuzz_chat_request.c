/* fuzz_chat_request.c — libFuzzer target: request bodies through the
 * chat-completions parser. Any input must give 0 or THAW_EINVAL, never a
 * crash, a leak or an overread (build: cmake -DTHAW_FUZZ=ON, clang). */
#include "api.h"
#include "error.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct thaw_chat_request req;
    char err[256];

    if (thaw_api_parse_chat((const char *)data, size, true, &req, err, sizeof err) == 0)
        thaw_chat_request_free(&req);
    return 0;
}

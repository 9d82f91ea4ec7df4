/* fuzz_kvstate.c — libFuzzer target: .kv and .ckpt blobs through their
 * parsers (what a restore reads after the checksums passed). */
#include "kvstate.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct thaw_kvstate_view v;
    struct thaw_ckpt_list l = {0};
    void *copy = malloc(size ? size : 1); /* the parsers expect aligned blobs, as mmap gives */

    if (!copy)
        return 0;
    memcpy(copy, data, size);
    (void)thaw_kvstate_parse(copy, size, &v);
    (void)thaw_ckpt_parse(copy, size, &l);
    thaw_ckpt_clear(&l);
    free(copy);
    return 0;
}

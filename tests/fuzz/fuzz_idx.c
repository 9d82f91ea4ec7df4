/* fuzz_idx.c — libFuzzer target: .idx records through their parser, the
 * first thing a lookup reads from disk. */
#include "cache_disk.h"

#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct thaw_disk_idx idx;

    (void)thaw_disk_idx_parse(data, size, &idx);
    return 0;
}

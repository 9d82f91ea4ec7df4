/* fingerprint.h — a model's identity from its content, not its name.
 *
 * BLAKE2b-256 over: the file size, the GGUF header (metadata + tensor table,
 * every byte before the tensor data) and a 4 KiB sample at the start, middle
 * and end of every tensor's data. Renaming a file changes nothing; other
 * weights under the same name and metadata change the sampled bytes. Cost:
 * a few KiB per tensor read, milliseconds even for a 20 GB file.
 */
#ifndef THAW_FINGERPRINT_H
#define THAW_FINGERPRINT_H

#include "base/key.h"

#include <stdint.h>

/* Returns 0, -errno on I/O failure, THAW_ECORRUPT if `path` is not GGUF. */
int thaw_fingerprint_file(const char *path, uint8_t out[THAW_KEY_BYTES]);

#endif

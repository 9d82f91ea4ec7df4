/* fingerprint.c — content fingerprint of a GGUF model file. */
#include "llama/fingerprint.h"

#include "base/error.h"

#include <errno.h>
#include <fcntl.h>
#include <gguf.h>
#include <sodium.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

enum { SAMPLE = 4096 };

static int hash_range(crypto_generichash_state *st, int fd, uint64_t off, uint64_t len, unsigned char *buf)
{
    while (len > 0) {
        size_t want = len > SAMPLE ? SAMPLE : (size_t)len;
        ssize_t n = pread(fd, buf, want, (off_t)off);
        if (n < 0)
            return -errno;
        if (n == 0)
            return THAW_ECORRUPT; /* tensor table points past the end of the file */
        crypto_generichash_update(st, buf, (size_t)n);
        off += (uint64_t)n;
        len -= (uint64_t)n;
    }
    return 0;
}

int thaw_fingerprint_file(const char *path, uint8_t out[THAW_KEY_BYTES])
{
    struct gguf_init_params gp = {.no_alloc = true, .ctx = NULL};
    struct gguf_context *g = NULL;
    crypto_generichash_state st;
    unsigned char *buf = NULL;
    struct stat sb;
    uint64_t size_le;
    int fd = -1, rc = 0;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    if (fstat(fd, &sb) != 0) {
        rc = -errno;
        goto out_close;
    }
    g = gguf_init_from_file(path, gp);
    if (!g) {
        rc = THAW_ECORRUPT;
        goto out_close;
    }
    buf = malloc(SAMPLE);
    if (!buf) {
        rc = THAW_ENOMEM;
        goto out_gguf;
    }
    crypto_generichash_init(&st, NULL, 0, THAW_KEY_BYTES);
    size_le = (uint64_t)sb.st_size;
    crypto_generichash_update(&st, (const unsigned char *)&size_le, sizeof size_le);

    const uint64_t data = gguf_get_data_offset(g);
    if ((rc = hash_range(&st, fd, 0, data, buf)) != 0)
        goto out_buf;
    for (int64_t i = 0; i < gguf_get_n_tensors(g); i++) {
        uint64_t off = data + gguf_get_tensor_offset(g, i);
        uint64_t len = gguf_get_tensor_size(g, i);
        uint64_t take = len < SAMPLE ? len : SAMPLE;
        /* start, middle, end: a fine-tune that touches any part of a matrix
         * almost surely changes bytes in all three */
        if ((rc = hash_range(&st, fd, off, take, buf)) != 0 ||
            (rc = hash_range(&st, fd, off + (len - take) / 2, take, buf)) != 0 ||
            (rc = hash_range(&st, fd, off + len - take, take, buf)) != 0)
            goto out_buf;
    }
    crypto_generichash_final(&st, out, THAW_KEY_BYTES);

out_buf:
    free(buf);
out_gguf:
    gguf_free(g);
out_close:
    close(fd);
    return rc;
}

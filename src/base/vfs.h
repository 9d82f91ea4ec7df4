/* vfs.h — the table of system calls that all of thaw's store I/O goes through.
 *
 * Why: the disk cache promises that a crash or a failed write at any point
 * never lets a wrong or partial entry be read back (cache_disk.c, invariants
 * 1-5). Promises like that are only worth what their tests are, and the tests
 * need to fail `write`, `fsync` or `rename` at a chosen call, or kill the
 * process right there. So, like SQLite's aSyscall[], every file operation of
 * the store is a call through a `struct thaw_vfs`; production uses
 * thaw_vfs_default(), tests wrap it with a thaw_vfs_fault.
 *
 * Conventions of every entry in the table:
 *   - the first argument is the table itself (a wrapper embeds a
 *     `struct thaw_vfs` as its first member and casts it back, as sqlite3_vfs
 *     does), so several tables can coexist without globals;
 *   - errors are returned as -errno, never through errno; EINTR is retried
 *     inside the default implementation;
 *   - paths are ordinary NUL-terminated paths; files are opened with the flags
 *     given, the caller adds O_CLOEXEC / O_NOFOLLOW as it sees fit.
 * The default table is stateless and may be used from any thread.
 */
#ifndef THAW_VFS_H
#define THAW_VFS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>

struct thaw_vfs {
    /* A file descriptor (>= 0), or -errno. */
    int (*open)(const struct thaw_vfs *vfs, const char *path, int flags, mode_t mode);
    /* 0 or -errno. The descriptor is released even when an error is returned
     * (Linux semantics), so never retry a close. */
    int (*close)(const struct thaw_vfs *vfs, int fd);
    /* Bytes written (possibly fewer than n: the caller loops), or -errno. */
    ssize_t (*write)(const struct thaw_vfs *vfs, int fd, const void *buf, size_t n);
    /* Bytes read at offset off (0 at end of file; possibly short), or -errno. */
    ssize_t (*pread)(const struct thaw_vfs *vfs, int fd, void *buf, size_t n, off_t off);
    /* preadv(2): the same, scattered over iov[0, n_iov) (n_iov <= IOV_MAX).
     * Counted as THAW_VFS_PREAD by the fault table. */
    ssize_t (*preadv)(const struct thaw_vfs *vfs, int fd, const struct iovec *iov, int n_iov, off_t off);
    /* 0 or -errno. Works on directories opened O_RDONLY too. */
    int (*fsync)(const struct thaw_vfs *vfs, int fd);
    /* syncfs(2): everything written to the filesystem that holds fd (file
     * data, inodes, directory entries; every process's) is durable on 0.
     * -errno otherwise: a writeback error since fd was opened is reported
     * (Linux >= 5.8), so open fd before the writes it is to cover. Counted
     * as THAW_VFS_FSYNC by the fault table. */
    int (*syncfs)(const struct thaw_vfs *vfs, int fd);
    /* 0 or -errno; *st is filled on 0. stat follows symbolic links. */
    int (*fstat)(const struct thaw_vfs *vfs, int fd, struct stat *st);
    int (*stat)(const struct thaw_vfs *vfs, const char *path, struct stat *st);
    /* 0 or -errno; rename(2): atomic replacement of `to`. */
    int (*rename)(const struct thaw_vfs *vfs, const char *from, const char *to);
    /* 0 or -errno (-ENOENT when there was nothing to unlink). */
    int (*unlink)(const struct thaw_vfs *vfs, const char *path);
    int (*mkdir)(const struct thaw_vfs *vfs, const char *path, mode_t mode);
    int (*chmod)(const struct thaw_vfs *vfs, const char *path, mode_t mode);
    /* Sets the times of an open file / of a path, as futimens(2) and
     * utimensat(AT_FDCWD, path, ts, 0): ts[0] access, ts[1] modification,
     * UTIME_OMIT leaves one unchanged. 0 or -errno. */
    int (*futimens)(const struct thaw_vfs *vfs, int fd, const struct timespec ts[2]);
    int (*utimens)(const struct thaw_vfs *vfs, const char *path, const struct timespec ts[2]);
    /* flock(2) with op LOCK_EX|LOCK_NB etc. 0 or -errno (-EWOULDBLOCK when
     * another open file description holds the lock). */
    int (*flock)(const struct thaw_vfs *vfs, int fd, int op);
    /* Maps [0, len) of fd read-only and private; len > 0. On 0, *addr is the
     * mapping, to be released with munmap; on -errno, *addr is untouched. */
    int (*mmap)(const struct thaw_vfs *vfs, int fd, size_t len, void **addr);
    /* 0 or -errno; the mapping is gone either way. */
    int (*munmap)(const struct thaw_vfs *vfs, void *addr, size_t len);
    /* Calls cb(ud, name) for every entry of directory `path` except "." and
     * "..", in no particular order. Stops when cb returns non-zero and
     * returns that value; otherwise 0, or -errno if the directory cannot be
     * read. Do not create or remove entries of `path` from inside cb. */
    int (*listdir)(const struct thaw_vfs *vfs, const char *path, int (*cb)(void *ud, const char *name), void *ud);
};

/* The real system calls. Static storage: never freed. */
const struct thaw_vfs *thaw_vfs_default(void);

/* ---- fault injection (tests) -------------------------------------------- */

/* Which calls a fault counts. THAW_VFS_ANY counts every call of the table. */
enum thaw_vfs_op {
    THAW_VFS_OPEN,
    THAW_VFS_CLOSE,
    THAW_VFS_WRITE,
    THAW_VFS_PREAD,
    THAW_VFS_FSYNC,
    THAW_VFS_FSTAT,
    THAW_VFS_STAT,
    THAW_VFS_RENAME,
    THAW_VFS_UNLINK,
    THAW_VFS_MKDIR,
    THAW_VFS_CHMOD,
    THAW_VFS_FUTIMENS,
    THAW_VFS_UTIMENS,
    THAW_VFS_FLOCK,
    THAW_VFS_MMAP,
    THAW_VFS_MUNMAP,
    THAW_VFS_LISTDIR,
    THAW_VFS_ANY,
    THAW_VFS_OP_COUNT_
};

enum thaw_vfs_action {
    THAW_VFS_NONE,      /* only count */
    THAW_VFS_FAIL_ONCE, /* the nth matching call returns err, later ones succeed */
    THAW_VFS_FAIL_FROM, /* the nth matching call and every later one return err */
    THAW_VFS_CRASH,     /* the process _exit(137)s at the nth matching call,
                         * before doing it; a write writes its first half
                         * first (a torn write), then exits */
};

/* A table that forwards to `base` and counts calls per op; armed, it fails
 * or crashes at a chosen call. Counting is atomic, so the table may be used
 * by several threads; which thread's call is "the nth" is then up to the
 * scheduler, so tests arm it where only one thread does I/O.
 * A failed close/munmap still releases the descriptor/mapping (as the kernel
 * does), so injected faults leak nothing. */
struct thaw_vfs_fault;

/* 0, or THAW_ENOMEM (*out untouched). `base` must outlive the fault table;
 * NULL means thaw_vfs_default(). Free with thaw_vfs_fault_free(). */
int thaw_vfs_fault_new(const struct thaw_vfs *base, struct thaw_vfs_fault **out);
/* NULL is a no-op. */
void thaw_vfs_fault_free(struct thaw_vfs_fault *f);
/* The table to hand to the code under test; valid until thaw_vfs_fault_free. */
const struct thaw_vfs *thaw_vfs_fault_vfs(struct thaw_vfs_fault *f);
/* Resets every counter to 0, then arms: the nth (1-based) call of `op`
 * counted from now triggers `action`; `err` is the -errno returned by the
 * FAIL actions (e.g. -ENOSPC). THAW_VFS_NONE with any n just resets. */
void thaw_vfs_fault_arm(struct thaw_vfs_fault *f, enum thaw_vfs_op op, unsigned long nth, enum thaw_vfs_action action,
                        int err);
/* Calls of `op` since the last arm (THAW_VFS_ANY: all calls). */
unsigned long thaw_vfs_fault_calls(const struct thaw_vfs_fault *f, enum thaw_vfs_op op);
/* How many times the armed fault fired (crashes never return to count). */
unsigned long thaw_vfs_fault_fired(const struct thaw_vfs_fault *f);

#endif

/* vfs.c — the real system calls behind struct thaw_vfs, and the fault-
 * injecting wrapper the store's tests use.
 *
 * Map:
 *   ---- default table ----   thin wrappers: -errno instead of errno, EINTR
 *   ---- fault table ----     counting, failing and crashing wrapper
 */
#include "base/vfs.h"

#include "base/error.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- default table ------------------------------------------------------ */

static int sys_open(const struct thaw_vfs *vfs, const char *path, int flags, mode_t mode)
{
    int fd;

    (void)vfs;
    do
        fd = open(path, flags, mode);
    while (fd < 0 && errno == EINTR);
    return fd < 0 ? -errno : fd;
}

static int sys_close(const struct thaw_vfs *vfs, int fd)
{
    (void)vfs;
    /* Linux releases fd even on EINTR: never retry. */
    return close(fd) < 0 && errno != EINTR ? -errno : 0;
}

static ssize_t sys_write(const struct thaw_vfs *vfs, int fd, const void *buf, size_t n)
{
    ssize_t r;

    (void)vfs;
    do
        r = write(fd, buf, n);
    while (r < 0 && errno == EINTR);
    return r < 0 ? -errno : r;
}

static ssize_t sys_preadv(const struct thaw_vfs *vfs, int fd, const struct iovec *iov, int n_iov, off_t off)
{
    ssize_t r;

    (void)vfs;
    do
        r = preadv(fd, iov, n_iov, off);
    while (r < 0 && errno == EINTR);
    return r < 0 ? -errno : r;
}

static ssize_t sys_pread(const struct thaw_vfs *vfs, int fd, void *buf, size_t n, off_t off)
{
    ssize_t r;

    (void)vfs;
    do
        r = pread(fd, buf, n, off);
    while (r < 0 && errno == EINTR);
    return r < 0 ? -errno : r;
}

static int sys_fsync(const struct thaw_vfs *vfs, int fd)
{
    int r;

    (void)vfs;
    do
        r = fsync(fd);
    while (r < 0 && errno == EINTR);
    return r < 0 ? -errno : 0;
}

static int sys_syncfs(const struct thaw_vfs *vfs, int fd)
{
    int r;

    (void)vfs;
    do
        r = syncfs(fd);
    while (r < 0 && errno == EINTR);
    return r < 0 ? -errno : 0;
}

static int sys_fstat(const struct thaw_vfs *vfs, int fd, struct stat *st)
{
    (void)vfs;
    return fstat(fd, st) < 0 ? -errno : 0;
}

static int sys_stat(const struct thaw_vfs *vfs, const char *path, struct stat *st)
{
    (void)vfs;
    return stat(path, st) < 0 ? -errno : 0;
}

static int sys_rename(const struct thaw_vfs *vfs, const char *from, const char *to)
{
    (void)vfs;
    return rename(from, to) < 0 ? -errno : 0;
}

static int sys_unlink(const struct thaw_vfs *vfs, const char *path)
{
    (void)vfs;
    return unlink(path) < 0 ? -errno : 0;
}

static int sys_mkdir(const struct thaw_vfs *vfs, const char *path, mode_t mode)
{
    (void)vfs;
    return mkdir(path, mode) < 0 ? -errno : 0;
}

static int sys_chmod(const struct thaw_vfs *vfs, const char *path, mode_t mode)
{
    (void)vfs;
    return chmod(path, mode) < 0 ? -errno : 0;
}

static int sys_futimens(const struct thaw_vfs *vfs, int fd, const struct timespec ts[2])
{
    (void)vfs;
    return futimens(fd, ts) < 0 ? -errno : 0;
}

static int sys_utimens(const struct thaw_vfs *vfs, const char *path, const struct timespec ts[2])
{
    (void)vfs;
    return utimensat(AT_FDCWD, path, ts, 0) < 0 ? -errno : 0;
}

static int sys_flock(const struct thaw_vfs *vfs, int fd, int op)
{
    int r;

    (void)vfs;
    do
        r = flock(fd, op);
    while (r < 0 && errno == EINTR);
    return r < 0 ? -errno : 0;
}

static int sys_mmap(const struct thaw_vfs *vfs, int fd, size_t len, void **addr)
{
    void *p;

    (void)vfs;
    if (len == 0)
        return -EINVAL;
    /* MAP_POPULATE: the kernel reads ahead and maps every page in one go;
     * faulting 4 KiB at a time costs more than the checksum and the copy */
    p = mmap(NULL, len, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED)
        return -errno;
    /* The store reads a mapping once front to back (checksum), then hands it
     * to llama.cpp: tell the kernel to read ahead. Advice only. */
    (void)madvise(p, len, MADV_SEQUENTIAL);
    *addr = p;
    return 0;
}

static int sys_munmap(const struct thaw_vfs *vfs, void *addr, size_t len)
{
    (void)vfs;
    return munmap(addr, len) < 0 ? -errno : 0;
}

static int sys_listdir(const struct thaw_vfs *vfs, const char *path, int (*cb)(void *ud, const char *name), void *ud)
{
    DIR *d;
    struct dirent *de;
    int ret = 0;

    (void)vfs;
    d = opendir(path);
    if (!d)
        return -errno;
    for (;;) {
        errno = 0;
        de = readdir(d);
        if (!de) {
            ret = errno ? -errno : 0;
            break;
        }
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        ret = cb(ud, de->d_name);
        if (ret)
            break;
    }
    closedir(d);
    return ret;
}

static const struct thaw_vfs sys_vfs = {
    .open = sys_open,
    .close = sys_close,
    .write = sys_write,
    .pread = sys_pread,
    .preadv = sys_preadv,
    .fsync = sys_fsync,
    .syncfs = sys_syncfs,
    .fstat = sys_fstat,
    .stat = sys_stat,
    .rename = sys_rename,
    .unlink = sys_unlink,
    .mkdir = sys_mkdir,
    .chmod = sys_chmod,
    .futimens = sys_futimens,
    .utimens = sys_utimens,
    .flock = sys_flock,
    .mmap = sys_mmap,
    .munmap = sys_munmap,
    .listdir = sys_listdir,
};

const struct thaw_vfs *thaw_vfs_default(void)
{
    return &sys_vfs;
}

/* ---- fault table -------------------------------------------------------- */

struct thaw_vfs_fault {
    struct thaw_vfs vfs; /* first: the callbacks cast vfs back to the fault */
    const struct thaw_vfs *base;
    atomic_ulong calls[THAW_VFS_OP_COUNT_];
    atomic_ulong fired;
    /* The arming is written by the test between runs, read by callers. */
    _Atomic int op;
    _Atomic int action;
    atomic_ulong nth;
    _Atomic int err;
};

/* What the call about to be made should do: 0 go ahead, 1 crash (the caller
 * decides how: a write tears first), or a -errno to return instead. */
static int fault_hit(const struct thaw_vfs *vfs, enum thaw_vfs_op op)
{
    struct thaw_vfs_fault *f = (struct thaw_vfs_fault *)vfs;
    unsigned long n_any, n_op, n;
    int action = atomic_load(&f->action);
    int armed = atomic_load(&f->op);
    unsigned long nth = atomic_load(&f->nth);

    n_op = atomic_fetch_add(&f->calls[op], 1) + 1;
    n_any = atomic_fetch_add(&f->calls[THAW_VFS_ANY], 1) + 1;
    if (action == THAW_VFS_NONE || (armed != THAW_VFS_ANY && armed != (int)op))
        return 0;
    n = armed == THAW_VFS_ANY ? n_any : n_op;
    if (n < nth || (n > nth && action != THAW_VFS_FAIL_FROM))
        return 0;
    atomic_fetch_add(&f->fired, 1);
    if (action == THAW_VFS_CRASH)
        return 1;
    return atomic_load(&f->err);
}

static void fault_crash(void)
{
    _exit(137);
}

#define FAULT_BASE(vfs) (((const struct thaw_vfs_fault *)(vfs))->base)

static int ft_open(const struct thaw_vfs *vfs, const char *path, int flags, mode_t mode)
{
    int r = fault_hit(vfs, THAW_VFS_OPEN);

    if (r == 1)
        fault_crash();
    return r ? r : FAULT_BASE(vfs)->open(FAULT_BASE(vfs), path, flags, mode);
}

static int ft_close(const struct thaw_vfs *vfs, int fd)
{
    int r = fault_hit(vfs, THAW_VFS_CLOSE);
    int c;

    if (r == 1)
        fault_crash();
    c = FAULT_BASE(vfs)->close(FAULT_BASE(vfs), fd); /* the fd goes either way */
    return r ? r : c;
}

static ssize_t ft_write(const struct thaw_vfs *vfs, int fd, const void *buf, size_t n)
{
    int r = fault_hit(vfs, THAW_VFS_WRITE);

    if (r == 1) {
        if (n / 2)
            (void)FAULT_BASE(vfs)->write(FAULT_BASE(vfs), fd, buf, n / 2);
        fault_crash();
    }
    return r ? r : FAULT_BASE(vfs)->write(FAULT_BASE(vfs), fd, buf, n);
}

static ssize_t ft_pread(const struct thaw_vfs *vfs, int fd, void *buf, size_t n, off_t off)
{
    int r = fault_hit(vfs, THAW_VFS_PREAD);

    if (r == 1)
        fault_crash();
    return r ? r : FAULT_BASE(vfs)->pread(FAULT_BASE(vfs), fd, buf, n, off);
}

static ssize_t ft_preadv(const struct thaw_vfs *vfs, int fd, const struct iovec *iov, int n_iov, off_t off)
{
    int r = fault_hit(vfs, THAW_VFS_PREAD);

    if (r == 1)
        fault_crash();
    return r ? r : FAULT_BASE(vfs)->preadv(FAULT_BASE(vfs), fd, iov, n_iov, off);
}

/* The calls below all follow one pattern. */
#define FT_SIMPLE(name, OP, params, args)                                                                              \
    static int ft_##name params                                                                                        \
    {                                                                                                                  \
        int r = fault_hit(vfs, OP);                                                                                    \
        if (r == 1)                                                                                                    \
            fault_crash();                                                                                             \
        return r ? r : FAULT_BASE(vfs)->name args;                                                                     \
    }

FT_SIMPLE(fsync, THAW_VFS_FSYNC, (const struct thaw_vfs *vfs, int fd), (FAULT_BASE(vfs), fd))
FT_SIMPLE(syncfs, THAW_VFS_FSYNC, (const struct thaw_vfs *vfs, int fd), (FAULT_BASE(vfs), fd))
FT_SIMPLE(fstat, THAW_VFS_FSTAT, (const struct thaw_vfs *vfs, int fd, struct stat *st), (FAULT_BASE(vfs), fd, st))
FT_SIMPLE(stat, THAW_VFS_STAT, (const struct thaw_vfs *vfs, const char *path, struct stat *st),
          (FAULT_BASE(vfs), path, st))
FT_SIMPLE(rename, THAW_VFS_RENAME, (const struct thaw_vfs *vfs, const char *from, const char *to),
          (FAULT_BASE(vfs), from, to))
FT_SIMPLE(unlink, THAW_VFS_UNLINK, (const struct thaw_vfs *vfs, const char *path), (FAULT_BASE(vfs), path))
FT_SIMPLE(mkdir, THAW_VFS_MKDIR, (const struct thaw_vfs *vfs, const char *path, mode_t mode),
          (FAULT_BASE(vfs), path, mode))
FT_SIMPLE(chmod, THAW_VFS_CHMOD, (const struct thaw_vfs *vfs, const char *path, mode_t mode),
          (FAULT_BASE(vfs), path, mode))
FT_SIMPLE(futimens, THAW_VFS_FUTIMENS, (const struct thaw_vfs *vfs, int fd, const struct timespec ts[2]),
          (FAULT_BASE(vfs), fd, ts))
FT_SIMPLE(utimens, THAW_VFS_UTIMENS, (const struct thaw_vfs *vfs, const char *path, const struct timespec ts[2]),
          (FAULT_BASE(vfs), path, ts))
FT_SIMPLE(flock, THAW_VFS_FLOCK, (const struct thaw_vfs *vfs, int fd, int op), (FAULT_BASE(vfs), fd, op))
FT_SIMPLE(mmap, THAW_VFS_MMAP, (const struct thaw_vfs *vfs, int fd, size_t len, void **addr),
          (FAULT_BASE(vfs), fd, len, addr))
FT_SIMPLE(listdir, THAW_VFS_LISTDIR,
          (const struct thaw_vfs *vfs, const char *path, int (*cb)(void *ud, const char *name), void *ud),
          (FAULT_BASE(vfs), path, cb, ud))

static int ft_munmap(const struct thaw_vfs *vfs, void *addr, size_t len)
{
    int r = fault_hit(vfs, THAW_VFS_MUNMAP);
    int u;

    if (r == 1)
        fault_crash();
    u = FAULT_BASE(vfs)->munmap(FAULT_BASE(vfs), addr, len); /* released either way */
    return r ? r : u;
}

int thaw_vfs_fault_new(const struct thaw_vfs *base, struct thaw_vfs_fault **out)
{
    struct thaw_vfs_fault *f = calloc(1, sizeof *f);

    if (!f)
        return THAW_ENOMEM;
    f->base = base ? base : thaw_vfs_default();
    f->vfs = (struct thaw_vfs){
        .open = ft_open,
        .close = ft_close,
        .write = ft_write,
        .pread = ft_pread,
        .preadv = ft_preadv,
        .fsync = ft_fsync,
        .syncfs = ft_syncfs,
        .fstat = ft_fstat,
        .stat = ft_stat,
        .rename = ft_rename,
        .unlink = ft_unlink,
        .mkdir = ft_mkdir,
        .chmod = ft_chmod,
        .futimens = ft_futimens,
        .utimens = ft_utimens,
        .flock = ft_flock,
        .mmap = ft_mmap,
        .munmap = ft_munmap,
        .listdir = ft_listdir,
    };
    for (int i = 0; i < THAW_VFS_OP_COUNT_; i++)
        atomic_init(&f->calls[i], 0);
    atomic_init(&f->fired, 0);
    atomic_init(&f->op, THAW_VFS_ANY);
    atomic_init(&f->action, THAW_VFS_NONE);
    atomic_init(&f->nth, 0);
    atomic_init(&f->err, -EIO);
    *out = f;
    return 0;
}

void thaw_vfs_fault_free(struct thaw_vfs_fault *f)
{
    free(f);
}

const struct thaw_vfs *thaw_vfs_fault_vfs(struct thaw_vfs_fault *f)
{
    return &f->vfs;
}

void thaw_vfs_fault_arm(struct thaw_vfs_fault *f, enum thaw_vfs_op op, unsigned long nth, enum thaw_vfs_action action,
                        int err)
{
    /* Disarm first so that no call sees a half-written arming. */
    atomic_store(&f->action, THAW_VFS_NONE);
    for (int i = 0; i < THAW_VFS_OP_COUNT_; i++)
        atomic_store(&f->calls[i], 0);
    atomic_store(&f->fired, 0);
    atomic_store(&f->op, (int)op);
    atomic_store(&f->nth, nth);
    atomic_store(&f->err, err < 0 ? err : -EIO);
    atomic_store(&f->action, (int)action);
}

unsigned long thaw_vfs_fault_calls(const struct thaw_vfs_fault *f, enum thaw_vfs_op op)
{
    if ((int)op < 0 || op >= THAW_VFS_OP_COUNT_)
        return 0;
    return atomic_load(&((struct thaw_vfs_fault *)f)->calls[op]);
}

unsigned long thaw_vfs_fault_fired(const struct thaw_vfs_fault *f)
{
    return atomic_load(&((struct thaw_vfs_fault *)f)->fired);
}

/*
 * A disk-fault layer for fault-injection runs (crates/nemesis), loaded into
 * a node process with LD_PRELOAD. It wraps the calls that make data durable
 * (fsync, fdatasync, sync_file_range) and reads, on every call, the small
 * control file named by FENCELOCK_DISK_FAULT_FILE:
 *
 *   absent or empty   the call goes through unchanged
 *   "eio"             the call fails with EIO and syncs nothing
 *   "delay MS"        the call waits MS milliseconds, then goes through
 *   "free BYTES"      syncs go through, and statvfs/fstatvfs report at most
 *                     BYTES available: a disk running full, as the node's
 *                     free-space watcher sees it
 *
 * Why a preload and not a device-mapper target or a FUSE file system: both
 * need kernel modules or devices this machine's containers do not have,
 * while the node's RocksDB reaches the disk through these libc calls only,
 * so wrapping them fails exactly the operation under test (an fsync that
 * reports an error, a disk that is slow to make data durable) and nothing
 * else. Reading the file on each call lets the harness change the fault
 * while the node runs.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

enum verdict { PASS, FAIL_EIO };

static enum verdict before_sync(void) {
    const char *path = getenv("FENCELOCK_DISK_FAULT_FILE");
    if (path == NULL) {
        return PASS;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return PASS;
    }
    char verb[32];
    ssize_t n = read(fd, verb, sizeof verb - 1);
    close(fd);
    if (n <= 0) {
        return PASS;
    }
    verb[n] = '\0';
    if (strncmp(verb, "eio", 3) == 0) {
        return FAIL_EIO;
    }
    if (strncmp(verb, "delay ", 6) == 0) {
        long ms = strtol(verb + 6, NULL, 10);
        if (ms > 0 && ms <= 60000) {
            struct timespec wait = {ms / 1000, (ms % 1000) * 1000000L};
            while (nanosleep(&wait, &wait) != 0 && errno == EINTR) {
            }
        }
    }
    return PASS;
}

typedef int (*fsync_fn)(int);
typedef int (*sync_range_fn)(int, off64_t, off64_t, unsigned int);

/* The next definition of `name` (libc's), looked up once. */
static void *next(void **cache, const char *name) {
    if (*cache == NULL) {
        *cache = dlsym(RTLD_NEXT, name);
    }
    return *cache;
}

/* 0 to go on with the real call; -1 with errno = EIO to fail it. */
static int fault_or_go(void) {
    int saved = errno;
    if (before_sync() == FAIL_EIO) {
        errno = EIO;
        return -1;
    }
    errno = saved;
    return 0;
}

int fsync(int fd) {
    static void *real;
    if (fault_or_go() != 0) {
        return -1;
    }
    return ((fsync_fn)next(&real, "fsync"))(fd);
}

int fdatasync(int fd) {
    static void *real;
    if (fault_or_go() != 0) {
        return -1;
    }
    return ((fsync_fn)next(&real, "fdatasync"))(fd);
}

int sync_file_range(int fd, off64_t offset, off64_t nbytes, unsigned int flags) {
    static void *real;
    if (fault_or_go() != 0) {
        return -1;
    }
    return ((sync_range_fn)next(&real, "sync_file_range"))(fd, offset, nbytes, flags);
}

/* The "free BYTES" limit of the control file, or -1 when there is none. */
static long long free_limit(void) {
    const char *path = getenv("FENCELOCK_DISK_FAULT_FILE");
    if (path == NULL) {
        return -1;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return -1;
    }
    char verb[64];
    ssize_t n = read(fd, verb, sizeof verb - 1);
    close(fd);
    if (n <= 0) {
        return -1;
    }
    verb[n] = '\0';
    if (strncmp(verb, "free ", 5) != 0) {
        return -1;
    }
    long long bytes = strtoll(verb + 5, NULL, 10);
    return bytes < 0 ? -1 : bytes;
}

/* Caps the available and free block counts at the control file's limit
 * (statvfs and statvfs64 have the same fields). */
#define CAP_FREE(st)                                                          \
    do {                                                                      \
        long long limit = free_limit();                                       \
        if (limit >= 0 && (st)->f_frsize != 0) {                              \
            unsigned long long blocks = (unsigned long long)limit / (st)->f_frsize; \
            if ((st)->f_bavail > blocks) {                                    \
                (st)->f_bavail = blocks;                                      \
            }                                                                 \
            if ((st)->f_bfree > blocks) {                                     \
                (st)->f_bfree = blocks;                                       \
            }                                                                 \
        }                                                                     \
    } while (0)

typedef int (*statvfs_fn)(const char *, struct statvfs *);
typedef int (*fstatvfs_fn)(int, struct statvfs *);
typedef int (*statvfs64_fn)(const char *, struct statvfs64 *);
typedef int (*fstatvfs64_fn)(int, struct statvfs64 *);

int statvfs(const char *path, struct statvfs *st) {
    static void *real;
    int rc = ((statvfs_fn)next(&real, "statvfs"))(path, st);
    if (rc == 0) {
        CAP_FREE(st);
    }
    return rc;
}

int fstatvfs(int fd, struct statvfs *st) {
    static void *real;
    int rc = ((fstatvfs_fn)next(&real, "fstatvfs"))(fd, st);
    if (rc == 0) {
        CAP_FREE(st);
    }
    return rc;
}

int statvfs64(const char *path, struct statvfs64 *st) {
    static void *real;
    int rc = ((statvfs64_fn)next(&real, "statvfs64"))(path, st);
    if (rc == 0) {
        CAP_FREE(st);
    }
    return rc;
}

int fstatvfs64(int fd, struct statvfs64 *st) {
    static void *real;
    int rc = ((fstatvfs64_fn)next(&real, "fstatvfs64"))(fd, st);
    if (rc == 0) {
        CAP_FREE(st);
    }
    return rc;
}

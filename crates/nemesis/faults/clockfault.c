/*
 * A clock-fault layer for fault-injection runs (crates/nemesis), built into
 * the same LD_PRELOAD library as diskfault.c. It wraps clock_gettime,
 * gettimeofday and time, and follows the small control file named by
 * FENCELOCK_CLOCK_FAULT_FILE, re-read at most every REFRESH_NS:
 *
 *   absent or empty   every clock reads true time
 *   "step MS"         the wall clock (CLOCK_REALTIME*) reads MS milliseconds
 *                     off true time, ahead or (negative) behind: a step, as
 *                     `date -s` or a broken time server makes
 *   "rate PPM"        every clock, monotonic and wall, runs PPM parts per
 *                     million fast (or, negative, slow) from the moment the
 *                     file says so: drift
 *
 * Both words may appear, on one line or several ("step 4000 rate -5000").
 *
 * Why a preload and not libfaketime or a time namespace: libfaketime is not
 * on the machine image, and time namespaces offset only CLOCK_MONOTONIC and
 * CLOCK_BOOTTIME (never the wall clock, never the rate). The node reads
 * time only through these libc calls (Rust's Instant and SystemTime call
 * clock_gettime), so wrapping them moves exactly the clocks under test.
 *
 * A rate change re-anchors the virtual monotonic clock at the moment of the
 * change, so it never goes backwards; the parameters are published with a
 * sequence lock so that a reader never mixes an old anchor with a new rate.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define NS_PER_S 1000000000LL
/* How often the control file is read again, in true monotonic ns. */
#define REFRESH_NS (20LL * 1000 * 1000)
/* Bounds on what the file may ask for; anything outside is ignored. */
#define MAX_STEP_MS (24LL * 3600 * 1000)
#define MAX_RATE_PPM 500000LL

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);

static clock_gettime_fn real_clock_gettime(void) {
    static clock_gettime_fn real;
    if (real == NULL) {
        real = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
    }
    return real;
}

/* The published parameters (written under `writer`, read via `seq`). */
static unsigned long seq;          /* odd while a writer is changing them */
static int64_t anchor_true_ns;     /* true monotonic time of the last rate change */
static int64_t anchor_virtual_ns;  /* virtual monotonic time at that moment */
static int64_t rate_ppm;           /* drift from the anchor on */
static int64_t step_ns;            /* wall-clock step */
static int64_t next_refresh_ns;    /* true monotonic time of the next read */
static pthread_mutex_t writer = PTHREAD_MUTEX_INITIALIZER;

static int64_t load(int64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
static void store(int64_t *p, int64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }

static int64_t to_ns(const struct timespec *ts) {
    return (int64_t)ts->tv_sec * NS_PER_S + ts->tv_nsec;
}

static void from_ns(int64_t ns, struct timespec *ts) {
    if (ns < 0) {
        ns = 0;
    }
    ts->tv_sec = ns / NS_PER_S;
    ts->tv_nsec = ns % NS_PER_S;
}

static int64_t virtual_at(int64_t true_ns, int64_t a_true, int64_t a_virtual, int64_t ppm) {
    int64_t elapsed = true_ns - a_true;
    /* elapsed * ppm / 1e6 without overflow for runs of many days. */
    int64_t extra = (elapsed / 1000000) * ppm + ((elapsed % 1000000) * ppm) / 1000000;
    return a_virtual + elapsed + extra;
}

/* Reads the control file into *step_ms and *ppm (0 when absent). */
static void read_control(int64_t *step_ms, int64_t *ppm) {
    *step_ms = 0;
    *ppm = 0;
    const char *path = getenv("FENCELOCK_CLOCK_FAULT_FILE");
    if (path == NULL) {
        return;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return;
    }
    char text[128];
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0) {
        return;
    }
    text[n] = '\0';
    const char *at = strstr(text, "step ");
    if (at != NULL) {
        long long v = strtoll(at + 5, NULL, 10);
        if (v >= -MAX_STEP_MS && v <= MAX_STEP_MS) {
            *step_ms = v;
        }
    }
    at = strstr(text, "rate ");
    if (at != NULL) {
        long long v = strtoll(at + 5, NULL, 10);
        if (v >= -MAX_RATE_PPM && v <= MAX_RATE_PPM) {
            *ppm = v;
        }
    }
}

/* Re-reads the control file if it is due; one thread at a time. */
static void maybe_refresh(int64_t true_mono_ns) {
    if (true_mono_ns < load(&next_refresh_ns)) {
        return;
    }
    if (pthread_mutex_trylock(&writer) != 0) {
        return;
    }
    if (true_mono_ns >= load(&next_refresh_ns)) {
        int64_t step_ms, ppm;
        read_control(&step_ms, &ppm);
        int64_t old_ppm = load(&rate_ppm);
        __atomic_add_fetch(&seq, 1, __ATOMIC_ACQ_REL);
        if (ppm != old_ppm) {
            int64_t now_virtual =
                virtual_at(true_mono_ns, load(&anchor_true_ns), load(&anchor_virtual_ns), old_ppm);
            store(&anchor_true_ns, true_mono_ns);
            store(&anchor_virtual_ns, now_virtual);
            store(&rate_ppm, ppm);
        }
        store(&step_ns, step_ms * 1000000);
        store(&next_refresh_ns, true_mono_ns + REFRESH_NS);
        __atomic_add_fetch(&seq, 1, __ATOMIC_ACQ_REL);
    }
    pthread_mutex_unlock(&writer);
}

/* The virtual monotonic time at true monotonic time `true_ns`, and the
 * wall-clock step, read consistently. */
static void params_at(int64_t true_ns, int64_t *virtual_ns, int64_t *step) {
    for (;;) {
        unsigned long before = __atomic_load_n(&seq, __ATOMIC_ACQUIRE);
        if (before & 1) {
            continue;
        }
        int64_t a_true = load(&anchor_true_ns);
        int64_t a_virtual = load(&anchor_virtual_ns);
        int64_t ppm = load(&rate_ppm);
        int64_t s = load(&step_ns);
        if (__atomic_load_n(&seq, __ATOMIC_ACQUIRE) == before) {
            *virtual_ns = ppm == 0 && a_true == a_virtual
                              ? true_ns
                              : virtual_at(true_ns, a_true, a_virtual, ppm);
            *step = s;
            return;
        }
    }
}

static int is_monotonic(clockid_t id) {
    return id == CLOCK_MONOTONIC || id == CLOCK_MONOTONIC_RAW || id == CLOCK_MONOTONIC_COARSE ||
           id == CLOCK_BOOTTIME;
}

static int is_wall(clockid_t id) {
    return id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    clock_gettime_fn real = real_clock_gettime();
    if (!is_monotonic(id) && !is_wall(id)) {
        return real(id, ts);
    }
    struct timespec mono;
    if (real(CLOCK_MONOTONIC, &mono) != 0) {
        return real(id, ts);
    }
    int64_t true_mono = to_ns(&mono);
    maybe_refresh(true_mono);
    int64_t virtual_mono, step;
    params_at(true_mono, &virtual_mono, &step);
    int64_t drift = virtual_mono - true_mono;
    if (is_monotonic(id)) {
        if (id == CLOCK_MONOTONIC) {
            from_ns(virtual_mono, ts);
            return 0;
        }
        int rc = real(id, ts);
        if (rc == 0) {
            from_ns(to_ns(ts) + drift, ts);
        }
        return rc;
    }
    int rc = real(id, ts);
    if (rc == 0) {
        from_ns(to_ns(ts) + drift + step, ts);
    }
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    (void)tz;
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    void *out = tv; /* glibc declares tv nonnull; callers may still pass NULL */
    if (rc == 0 && out != NULL) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) {
        return (time_t)-1;
    }
    if (out != NULL) {
        *out = ts.tv_sec;
    }
    return ts.tv_sec;
}

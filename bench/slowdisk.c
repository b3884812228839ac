/* An LD_PRELOAD shim for a slow disk: fsync and fdatasync sleep TETHER_FSYNC_DELAY_MS first
   (a cloud block device takes 1 to 4 ms; device-mapper delay is not available here).
   Built by bench/slowdisk.py (gcc); used by bench/slowdisk.py and tests/integration/test_slow_disk.py. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static long delay_ns(void) {
    const char *v = getenv("TETHER_FSYNC_DELAY_MS");
    return v ? (long)(atof(v) * 1e6) : 0;
}

static void pause_ns(void) {
    long ns = delay_ns();
    if (ns > 0) {
        struct timespec t = {ns / 1000000000L, ns % 1000000000L};
        nanosleep(&t, NULL);
    }
}

int fsync(int fd) {
    static int (*real)(int) = 0;
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    pause_ns();
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int) = 0;
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    pause_ns();
    return real(fd);
}

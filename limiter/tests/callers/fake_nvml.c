/* A stand-in libnvidia-ml.so.1 with two devices of 80 GiB (10 GiB used), for the limiter's NVML
 * hooks. Device i's UUID is $FAKE_NVML_UUID_<i> (read at every call); unset: NOT_SUPPORTED.
 *
 * nvmlDeviceGetProcessUtilization (for the SM feedback loop), with $FAKE_NVML_SM_SCALE set: the
 * calling process's smUtil on device 0 is SCALE x its true busy share, computed from the launch
 * counter the workload exports (`sm_caller_launches`, sm_caller.c) x $SIMCUDA_LAUNCH_US between
 * two calls, and published one call late (NVML's samples lag). SCALE 0.5 stands for contention
 * (the process gets half its windows), above 1 for a share NVML sees higher. Another process
 * (pid 4000001, 50%) is always listed; $FAKE_NVML_FOREIGN_PID=1 reports the caller under a pid
 * that is not its own (a process in another pid namespace). Unset SCALE: NOT_SUPPORTED.
 * With $SIMCUDA_SHARED_DEVICE (several processes on one simulated device), every process of the
 * device's table is reported instead, from its launch counter there (testing/sim-cuda's
 * shared.rs: words 8 + 2i and 9 + 2i are a pid and its launches), so that the process that runs
 * a container's correction sees its whole container. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define GIB (1024ULL * 1024 * 1024)
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
static int devs[2] = {0, 1};

int nvmlInit_v2(void) { return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) {
    if (i >= 2) return 2;
    *h = &devs[i];
    return 0;
}
int nvmlDeviceGetHandleByUUID(const char *uuid, void **h) {
    for (int i = 0; i < 2; i++) {
        const char *u = getenv(i == 0 ? "FAKE_NVML_UUID_0" : "FAKE_NVML_UUID_1");
        if (u && !strcmp(u, uuid)) {
            *h = &devs[i];
            return 0;
        }
    }
    return 6;
}
int nvmlDeviceGetIndex(void *h, unsigned *i) {
    *i = (unsigned)*(int *)h;
    return 0;
}
int nvmlDeviceGetUUID(void *h, char *buf, unsigned len) {
    const char *u = getenv(*(int *)h == 0 ? "FAKE_NVML_UUID_0" : "FAKE_NVML_UUID_1");
    if (!u) return 3;
    snprintf(buf, len, "%s", u);
    return 0;
}
int nvmlDeviceGetMemoryInfo(void *h, nvmlMemory_t *m) {
    (void)h;
    m->total = 80 * GIB;
    m->used = 10 * GIB;
    m->free = 70 * GIB;
    return 0;
}
int nvmlDeviceGetMemoryInfo_v2(void *h, nvmlMemory_v2_t *m) {
    (void)h;
    m->total = 80 * GIB;
    m->reserved = GIB / 2;
    m->used = 10 * GIB;
    m->free = 70 * GIB - GIB / 2;
    return 0;
}

/* The driver's per-process list: two host processes of other tenants, 1 GiB each, no MIG. */
typedef struct { unsigned pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef struct { unsigned pid; unsigned long long usedGpuMemory; unsigned gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;
#define HOST_PROCS 2
static int host_list(unsigned *count, void *infos, int v1) {
    if (!count) return 2;
    if (*count < HOST_PROCS) {
        *count = HOST_PROCS;
        return 7;
    }
    for (unsigned i = 0; i < HOST_PROCS; i++) {
        if (v1) {
            nvmlProcessInfo_v1_t *p = (nvmlProcessInfo_v1_t *)infos + i;
            p->pid = 4000001 + i;
            p->usedGpuMemory = GIB;
        } else {
            nvmlProcessInfo_t *p = (nvmlProcessInfo_t *)infos + i;
            p->pid = 4000001 + i;
            p->usedGpuMemory = GIB;
            p->gpuInstanceId = 0xFFFFFFFFu;
            p->computeInstanceId = 0xFFFFFFFFu;
        }
    }
    *count = HOST_PROCS;
    return 0;
}
int nvmlDeviceGetComputeRunningProcesses(void *h, unsigned *count, nvmlProcessInfo_v1_t *infos) {
    (void)h;
    return host_list(count, infos, 1);
}
int nvmlDeviceGetComputeRunningProcesses_v2(void *h, unsigned *count, nvmlProcessInfo_t *infos) {
    (void)h;
    return host_list(count, infos, 0);
}
int nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned *count, nvmlProcessInfo_t *infos) {
    (void)h;
    return host_list(count, infos, 0);
}

typedef struct {
    unsigned pid;
    unsigned long long timeStamp;
    unsigned smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;
static unsigned long long prev_us, pending_us;
static long prev_launches;
static unsigned pending_util;
static unsigned long long realtime_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (unsigned long long)t.tv_sec * 1000000ULL + (unsigned long long)t.tv_nsec / 1000;
}

/* The shared simulated device's process table, per entry: pid, launches at the previous call,
 * and the sample to publish at the next call. */
#define SHARED_PROCS 64
static volatile unsigned long long *shared_words;
static long shared_prev[SHARED_PROCS];
static unsigned shared_pid[SHARED_PROCS], shared_util[SHARED_PROCS];
static unsigned long long shared_prev_us, shared_pending_us;

static int shared_device(void) {
    const char *path = getenv("SIMCUDA_SHARED_DEVICE");
    if (!path) return 0;
    if (!shared_words) {
        int fd = open(path, O_RDONLY);
        if (fd < 0) return 0;
        void *p = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        if (p == MAP_FAILED) return 0;
        shared_words = p;
    }
    return 1;
}

static int shared_samples(nvmlProcessUtilizationSample_t *samples, unsigned *count, unsigned long long last_seen,
                          double scale, double launch_us) {
    unsigned n = 1;
    int ours = shared_pending_us > last_seen;
    if (ours)
        for (int i = 0; i < SHARED_PROCS; i++) n += shared_pid[i] != 0;
    if (!samples) {
        *count = n;
        return 0;
    }
    if (*count < n) {
        *count = n;
        return 7;
    }
    unsigned long long now = realtime_us();
    unsigned k = 0;
    samples[k++] = (nvmlProcessUtilizationSample_t){4000001, now, 50, 0, 0, 0};
    if (ours)
        for (int i = 0; i < SHARED_PROCS; i++)
            if (shared_pid[i]) samples[k++] = (nvmlProcessUtilizationSample_t){shared_pid[i], shared_pending_us, shared_util[i], 0, 0, 0};
    *count = k;
    /* The next samples: each process's share since the previous call. */
    for (int i = 0; i < SHARED_PROCS; i++) {
        unsigned pid = (unsigned)__atomic_load_n(&shared_words[8 + 2 * i], __ATOMIC_ACQUIRE);
        long launches = (long)__atomic_load_n(&shared_words[9 + 2 * i], __ATOMIC_ACQUIRE);
        shared_pid[i] = 0;
        if (pid && shared_prev_us && now > shared_prev_us && launches >= shared_prev[i]) {
            double util = (double)(launches - shared_prev[i]) * launch_us / (double)(now - shared_prev_us) * scale * 100.0;
            shared_pid[i] = pid;
            shared_util[i] = util > 100.0 ? 100 : (unsigned)(util + 0.5);
        }
        shared_prev[i] = launches;
    }
    if (shared_prev_us) shared_pending_us = now;
    shared_prev_us = now;
    return 0;
}

int nvmlDeviceGetProcessUtilization(void *h, nvmlProcessUtilizationSample_t *samples, unsigned *count,
                                    unsigned long long last_seen) {
    const char *scale = getenv("FAKE_NVML_SM_SCALE");
    const char *launch_us = getenv("SIMCUDA_LAUNCH_US");
    if (!scale || !launch_us) return 3;
    if (!count) return 2;
    if (*(int *)h == 0 && shared_device()) return shared_samples(samples, count, last_seen, atof(scale), atof(launch_us));
    int ours = *(int *)h == 0 && pending_us > last_seen;
    unsigned n = 1 + (unsigned)ours;
    if (!samples) {
        *count = n;
        return 0;
    }
    if (*count < n) {
        *count = n;
        return 7;
    }
    unsigned long long now = realtime_us();
    samples[0] = (nvmlProcessUtilizationSample_t){4000001, now, 50, 0, 0, 0};
    if (ours) {
        unsigned pid = (unsigned)getpid();
        const char *foreign = getenv("FAKE_NVML_FOREIGN_PID");
        if (foreign && !strcmp(foreign, "1")) pid += 1000000;
        samples[1] = (nvmlProcessUtilizationSample_t){pid, pending_us, pending_util, 0, 0, 0};
    }
    *count = n;
    /* The next sample: this process's share since the previous call (device 0 only). */
    if (*(int *)h == 0) {
        long *counter = (long *)dlsym(RTLD_DEFAULT, "sm_caller_launches");
        long launches = counter ? __atomic_load_n(counter, __ATOMIC_RELAXED) : 0;
        if (prev_us && now > prev_us) {
            double share = (double)(launches - prev_launches) * atof(launch_us) / (double)(now - prev_us);
            double util = share * atof(scale) * 100.0;
            pending_util = util > 100.0 ? 100 : (unsigned)(util + 0.5);
            pending_us = now;
        }
        prev_us = now;
        prev_launches = launches;
    }
    return 0;
}

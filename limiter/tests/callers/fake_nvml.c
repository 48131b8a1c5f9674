/* A stand-in libnvidia-ml.so.1 with two devices of 80 GiB (10 GiB used), for the limiter's NVML
 * hooks. Device i's UUID is $FAKE_NVML_UUID_<i> (read at every call); unset: NOT_SUPPORTED. */
#include <stdio.h>
#include <stdlib.h>

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

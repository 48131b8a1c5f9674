/* Memory figures under CUDA_DEVICE_MEMORY_LIMIT with a context charge (VGPU_CONTEXT_BYTES),
 * against the simulated driver. Usage: memory_figures retain|create_v2|create_v3|create_v4 [NVML]
 * Makes a context the given way (cuDevicePrimaryCtxRetain is what the runtime API does at its
 * initialisation), then prints one JSON line: cuMemGetInfo's free and total right after, NVML's
 * free and used when NVML is given (its device 0 gets CUDA device 0's UUID), the bytes then
 * allocatable in 2 MiB allocations until the first refusal and that refusal's code, and
 * cuMemGetInfo's free once all of it is freed again. Then waits for stdin to close (so the test
 * can read the region before the process retires its slot). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(void **, int);
CUresult cuCtxCreate_v2(void **, unsigned, int);
CUresult cuCtxCreate_v3(void **, void *, int, unsigned, int);
CUresult cuCtxCreate_v4(void **, void *, unsigned, int);
CUresult cuCtxSetCurrent(void *);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuDeviceGetUuid_v2(unsigned char *, int);

#define CHUNK (2ULL << 20)
#define MAX_CHUNKS 65536
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;

static CUdeviceptr chunks[MAX_CHUNKS];

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    const char *how = argv[1];
    void *ctx = NULL;
    CUresult r = cuInit(0);
    if (!r && !strcmp(how, "retain")) r = cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx);
    else if (!r && !strcmp(how, "create_v2")) r = cuCtxCreate_v2(&ctx, 0, 0);
    else if (!r && !strcmp(how, "create_v3")) r = cuCtxCreate_v3(&ctx, NULL, 0, 0, 0);
    else if (!r && !strcmp(how, "create_v4")) r = cuCtxCreate_v4(&ctx, NULL, 0, 0);
    if (r) {
        printf("FAIL: making a context (%s): %d\n", how, r);
        return 1;
    }
    long long nvml_free = -1, nvml_used = -1;
    if (argc > 2) {
        unsigned char u[16];
        char s[64];
        cuDeviceGetUuid_v2(u, 0);
        snprintf(s, sizeof s, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
                 u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
        setenv("FAKE_NVML_UUID_0", s, 1);
        void *lib = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
        int (*init)(void) = lib ? (int (*)(void))dlsym(lib, "nvmlInit_v2") : NULL;
        int (*handle)(unsigned, void **) = lib ? (int (*)(unsigned, void **))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2") : NULL;
        int (*mem)(void *, nvmlMemory_t *) = lib ? (int (*)(void *, nvmlMemory_t *))dlsym(lib, "nvmlDeviceGetMemoryInfo") : NULL;
        void *h;
        nvmlMemory_t m;
        if (!init || !handle || !mem || init() || handle(0, &h) || mem(h, &m)) {
            printf("FAIL: NVML %s\n", argv[2]);
            return 1;
        }
        nvml_free = (long long)m.free;
        nvml_used = (long long)m.used;
    }
    size_t free0 = 0, total = 0, free1 = 0;
    if (cuMemGetInfo_v2(&free0, &total)) {
        printf("FAIL: cuMemGetInfo\n");
        return 1;
    }
    unsigned long long allocatable = 0;
    int n = 0;
    CUresult refusal = 0;
    while (n < MAX_CHUNKS) {
        refusal = cuMemAlloc_v2(&chunks[n], CHUNK);
        if (refusal) break;
        allocatable += CHUNK;
        n++;
    }
    for (int i = 0; i < n; i++) cuMemFree_v2(chunks[i]);
    cuMemGetInfo_v2(&free1, &total);
    printf("{\"how\":\"%s\",\"free\":%zu,\"total\":%zu,\"nvml_free\":%lld,\"nvml_used\":%lld,\"allocatable\":%llu,"
           "\"refusal\":%d,\"free_after\":%zu}\n",
           how, free0, total, nvml_free, nvml_used, allocatable, refusal, free1);
    fflush(stdout);
    char buf[64];
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}

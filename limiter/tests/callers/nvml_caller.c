/* NVML through the limiter: dlopen(NVML) + dlsym of each function, as pynvml does. Usage:
 *   nvml_caller before NVML    no cuInit: the NVML index is the CUDA ordinal (limit of device 0: 1 GiB)
 *   nvml_caller mapped NVML    cuInit, fake NVML devices get the CUDA UUIDs in swapped order, 64 MiB
 *                              allocated on CUDA device 0: NVML device 1 shows it under 1 GiB
 *   nvml_caller real NVML      the real library without a GPU: calls fail, nothing crashes
 * Prints ok:/FAIL: per check; exits 1 on failure. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned);
CUresult cuDeviceGetUuid_v2(unsigned char *, int);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);

#define MIB (1024ULL * 1024)
#define GIB (1024 * MIB)
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef int (*init_t)(void);
typedef int (*handle_t)(unsigned, void **);
typedef int (*mem_t)(void *, nvmlMemory_t *);
typedef int (*mem2_t)(void *, nvmlMemory_v2_t *);

static int failures;
#define CHECK(cond, ...)                                                                             \
    do {                                                                                             \
        int ok_ = (cond);                                                                            \
        printf(ok_ ? "ok: " : "FAIL: ");                                                             \
        printf(__VA_ARGS__);                                                                         \
        printf("\n");                                                                                \
        if (!ok_) failures++;                                                                        \
    } while (0)

static void uuid_env(int cuda, const char *var) {
    unsigned char u[16];
    char s[64];
    cuDeviceGetUuid_v2(u, cuda);
    snprintf(s, sizeof s, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
             u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    setenv(var, s, 1);
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    void *lib = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    CHECK(lib != NULL, "dlopen %s", argv[2]);
    if (!lib) return 1;
    init_t init = (init_t)dlsym(lib, "nvmlInit_v2");
    handle_t handle = (handle_t)dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    mem_t mem = (mem_t)dlsym(lib, "nvmlDeviceGetMemoryInfo");
    mem2_t mem2 = (mem2_t)dlsym(lib, "nvmlDeviceGetMemoryInfo_v2");
    Dl_info i;
    CHECK(mem && dladdr((void *)mem, &i) && strstr(i.dli_fname, "vgpu_limiter"),
          "dlsym(nvml handle, nvmlDeviceGetMemoryInfo) is the limiter's hook");
    if (!strcmp(argv[1], "real")) {
        nvmlMemory_t m;
        int r = init();
        int q = mem(NULL, &m);
        CHECK(q != 0, "real NVML without a GPU: init %d, memory info %d, no crash", r, q);
        return failures;
    }
    void *h0, *h1;
    CHECK(init() == 0 && handle(0, &h0) == 0 && handle(1, &h1) == 0, "fake NVML: two handles");
    nvmlMemory_t m;
    nvmlMemory_v2_t m2 = {.version = 0x2000028};
    if (!strcmp(argv[1], "before")) {
        CHECK(mem(h0, &m) == 0 && m.total == GIB && m.used == 0 && m.free == GIB,
              "before cuInit: NVML index 0 = CUDA 0: total %llu used %llu free %llu", m.total, m.used, m.free);
        CHECK(mem(h1, &m) == 0 && m.total == 2 * GIB, "before cuInit: NVML index 1 = CUDA 1: total %llu", m.total);
        return failures;
    }
    CHECK(cuInit(0) == 0, "cuInit");
    uuid_env(1, "FAKE_NVML_UUID_0");
    uuid_env(0, "FAKE_NVML_UUID_1");
    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, 64 * MIB) == 0, "64 MiB on CUDA device 0");
    CHECK(mem(h1, &m) == 0 && m.total == GIB && m.used == 64 * MIB && m.free == GIB - 64 * MIB,
          "NVML device 1 is CUDA device 0 by UUID: total %llu used %llu free %llu", m.total, m.used, m.free);
    CHECK(mem2(h1, &m2) == 0 && m2.total == GIB && m2.used == 64 * MIB && m2.free == GIB - 64 * MIB &&
              m2.version == 0x2000028 && m2.reserved == GIB / 2,
          "v2 likewise, version and reserved kept: total %llu used %llu free %llu", m2.total, m2.used, m2.free);
    CHECK(mem(h0, &m) == 0 && m.total == 2 * GIB && m.used == 0, "NVML device 0 is CUDA device 1: total %llu used %llu",
          m.total, m.used);
    return failures;
}

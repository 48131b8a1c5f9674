/* NVML through the limiter: dlopen(NVML) + dlsym of each function, as pynvml does. Usage:
 *   nvml_caller before NVML    no cuInit: the NVML index is the CUDA ordinal (limit of device 0: 1 GiB)
 *   nvml_caller mapped NVML    cuInit, fake NVML devices get the CUDA UUIDs in swapped order, 64 MiB
 *                              allocated on CUDA device 0: NVML device 1 shows it under 1 GiB
 *                              a forked child holds 32 MiB more: the per-process lists (v1, v2,
 *                              v3) show the two container processes, not the driver's host list
 *   nvml_caller real NVML      the real library without a GPU: calls fail, nothing crashes
 * Prints ok:/FAIL: per check; exits 1 on failure. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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
typedef struct { unsigned pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef struct { unsigned pid; unsigned long long usedGpuMemory; unsigned gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;
typedef int (*procs1_t)(void *, unsigned *, nvmlProcessInfo_v1_t *);
typedef int (*procs_t)(void *, unsigned *, nvmlProcessInfo_t *);

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

/* A forked child of the container holds 32 MiB on CUDA device 0 while the lists are read. */
static int process_lists(void *lib, void *h0, void *h1) {
    procs1_t p1 = (procs1_t)dlsym(lib, "nvmlDeviceGetComputeRunningProcesses");
    procs_t p2 = (procs_t)dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v2");
    procs_t p3 = (procs_t)dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3");
    CHECK(p1 && p2 && p3, "the three list functions resolve");
    if (!p1 || !p2 || !p3) return 1;
    alarm(60); /* a hang fails the test instead of stalling it */
    int ready[2], hold[2];
    if (pipe(ready) || pipe(hold)) return 1;
    pid_t child = fork();
    if (child == 0) {
        close(hold[1]); /* else the child's own copy keeps the pipe open: no EOF, no exit */
        CUdeviceptr q;
        char c = cuMemAlloc_v2(&q, 32 * MIB) == 0 ? 'y' : 'n';
        if (write(ready[1], &c, 1) != 1) _exit(3);
        while (read(hold[0], &c, 1) > 0) {
        }
        _exit(0);
    }
    close(hold[0]);
    char c = 0;
    CHECK(read(ready[0], &c, 1) == 1 && c == 'y', "the child allocated 32 MiB");
    unsigned me = (unsigned)getpid(), kid = (unsigned)child;

    unsigned n = 0;
    int r = p1(h1, &n, NULL);
    CHECK(r == 7 && n == 2, "v1 with no room: INSUFFICIENT_SIZE and 2 needed (got %d, %u)", r, n);
    nvmlProcessInfo_v1_t l1[8];
    n = 8;
    r = p1(h1, &n, l1);
    int seen = 0;
    for (unsigned i = 0; r == 0 && i < n; i++) {
        if (l1[i].pid == me && l1[i].usedGpuMemory == 64 * MIB) seen |= 1;
        if (l1[i].pid == kid && l1[i].usedGpuMemory == 32 * MIB) seen |= 2;
    }
    CHECK(r == 0 && n == 2 && seen == 3, "v1 lists this process (64 MiB) and the child (32 MiB), no host pids (%d, %u)", r,
          n);
    procs_t v[2] = {p2, p3};
    for (int k = 0; k < 2; k++) {
        nvmlProcessInfo_t l[8];
        n = 8;
        r = v[k](h1, &n, l);
        seen = 0;
        for (unsigned i = 0; r == 0 && i < n; i++) {
            int mig = l[i].gpuInstanceId == 0xFFFFFFFFu && l[i].computeInstanceId == 0xFFFFFFFFu;
            if (l[i].pid == me && l[i].usedGpuMemory == 64 * MIB && mig) seen |= 1;
            if (l[i].pid == kid && l[i].usedGpuMemory == 32 * MIB && mig) seen |= 2;
        }
        CHECK(r == 0 && n == 2 && seen == 3, "v%d lists the two container processes with the driver's instance ids", k + 2);
    }
    n = 8;
    nvmlProcessInfo_t l[8];
    r = p2(h0, &n, l);
    CHECK(r == 0 && n == 0, "a limited device the container does not use lists nobody (%d, %u)", r, n);
    close(hold[1]);
    int status = 0;
    waitpid(child, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child exited");
    n = 8;
    r = p2(h1, &n, l);
    CHECK(r == 0 && n == 1 && l[0].pid == me, "after the child exited only this process is listed (%d, %u)", r, n);
    return failures;
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
    return failures + process_lists(lib, h0, h1);
}

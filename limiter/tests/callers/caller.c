/* Reaches the limiter's hooks by every path a program uses, against the simulated driver, with
 * CUDA_DEVICE_MEMORY_LIMIT=1g. Usage: caller direct|dlsym|procaddress|config|race.
 * Prints "ok: ..." or "FAIL: ..." per check and exits 1 if any check failed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
#define MIB (1024ULL * 1024)
#define GIB (1024 * MIB)
#define PER_THREAD_DEFAULT_STREAM 2ULL

typedef CUresult (*init_t)(unsigned);
typedef CUresult (*getinfo_t)(size_t *, size_t *);
typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*free_t)(CUdeviceptr);
typedef CUresult (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             void *, void **, void **);
typedef CUresult (*gpa_t)(const char *, void **, int, unsigned long long);
typedef CUresult (*gpa2_t)(const char *, void **, int, unsigned long long, int *);

static int failures;
#define CHECK(cond, ...)                                                                             \
    do {                                                                                             \
        int ok_ = (cond);                                                                            \
        printf(ok_ ? "ok: " : "FAIL: ");                                                             \
        printf(__VA_ARGS__);                                                                         \
        printf("\n");                                                                                \
        if (!ok_) failures++;                                                                        \
    } while (0)

/* Whether p is inside the limiter. */
static int in_limiter(void *p) {
    Dl_info i;
    return p && dladdr(p, &i) && i.dli_fname && strstr(i.dli_fname, "vgpu_limiter");
}

/* Whether p is exactly the exported symbol `name` (of whichever object). */
static int is_symbol(void *p, const char *name) {
    Dl_info i;
    return p && dladdr(p, &i) && i.dli_sname && i.dli_saddr == p && !strcmp(i.dli_sname, name);
}

struct api {
    init_t init;
    getinfo_t getinfo;
    alloc_t alloc;
    free_t free;
};

/* Observable only through the limiter: the sim has 80 GiB and no limit. */
static void exercise(struct api a, const char *path) {
    CHECK(a.init(0) == 0, "%s: cuInit", path);
    size_t fr = 0, total = 0;
    CHECK(a.getinfo(&fr, &total) == 0 && total == GIB && fr == GIB,
          "%s: cuMemGetInfo_v2 reports the limit (free %zu, total %zu)", path, fr, total);
    CUdeviceptr p = 0, q = 0;
    CHECK(a.alloc(&p, 2 * GIB) == 2, "%s: 2 GiB over a 1 GiB limit is CUDA_ERROR_OUT_OF_MEMORY", path);
    CHECK(a.alloc(&p, 600 * MIB) == 0, "%s: 600 MiB fits", path);
    CHECK(a.alloc(&q, 600 * MIB) == 2, "%s: a second 600 MiB is denied", path);
    CHECK(a.getinfo(&fr, &total) == 0 && fr == GIB - 600 * MIB, "%s: free is limit - used (%zu)", path, fr);
    CHECK(a.free(p) == 0, "%s: cuMemFree_v2", path);
    CHECK(a.alloc(&q, 600 * MIB) == 0, "%s: after the free 600 MiB fits again", path);
    CHECK(a.free(q) == 0, "%s: cuMemFree_v2 again", path);
}

extern CUresult cuInit(unsigned);
extern CUresult cuMemGetInfo_v2(size_t *, size_t *);
extern CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
extern CUresult cuMemFree_v2(CUdeviceptr);
extern CUresult cuLaunchKernel_ptsz(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                    unsigned, void *, void **, void **);

static void direct(void) {
    CHECK(in_limiter((void *)cuMemAlloc_v2), "direct: cuMemAlloc_v2 binds to the limiter");
    CHECK(in_limiter((void *)cuLaunchKernel_ptsz), "direct: cuLaunchKernel_ptsz binds to the limiter");
    exercise((struct api){cuInit, cuMemGetInfo_v2, cuMemAlloc_v2, cuMemFree_v2}, "direct");
    cuLaunchKernel_ptsz(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
}

static void *must(void *h, const char *name) {
    void *p = dlsym(h, name);
    if (!p) {
        printf("FAIL: dlsym(%s): %s\n", name, dlerror());
        exit(1);
    }
    return p;
}

static void via_dlsym(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL, "dlsym: dlopen libcuda.so.1");
    const char *hooked[] = {"cuInit", "cuMemAlloc_v2", "cuMemFree_v2", "cuMemGetInfo_v2", "cuLaunchKernel",
                            "cuLaunchKernel_ptsz", "cuGetProcAddress", "cuGetProcAddress_v2", "cuMemCreate",
                            "cuGraphLaunch_ptsz", "cuMemAllocAsync_ptsz"};
    for (size_t i = 0; i < sizeof hooked / sizeof *hooked; i++) {
        void *p = dlsym(h, hooked[i]);
        CHECK(in_limiter(p) && is_symbol(p, hooked[i]), "dlsym: dlsym(libcuda, %s) is the limiter's hook", hooked[i]);
    }
    void *other = dlsym(h, "cuDeviceGetCount");
    CHECK(other && !in_limiter(other), "dlsym: an unhooked name resolves in the driver");
    CHECK(dlsym(h, "no_such_symbol") == NULL, "dlsym: a missing name is still NULL");
    CHECK(in_limiter(dlsym(RTLD_DEFAULT, "cuMemAlloc_v2")), "dlsym: RTLD_DEFAULT gets the hook");
    /* RTLD_NEXT is relative to the caller: from this program, the next `dlsym` is the limiter's own
     * export. Had the override forwarded with a normal call, glibc would see the limiter as the
     * caller and answer with libc's dlsym. */
    CHECK(in_limiter(dlsym(RTLD_NEXT, "dlsym")), "dlsym: RTLD_NEXT keeps the caller's identity");
    CHECK(dlsym(RTLD_NEXT, "getpid") == dlsym(RTLD_DEFAULT, "getpid"), "dlsym: RTLD_NEXT of a libc name");
    exercise((struct api){(init_t)must(h, "cuInit"), (getinfo_t)must(h, "cuMemGetInfo_v2"),
                          (alloc_t)must(h, "cuMemAlloc_v2"), (free_t)must(h, "cuMemFree_v2")},
             "dlsym");
}

static void *proc(gpa2_t gpa2, const char *name, int version, unsigned long long flags) {
    void *p = NULL;
    int status = -1;
    CUresult r = gpa2(name, &p, version, flags, &status);
    CHECK(r == 0 && status == 0, "procaddress: cuGetProcAddress_v2(%s, %d, %llu) succeeds", name, version, flags);
    return p;
}

static void via_procaddress(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    gpa2_t gpa2 = (gpa2_t)must(h, "cuGetProcAddress_v2");
    CHECK(in_limiter((void *)gpa2), "procaddress: cuGetProcAddress_v2 is hooked");
    struct {
        const char *name;
        int version;
        unsigned long long flags;
        const char *expect;
        int hooked;
    } cases[] = {
        {"cuMemAlloc", 12000, 0, "cuMemAlloc_v2", 1},
        {"cuMemGetInfo", 11000, 0, "cuMemGetInfo_v2", 1},
        {"cuLaunchKernel", 12000, 0, "cuLaunchKernel", 1},
        {"cuLaunchKernel", 12000, PER_THREAD_DEFAULT_STREAM, "cuLaunchKernel_ptsz", 1},
        {"cuMemAllocAsync", 12000, PER_THREAD_DEFAULT_STREAM, "cuMemAllocAsync_ptsz", 1},
        {"cuGraphLaunch", 12000, PER_THREAD_DEFAULT_STREAM, "cuGraphLaunch_ptsz", 1},
        {"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2", 1},
        {"cuGetProcAddress", 11030, 0, "cuGetProcAddress", 1},
        {"cuDeviceGetCount", 12000, 0, "cuDeviceGetCount", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        void *p = proc(gpa2, cases[i].name, cases[i].version, cases[i].flags);
        CHECK(is_symbol(p, cases[i].expect) && in_limiter(p) == cases[i].hooked,
              "procaddress: %s (version %d, flags %llu) -> %s%s", cases[i].name, cases[i].version,
              cases[i].flags, cases[i].hooked ? "the limiter's " : "the driver's ", cases[i].expect);
    }
    /* The legacy entry point handed out for cuGetProcAddress keeps lookups hooked. */
    gpa_t gpa = (gpa_t)proc(gpa2, "cuGetProcAddress", 11030, 0);
    void *p = NULL;
    CHECK(gpa("cuMemFree", &p, 11030, 0) == 0 && in_limiter(p) && is_symbol(p, "cuMemFree_v2"),
          "procaddress: legacy cuGetProcAddress(cuMemFree) -> the limiter's cuMemFree_v2");
    launch_t ptsz = (launch_t)proc(gpa2, "cuLaunchKernel", 12000, PER_THREAD_DEFAULT_STREAM);
    exercise((struct api){(init_t)proc(gpa2, "cuInit", 12000, 0), (getinfo_t)proc(gpa2, "cuMemGetInfo", 12000, 0),
                          (alloc_t)proc(gpa2, "cuMemAlloc", 12000, 0), (free_t)proc(gpa2, "cuMemFree", 12000, 0)},
             "procaddress");
    ptsz(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
}

static void config_error(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    init_t init = (init_t)must(h, "cuInit");
    alloc_t alloc = (alloc_t)must(h, "cuMemAlloc_v2");
    CUdeviceptr p;
    CHECK(init(0) == 3, "config: cuInit fails with CUDA_ERROR_NOT_INITIALIZED");
    CHECK(init(0) == 3, "config: and again");
    CHECK(alloc(&p, MIB) == 3, "config: cuMemAlloc_v2 fails with CUDA_ERROR_NOT_INITIALIZED");
}

#define THREADS 16
#define BLOCK (64 * MIB)
static alloc_t race_alloc;
static pthread_barrier_t race_start;
static void *racer(void *arg) {
    unsigned long long n = 0;
    CUdeviceptr p;
    (void)arg;
    pthread_barrier_wait(&race_start);
    while (race_alloc(&p, BLOCK) == 0) n++;
    return (void *)(unsigned long)n;
}

static void race(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    ((init_t)must(h, "cuInit"))(0);
    race_alloc = (alloc_t)must(h, "cuMemAlloc_v2");
    pthread_t t[THREADS];
    pthread_barrier_init(&race_start, NULL, THREADS);
    for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, racer, NULL);
    unsigned long long blocks = 0;
    for (int i = 0; i < THREADS; i++) {
        void *n;
        pthread_join(t[i], &n);
        blocks += (unsigned long)n;
    }
    CHECK(blocks * BLOCK == GIB, "race: %d threads got exactly the limit (%llu blocks of 64 MiB)", THREADS, blocks);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "direct")) direct();
    else if (!strcmp(mode, "dlsym")) via_dlsym();
    else if (!strcmp(mode, "procaddress")) via_procaddress();
    else if (!strcmp(mode, "config")) config_error();
    else if (!strcmp(mode, "race")) race();
    else {
        fprintf(stderr, "usage: caller direct|dlsym|procaddress|config|race\n");
        return 2;
    }
    return failures ? 1 : 0;
}

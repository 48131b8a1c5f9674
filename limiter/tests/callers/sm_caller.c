/* A saturating launch workload for the SM controller, against the simulated driver.
 * Usage: sm_caller MODE THREADS WARM_MS MEASURE_MS SYNC_EVERY
 *   MODE: kernel | kernel_ptsz | ex | coop | graph
 * Each thread launches without pause and calls cuCtxSynchronize every SYNC_EVERY launches (a
 * training loop's per-step synchronisation). The main thread counts the launches made between
 * WARM_MS and WARM_MS + MEASURE_MS. Prints one JSON line, then waits for stdin to close (so the
 * test can read the region before the process retires its slot).
 * blocked_ns: time inside launch calls beyond the fastest launch seen, summed over all launches
 * (the sim's launches return at once, so this is the time the limiter held launches back).
 * in_launch_ns: all the time inside launch calls (what any hold the limiter records is part of). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef struct {
    unsigned grid[3], block[3], shared_mem;
    void *stream, *attrs;
    unsigned num_attrs;
} CUlaunchConfig;

CUresult cuInit(unsigned);
CUresult cuModuleLoadData(void **, const void *);
CUresult cuModuleGetFunction(void **, void *, const char *);
CUresult cuCtxSynchronize(void);
CUresult cuDevicePrimaryCtxRetain(void **, int);
CUresult cuCtxSetCurrent(void *);
CUresult cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                        void **, void **);
CUresult cuLaunchKernel_ptsz(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             void *, void **, void **);
CUresult cuLaunchKernelEx(const CUlaunchConfig *, void *, void **, void **);
CUresult cuLaunchCooperativeKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   void *, void **);
CUresult cuGraphCreate(void **, unsigned);
CUresult cuGraphInstantiateWithFlags(void **, void *, unsigned long long);
CUresult cuGraphLaunch(void *, void *);

static const char *mode;
static void *func, *exec, *ctx;
static long sync_every;
static atomic_long errors;
/* Exported (the caller is linked with -rdynamic): the stand-in NVML reads it (fake_nvml.c). */
atomic_long sm_caller_launches;
static atomic_long blocked_total, in_launch_total, min_launch = 1L << 62;
static atomic_int stop;

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static CUresult launch_once(void) {
    if (!strcmp(mode, "kernel")) return cuLaunchKernel(func, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    if (!strcmp(mode, "kernel_ptsz")) return cuLaunchKernel_ptsz(func, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    if (!strcmp(mode, "coop")) return cuLaunchCooperativeKernel(func, 1, 1, 1, 1, 1, 1, 0, NULL, NULL);
    if (!strcmp(mode, "graph")) return cuGraphLaunch(exec, NULL);
    CUlaunchConfig c = {{1, 1, 1}, {1, 1, 1}, 0, NULL, NULL, 0};
    return cuLaunchKernelEx(&c, func, NULL, NULL);
}

static void *worker(void *arg) {
    (void)arg;
    long durations = 0, fastest = 1L << 62, n = 0;
    if (cuCtxSetCurrent(ctx)) atomic_fetch_add(&errors, 1);
    while (!atomic_load(&stop)) {
        long t0 = now_ns();
        CUresult r = launch_once();
        long dt = now_ns() - t0;
        if (r) atomic_fetch_add(&errors, 1);
        atomic_fetch_add(&sm_caller_launches, 1);
        if (dt < fastest) fastest = dt;
        durations += dt;
        n++;
        if (n % sync_every == 0) cuCtxSynchronize();
    }
    cuCtxSynchronize();
    /* Time beyond the fastest launch: what was held back. */
    long fl = atomic_load(&min_launch);
    while (fastest < fl && !atomic_compare_exchange_weak(&min_launch, &fl, fastest)) {
    }
    atomic_fetch_add(&blocked_total, durations - n * fastest);
    atomic_fetch_add(&in_launch_total, durations);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: sm_caller MODE THREADS WARM_MS MEASURE_MS SYNC_EVERY\n");
        return 2;
    }
    mode = argv[1];
    int threads = atoi(argv[2]);
    long warm = atol(argv[3]) * 1000000L, measure = atol(argv[4]) * 1000000L;
    sync_every = atol(argv[5]);
    void *mod = NULL;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) || cuModuleLoadData(&mod, "simcuda") || cuModuleGetFunction(&func, mod, "kernel")) {
        printf("FAIL: setup\n");
        return 1;
    }
    void *graph = NULL;
    if (cuGraphCreate(&graph, 0) || cuGraphInstantiateWithFlags(&exec, graph, 0)) {
        printf("FAIL: graph setup\n");
        return 1;
    }
    pthread_t t[64];
    if (threads < 1 || threads > 64) return 2;
    long start = now_ns();
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, NULL);
    struct timespec w = {warm / 1000000000L, warm % 1000000000L};
    nanosleep(&w, NULL);
    long l0 = atomic_load(&sm_caller_launches), t0 = now_ns();
    struct timespec m = {measure / 1000000000L, measure % 1000000000L};
    nanosleep(&m, NULL);
    long l1 = atomic_load(&sm_caller_launches), t1 = now_ns();
    atomic_store(&stop, 1);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    long end = now_ns();
    printf("{\"mode\":\"%s\",\"threads\":%d,\"launches\":%ld,\"errors\":%ld,\"measured_launches\":%ld,"
           "\"measured_ns\":%ld,\"wall_ns\":%ld,\"blocked_ns\":%ld,\"in_launch_ns\":%ld,\"min_launch_ns\":%ld}\n",
           mode, threads, atomic_load(&sm_caller_launches), atomic_load(&errors), l1 - l0, t1 - t0, end - start,
           atomic_load(&blocked_total), atomic_load(&in_launch_total), atomic_load(&min_launch));
    fflush(stdout);
    char buf[64];
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}

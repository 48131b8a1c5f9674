/* A tenant for the in-process freeze (linked with -lcuda, run under the limiter with
 * VGPU_FREEZE_IN_PROCESS=1). Usage:
 *   freeze_caller MIB...   in a context of its own, cuMemAlloc_v2 of each size (MiB), a pattern
 *                          of 64-bit words copied in (every page of an allocation up to 64 MiB;
 *                          of a larger one, its first and last 2 MiB and every 61st page: the
 *                          rest stays zero), then "ready"; per stdin line "check": every
 *                          allocation copied back (the call thaws a frozen process) and compared
 *                          word for word, "intact <corrupted words> <failed calls>"; stdin EOF:
 *                          frees everything and exits. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
#define MIB (1024ULL * 1024)
#define PAGE 4096ULL
#define SLICE (64 * MIB)

CUresult cuInit(unsigned);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, int);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);

static uint64_t word(int alloc, uint64_t i) {
    return ((uint64_t)(alloc + 1) << 56) ^ (i * 0x9E3779B97F4A7C15ULL) ^ 0x5a5aULL;
}

/* Whether page `p` of an allocation of `size` bytes holds the pattern. */
static int patterned(uint64_t size, uint64_t p) {
    uint64_t pages = size / PAGE, edge = 2 * MIB / PAGE;
    return size <= SLICE || p % 61 == 0 || p < edge || p >= pages - edge;
}

int main(int argc, char **argv) {
    int n = argc - 1;
    CUdeviceptr *ptr = calloc(n, sizeof *ptr);
    uint64_t *size = calloc(n, sizeof *size);
    uint64_t *buf = malloc(SLICE);
    CUcontext ctx;
    if (!ptr || !size || !buf || cuInit(0) || cuCtxCreate_v2(&ctx, 0, 0)) {
        printf("FAIL: setup\n");
        return 1;
    }
    for (int a = 0; a < n; a++) {
        size[a] = strtoull(argv[a + 1], NULL, 10) * MIB;
        if (cuMemAlloc_v2(&ptr[a], size[a])) {
            printf("FAIL: allocation %d\n", a);
            return 1;
        }
        for (uint64_t p = 0; p < size[a] / PAGE; p++) {
            if (!patterned(size[a], p)) continue;
            uint64_t w0 = p * PAGE / 8;
            for (uint64_t i = 0; i < PAGE / 8; i++) buf[i] = word(a, w0 + i);
            if (cuMemcpyHtoD_v2(ptr[a] + p * PAGE, buf, PAGE)) {
                printf("FAIL: pattern %d\n", a);
                return 1;
            }
        }
    }
    printf("ready\n");
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "check", 5)) continue;
        uint64_t corrupted = 0, failed = 0;
        for (int a = 0; a < n; a++) {
            for (uint64_t at = 0; at < size[a]; at += SLICE) {
                uint64_t len = size[a] - at < SLICE ? size[a] - at : SLICE;
                if (cuMemcpyDtoH_v2(buf, ptr[a] + at, len)) {
                    failed++;
                    continue;
                }
                for (uint64_t i = 0; i < len / 8; i++) {
                    uint64_t w = at / 8 + i;
                    uint64_t want = patterned(size[a], w * 8 / PAGE) ? word(a, w) : 0;
                    corrupted += buf[i] != want;
                }
            }
        }
        printf("intact %llu %llu\n", (unsigned long long)corrupted, (unsigned long long)failed);
        fflush(stdout);
    }
    for (int a = 0; a < n; a++) cuMemFree_v2(ptr[a]);
    return 0;
}

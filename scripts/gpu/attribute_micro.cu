// The truth for scripts/gpu/validate-attribute.sh, measured inside the process that is being
// attributed. N launches of an empty kernel straight through the driver API (cuLaunchKernel: what
// the agent probes and the limiter hooks, no CUDA runtime in between), a cuStreamSynchronize every
// SYNC_EVERY launches (0: none), each launch timed around the call. Before and after each launch it
// reads the first byte of libcuda's own cuLaunchKernel: a uprobe attached there shows as an int3
// (0xcc), so each launch is known to have been probed or not, and the probes' cost per probed
// launch is the difference of the two kinds' medians in this very process, at the same moments.
//
// With DIRECT=1 (a preloaded limiter), every other launch goes straight to libcuda's own
// cuLaunchKernel (found in its dynamic symbol table: the limiter answers dlsym with its hook), so
// the launches' time in the driver is measured beside the hooked ones, at the same moments, without
// the hook's own time: the truth for the limiter's timing of the hooked launches.
//
// With TRACE=PATH in the environment it also writes one 16-byte record per launch to PATH (the
// launch's start on CLOCK_MONOTONIC in ns, its time in ns as a float, and flags: bit 0 probed
// before, bit 1 after, bit 2 a synchronisation followed, bit 3 straight to libcuda), for
// scripts/gpu/probe_hit_trace.py.
//
// ./attribute_micro N SYNC_EVERY LINGER_MS [DIRECT]   (prints one line: MICRO key=value ...)
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <string.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

__global__ void empty_kernel(int x) { if (x == -1) printf("never\n"); }

static inline uint64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

static double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// The mean of the middle 98% (a launch preempted for a millisecond would move a plain mean).
static double trimmed_mean(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t cut = v.size() / 100, n = v.size() - 2 * cut;
  double s = 0;
  for (size_t i = cut; i < v.size() - cut; i++) s += v[i];
  return s / n;
}

// libcuda's own definition of `name`, from its dynamic symbol table (GNU hash), bypassing dlsym.
struct Lookup { const char* name; void* addr; };
static uint32_t gnu_hash(const char* s) {
  uint32_t h = 5381;
  for (; *s; s++) h = h * 33 + (uint8_t)*s;
  return h;
}
static int find_in_libcuda(struct dl_phdr_info* info, size_t, void* data) {
  Lookup* l = (Lookup*)data;
  if (!info->dlpi_name || !strstr(info->dlpi_name, "libcuda.so")) return 0;
  const ElfW(Dyn)* dyn = nullptr;
  for (int i = 0; i < info->dlpi_phnum; i++)
    if (info->dlpi_phdr[i].p_type == PT_DYNAMIC) dyn = (const ElfW(Dyn)*)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
  const ElfW(Sym)* symtab = nullptr;
  const char* strtab = nullptr;
  const uint32_t* gh = nullptr;
  // glibc relocates these entries in place on x86_64; other loaders may leave them relative.
  auto at = [&](ElfW(Addr) p) { return p < info->dlpi_addr ? p + info->dlpi_addr : p; };
  for (; dyn && dyn->d_tag != DT_NULL; dyn++) {
    if (dyn->d_tag == DT_SYMTAB) symtab = (const ElfW(Sym)*)at(dyn->d_un.d_ptr);
    if (dyn->d_tag == DT_STRTAB) strtab = (const char*)at(dyn->d_un.d_ptr);
    if (dyn->d_tag == DT_GNU_HASH) gh = (const uint32_t*)at(dyn->d_un.d_ptr);
  }
  if (!symtab || !strtab || !gh) return 0;
  uint32_t nbuckets = gh[0], symoffset = gh[1], bloom_size = gh[2];
  const uint32_t* buckets = (const uint32_t*)((const ElfW(Addr)*)&gh[4] + bloom_size);
  const uint32_t* chain = buckets + nbuckets;
  uint32_t h = gnu_hash(l->name);
  for (uint32_t i = buckets[h % nbuckets]; i >= symoffset && i != 0; i++) {
    uint32_t h2 = chain[i - symoffset];
    if ((h | 1) == (h2 | 1) && !strcmp(strtab + symtab[i].st_name, l->name) && symtab[i].st_value) {
      l->addr = (void*)(info->dlpi_addr + symtab[i].st_value);
      return 1;
    }
    if (h2 & 1) break;
  }
  return 0;
}

int main(int argc, char** argv) {
  long n = argc > 1 ? atol(argv[1]) : 1000000;
  long sync_every = argc > 2 ? atol(argv[2]) : 256;
  long linger_ms = argc > 3 ? atol(argv[3]) : 1000;
  bool alternate = argc > 4 && atol(argv[4]) == 1;
  if (cudaFree(0) != cudaSuccess) { printf("no cuda\n"); return 1; }
  cudaFunction_t rf;
  if (cudaGetFuncBySymbol(&rf, (const void*)empty_kernel) != cudaSuccess) { printf("no function\n"); return 1; }
  CUfunction f = (CUfunction)rf;
  // libcuda's own entry point (a preloaded limiter's cuLaunchKernel is another function).
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  const volatile uint8_t* entry = cuda ? (const volatile uint8_t*)dlsym(cuda, "cuLaunchKernel") : nullptr;
  if (!entry) { printf("no libcuda cuLaunchKernel\n"); return 1; }
  Lookup own{"cuLaunchKernel", nullptr};
  dl_iterate_phdr(find_in_libcuda, &own);
  if (alternate && !own.addr) { printf("libcuda's own cuLaunchKernel not found\n"); return 1; }
  auto direct_launch = (decltype(&cuLaunchKernel))own.addr;
  int x = 0;
  void* args[] = {&x};
  // What a pair of clock reads costs: taken out of each timed launch.
  std::vector<double> empty(100000);
  for (auto& e : empty) { uint64_t t = now_ns(); e = double(now_ns() - t); }
  double clock_ns = median(empty);
  std::vector<double> probed, unprobed, direct;
  probed.reserve(n);
  unprobed.reserve(n);
  if (alternate) direct.reserve(n / 2 + 1);
  struct Record { uint64_t start; float ns; uint32_t flags; };
  static_assert(sizeof(Record) == 16, "trace record");
  const char* trace_path = getenv("TRACE");
  std::vector<Record> trace;  // every launch (the truths at the windows' own moments need them)
  trace.reserve(n);
  long edges = 0, syncs = 0, errors = 0;
  double total = 0;
  uint64_t t_all = now_ns();
  for (long i = 0; i < n; i++) {
    bool bypass = alternate && (i & 1);
    bool before = *entry == 0xcc;
    uint64_t t = now_ns();
    errors += (bypass ? direct_launch : cuLaunchKernel)(f, 1, 1, 1, 1, 1, 1, 0, 0, args, nullptr) != CUDA_SUCCESS;
    double d = double(now_ns() - t) - clock_ns;
    bool after = *entry == 0xcc;
    if (bypass) {
      direct.push_back(d);
    } else {
      total += d;
      if (before != after) edges++;
      else (before ? probed : unprobed).push_back(d);
    }
    bool sync = sync_every > 0 && (i + 1) % sync_every == 0;
    if (sync) { cuStreamSynchronize(0); syncs++; }
    trace.push_back({t, float(d), uint32_t(before) | uint32_t(after) << 1 | uint32_t(sync) << 2 | uint32_t(bypass) << 3});
  }
  cuCtxSynchronize();
  double loop_ns = double(now_ns() - t_all);
  double mu = trimmed_mean(unprobed);
  // The hooked launches' time in the driver, at the direct launches' mean (untrimmed: the
  // limiter's sum carries every preemption too).
  double direct_mean = 0;
  for (double d : direct) direct_mean += d;
  if (!direct.empty()) direct_mean /= direct.size();
  long hooked = n - (long)direct.size();
  // What the launches would have taken in the driver unprobed: the unprobed ones as measured,
  // the probed ones at the unprobed mean.
  double driver_truth = 0;
  for (double d : unprobed) driver_truth += d;
  driver_truth += (probed.size() + edges) * mu;
  if (alternate) driver_truth = hooked * direct_mean;
  // The same truths at the windows' own moments: the launch's time drifts over a run by more
  // than a tenth of a hit, and the probes are attached only in a few windows, so each window's
  // probed launches are compared with the unprobed launches within WINDOW_BASELINE_NS of it.
  const uint64_t WINDOW_BASELINE_NS = 200000000;
  double local_cost_sum = 0, local_driver = 0;
  long local_probed = 0;
  for (size_t i = 0; i < trace.size();) {
    bool probed_i = (trace[i].flags & 3) == 3 && !(trace[i].flags & 8);
    if (!probed_i) {
      if (!(trace[i].flags & 8) && (trace[i].flags & 3) == 0) local_driver += trace[i].ns;
      i++;
      continue;
    }
    size_t j = i;
    std::vector<double> in_window;
    while (j < trace.size() && ((trace[j].flags & 3) == 3 || (trace[j].flags & 8))) {
      if (!(trace[j].flags & 8)) in_window.push_back(trace[j].ns);
      j++;
    }
    uint64_t t0 = trace[i].start > WINDOW_BASELINE_NS ? trace[i].start - WINDOW_BASELINE_NS : 0;
    uint64_t t1 = trace[j - 1].start + WINDOW_BASELINE_NS;
    std::vector<double> around;
    auto by_start = [](const Record& r, uint64_t t) { return r.start < t; };
    size_t from = std::lower_bound(trace.begin(), trace.end(), t0, by_start) - trace.begin();
    size_t to = std::lower_bound(trace.begin(), trace.end(), t1, by_start) - trace.begin();
    for (size_t k = from; k < to; k++)
      if ((trace[k].flags & 11) == 0) around.push_back(trace[k].ns);
    double base = around.size() >= 100 ? trimmed_mean(around) : mu;
    local_cost_sum += in_window.size() * (trimmed_mean(in_window) - base);
    local_driver += in_window.size() * base;
    local_probed += in_window.size();
    i = j;
  }
  local_driver += edges * mu;
  double local_cost = local_probed ? local_cost_sum / local_probed : 0;
  if (alternate) local_driver = driver_truth;
  printf("MICRO launches=%ld hooked=%ld direct=%zu direct_mean_ns=%.1f direct_med_ns=%.1f syncs=%ld errors=%ld probed=%zu unprobed=%zu edges=%ld "
         "clock_ns=%.1f probed_med_ns=%.1f unprobed_med_ns=%.1f probed_mean_ns=%.1f unprobed_mean_ns=%.1f "
         "launch_total_ns=%.0f driver_truth_ns=%.0f loop_ns=%.0f local_cost_ns=%.1f local_driver_truth_ns=%.0f\n",
         n, hooked, direct.size(), direct_mean, median(direct), syncs, errors, probed.size(), unprobed.size(), edges, clock_ns, median(probed), median(unprobed),
         trimmed_mean(probed), mu, total, driver_truth, loop_ns, local_cost, local_driver);
  fflush(stdout);
  if (trace_path) {
    FILE* f = fopen(trace_path, "wb");
    if (!f || fwrite(trace.data(), sizeof(Record), trace.size(), f) != trace.size()) { printf("trace write failed\n"); return 1; }
    fclose(f);
  }
  // Linger past the agent's next poll: the limiter retires its region slot at exit.
  usleep(linger_ms * 1000);
  return errors ? 1 : 0;
}

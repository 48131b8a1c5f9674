// Copied from the project's shared/bench/launch_micro.cu (the method of notes/gpu-machine.md) so the
// GPU scripts need nothing outside the repository.
// Per-call CPU cost of kernel launches and of cudaMalloc/cudaFree pairs, median of many timed calls.
// ./launch_micro LAUNCHES ALLOCS
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
__global__ void empty_kernel(int x) { if (x == -1) printf("never\n"); }
static double now_ns() { return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
static double median(std::vector<double>& v) { std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end()); return v[v.size() / 2]; }
int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 200000, m = argc > 2 ? atoi(argv[2]) : 20000;
  if (cudaFree(0) != cudaSuccess) { printf("no cuda\n"); return 1; }
  for (int i = 0; i < 1000; i++) empty_kernel<<<1, 1>>>(i);
  cudaDeviceSynchronize();
  std::vector<double> l(n), a(m);
  double t_all = now_ns();
  for (int i = 0; i < n; i++) {
    double t = now_ns(); empty_kernel<<<1, 1>>>(i); l[i] = now_ns() - t;
    if (i % 256 == 255) cudaStreamSynchronize(0);
  }
  cudaDeviceSynchronize(); t_all = (now_ns() - t_all) / n;
  void* p;
  for (int i = 0; i < m; i++) {
    double t = now_ns(); if (cudaMalloc(&p, 1 << 20) != cudaSuccess) { printf("alloc failed\n"); return 1; } cudaFree(p); a[i] = now_ns() - t;
  }
  printf("MICRO launch_med_ns=%.0f launch_loop_ns=%.0f allocfree_med_ns=%.0f\n", median(l), t_all, median(a));
  return 0;
}

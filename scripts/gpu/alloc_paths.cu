// alloc_paths.cu - exercises every device-allocation path gpuguard claims to
// count, keeps its own books of what it allocated, and prints, per phase, one
// JSON line comparing gpuguard's counters (C API, looked up with dlsym so the
// program also runs without the shim) with its own expected totals and with
// cudaMemGetInfo deltas (driver truth, page-rounded, informational).
//
// Build (GPU machine):
//   nvcc -O2 -o /tmp/alloc_paths_static alloc_paths.cu -lcuda -ldl             (static cudart: runtime reaches
//                                                                                the driver via cuGetProcAddress)
//   nvcc -O2 -cudart shared -o /tmp/alloc_paths_shared alloc_paths.cu -lcuda -ldl (cudaMalloc is also a
//                                                                                dynamic symbol: two layers)
// Run: LD_PRELOAD=.../libgpuguard.so GPUGUARD_DIR=dir /tmp/alloc_paths_static
//
// Output (stdout):
//   {"check":"phase:<name>", expected/gpuguard deltas of current bytes, allocs,
//    frees, pinned bytes, driver_used_delta, "verdict":...}
//   LEAK 0x<address> bytes <n> api=<api> kind=<kind> [handle=0x..]
//   GGV_MIDRUN pid=<pid>          (the runner sends SIGUSR1; see ggv_common.py)
//   {"check":"signal_report", ...} {"check":"request_report", ...}
// Exit status: 0 when every CUDA call succeeded (verdicts do not change it).
//
// Environment: GPUGUARD_DIR, GGV_SIGNAL_SELF=1, GGV_EXPECT_SIGNAL=1,
// GGV_SIGNAL_WAIT_S (default 20), GGV_SKIP_MANAGED=1, GGV_SKIP_ARRAYS=1.

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <cuda_runtime.h>
#include <dirent.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

// ---- gpuguard C API (resolved at run time) -----------------------------------
typedef struct gpuguard_device_counters {
  int32_t device;
  uint32_t reserved0;
  uint64_t total_bytes, cap_bytes, current_bytes, peak_bytes, allocs, frees, failed, denied,
      unknown_frees;
} gpuguard_device_counters;
typedef const char *(*gg_version_fn)(void);
typedef int (*gg_counters_fn)(int, gpuguard_device_counters *);
typedef int (*gg_pinned_fn)(uint64_t *, uint64_t *);
typedef int (*gg_write_fn)(const char *, char *, size_t);

static gg_version_fn gg_version;
static gg_counters_fn gg_counters;
static gg_pinned_fn gg_pinned;
static gg_write_fn gg_write;

static void gg_resolve(void) {
  gg_version = (gg_version_fn)dlsym(RTLD_DEFAULT, "gpuguard_version");
  gg_counters = (gg_counters_fn)dlsym(RTLD_DEFAULT, "gpuguard_device_counters");
  gg_pinned = (gg_pinned_fn)dlsym(RTLD_DEFAULT, "gpuguard_host_pinned");
  gg_write = (gg_write_fn)dlsym(RTLD_DEFAULT, "gpuguard_write_report");
}

typedef struct snap {
  int ok;
  gpuguard_device_counters c;
  uint64_t pinned_cur, pinned_peak;
  int pinned_ok;
  size_t free_b, total_b;
} snap;

static int failures;

#define RT(call)                                                                              \
  do {                                                                                        \
    cudaError_t e_ = (call);                                                                  \
    if (e_ != cudaSuccess) {                                                                  \
      fprintf(stderr, "FAIL %s:%d %s -> %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      failures++;                                                                             \
    }                                                                                         \
  } while (0)

#define DRV(call)                                                                       \
  do {                                                                                  \
    CUresult r_ = (call);                                                               \
    if (r_ != CUDA_SUCCESS) {                                                           \
      const char *s_ = NULL;                                                            \
      cuGetErrorString(r_, &s_);                                                        \
      fprintf(stderr, "FAIL %s:%d %s -> %d %s\n", __FILE__, __LINE__, #call, (int)r_, \
              s_ ? s_ : "?");                                                           \
      failures++;                                                                       \
    }                                                                                   \
  } while (0)

static snap take(void) {
  snap s;
  memset(&s, 0, sizeof s);
  RT(cudaDeviceSynchronize());
  if (gg_counters && gg_counters(0, &s.c) == 0) s.ok = 1;
  if (gg_pinned && gg_pinned(&s.pinned_cur, &s.pinned_peak) == 0) s.pinned_ok = 1;
  RT(cudaMemGetInfo(&s.free_b, &s.total_b));
  return s;
}

// ---- phases: expected deltas vs gpuguard deltas --------------------------------
typedef struct phase {
  const char *name;
  snap s0;
  long long exp_bytes, exp_allocs, exp_frees, exp_pinned;
  int arrays;  // array bytes are opaque to an interposer: nominal sizes, looser rule
  const char *note;
} phase;

static void phase_begin(phase *p, const char *name) {
  memset(p, 0, sizeof *p);
  p->name = name;
  p->s0 = take();
}
static void exp_alloc(phase *p, size_t bytes) { p->exp_bytes += (long long)bytes; p->exp_allocs++; }
static void exp_free(phase *p, size_t bytes) { p->exp_bytes -= (long long)bytes; p->exp_frees++; }

static int n_agree, n_explained, n_mismatch;
// gpuguard's array estimate minus the nominal bytes, for the total at the end.
static long long array_adjust;

static void phase_end(phase *p) {
  snap s1 = take();
  long long drv = (long long)p->s0.free_b - (long long)s1.free_b;
  const char *verdict = "no-gpuguard";
  char why[512] = "gpuguard C API not found (shim not preloaded?)";
  long long d_bytes = 0, d_allocs = 0, d_frees = 0, d_pinned = 0;
  if (p->s0.ok && s1.ok) {
    d_bytes = (long long)s1.c.current_bytes - (long long)p->s0.c.current_bytes;
    d_allocs = (long long)s1.c.allocs - (long long)p->s0.c.allocs;
    d_frees = (long long)s1.c.frees - (long long)p->s0.c.frees;
    d_pinned = (p->s0.pinned_ok && s1.pinned_ok)
                   ? (long long)s1.pinned_cur - (long long)p->s0.pinned_cur
                   : 0;
    int bytes_ok = d_bytes == p->exp_bytes;
    int counts_ok = d_allocs == p->exp_allocs && d_frees == p->exp_frees;
    int pinned_ok = d_pinned == p->exp_pinned;
    if (bytes_ok && counts_ok && pinned_ok) {
      verdict = "agree";
      snprintf(why, sizeof why, "bytes, alloc/free counts and pinned bytes equal the program's own books");
      n_agree++;
    } else if (p->arrays && counts_ok && pinned_ok && d_bytes >= p->exp_bytes &&
               d_bytes <= 2 * p->exp_bytes + (2 << 20)) {
      verdict = "explained";
      array_adjust = d_bytes - p->exp_bytes;
      snprintf(why, sizeof why,
               "array bytes are driver-internal; gpuguard's estimate %lld is within [nominal, 2*nominal+2MiB] "
               "of the nominal %lld", d_bytes, p->exp_bytes);
      n_explained++;
    } else {
      verdict = "mismatch";
      snprintf(why, sizeof why, "differ:%s%s%s", bytes_ok ? "" : " device bytes",
               counts_ok ? "" : " alloc/free counts", pinned_ok ? "" : " pinned bytes");
      n_mismatch++;
    }
  }
  printf("{\"check\":\"phase:%s\",\"framework\":\"cuda_c\",\"expected_delta\":%lld,\"gpuguard_delta\":%lld,"
         "\"diff\":%lld,\"expected_allocs\":%lld,\"gpuguard_allocs\":%lld,\"expected_frees\":%lld,"
         "\"gpuguard_frees\":%lld,\"expected_pinned_delta\":%lld,\"gpuguard_pinned_delta\":%lld,"
         "\"driver_used_delta\":%lld,\"gpuguard_current\":%llu,\"gpuguard_failed\":%llu,"
         "\"gpuguard_unknown_frees\":%llu,\"verdict\":\"%s\",\"explanation\":\"%s%s%s\"}\n",
         p->name, p->exp_bytes, d_bytes, d_bytes - p->exp_bytes, p->exp_allocs, d_allocs, p->exp_frees,
         d_frees, p->exp_pinned, d_pinned, drv, (unsigned long long)s1.c.current_bytes,
         (unsigned long long)s1.c.failed, (unsigned long long)s1.c.unknown_frees, verdict, why,
         p->note ? " | " : "", p->note ? p->note : "");
  fflush(stdout);
}

// ---- leak books ---------------------------------------------------------------
typedef struct leak {
  unsigned long long addr, bytes, handle;
  const char *api, *kind;
} leak;
static leak leaks[32];
static int n_leaks;
static void add_leak(unsigned long long addr, size_t bytes, const char *api, const char *kind,
                     unsigned long long handle) {
  if (n_leaks >= 32) return;
  leak *l = &leaks[n_leaks++];
  l->addr = addr;
  l->bytes = (unsigned long long)bytes;
  l->handle = handle;
  l->api = api;
  l->kind = kind;
}

// ---- mid-run signal protocol -----------------------------------------------------
static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int find_report(const char *reason, char *out, size_t outlen) {
  const char *dir = getenv("GPUGUARD_DIR");
  if (!dir) return 0;
  DIR *d = opendir(dir);
  if (!d) return 0;
  char pidpart[32], suffix[64];
  snprintf(pidpart, sizeof pidpart, ".%d.", (int)getpid());
  snprintf(suffix, sizeof suffix, ".%s.json", reason);
  int found = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    size_t n = strlen(e->d_name), m = strlen(suffix);
    if (strncmp(e->d_name, "gpuguard.", 9) == 0 && strstr(e->d_name, pidpart) && n > m &&
        strcmp(e->d_name + n - m, suffix) == 0) {
      snprintf(out, outlen, "%s/%s", dir, e->d_name);
      found = 1;
      break;
    }
  }
  closedir(d);
  return found;
}

static void midrun(void) {
  const char *self = getenv("GGV_SIGNAL_SELF");
  const char *ext = getenv("GGV_EXPECT_SIGNAL");
  int want_self = self && strcmp(self, "1") == 0;
  int expect = want_self || (ext && strcmp(ext, "1") == 0);
  if (!gg_counters) signal(SIGUSR1, SIG_IGN);  // bare run: survive the runner's kill
  snap s = take();
  printf("GGV_MIDRUN pid=%d\n", (int)getpid());
  fflush(stdout);
  if (!expect || !gg_counters) return;
  double t0 = now_s();
  if (want_self) kill(getpid(), SIGUSR1);
  const char *w = getenv("GGV_SIGNAL_WAIT_S");
  double wait_s = w ? atof(w) : 20.0;
  char path[4096] = "";
  int found = 0;
  while (now_s() - t0 < wait_s) {
    if (find_report("signal", path, sizeof path)) {
      found = 1;
      break;
    }
    usleep(50 * 1000);
  }
  usleep(200 * 1000);  // let a writer that creates the file first finish it
  // The report's content is compared with gpuguard_current by check_run.py.
  printf("{\"check\":\"signal_report\",\"framework\":\"cuda_c\",\"sent_by\":\"%s\",\"report\":\"%s\","
         "\"gpuguard_current\":%llu,\"waited_s\":%.3f,\"found\":%s}\n",
         want_self ? "self" : "runner", found ? path : "", (unsigned long long)s.c.current_bytes,
         now_s() - t0, found ? "true" : "false");
  fflush(stdout);
}

// ---- main -------------------------------------------------------------------------
typedef CUresult (*cuMemAlloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*cuMemFree_fn)(CUdeviceptr);

static const size_t MiB = 1u << 20;

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  gg_resolve();
  RT(cudaSetDevice(0));
  RT(cudaFree(0));  // creates the primary context
  DRV(cuInit(0));
  int drv_ver = 0, rt_ver = 0;
  cuDriverGetVersion(&drv_ver);
  cudaRuntimeGetVersion(&rt_ver);
  printf("{\"check\":\"gpuguard_present\",\"framework\":\"cuda_c\",\"present\":%s,\"version\":\"%s\","
         "\"pid\":%d,\"driver_version\":%d,\"runtime_version\":%d,\"verdict\":\"info\"}\n",
         gg_counters ? "true" : "false", gg_version ? gg_version() : "", (int)getpid(), drv_ver, rt_ver);
  snap base = take();
  phase p;

  // 1. cudaMalloc
  phase_begin(&p, "cudaMalloc");
  {
    void *a = NULL, *b = NULL, *c = NULL;
    size_t sa = 1 * MiB, sb = 8 * MiB, sc = 33 * MiB + 123;
    RT(cudaMalloc(&a, sa)); exp_alloc(&p, sa);
    RT(cudaMalloc(&b, sb)); exp_alloc(&p, sb);
    RT(cudaMalloc(&c, sc)); exp_alloc(&p, sc);
    RT(cudaMemset(a, 1, sa)); RT(cudaMemset(b, 2, sb)); RT(cudaMemset(c, 3, sc));
    RT(cudaFree(a)); exp_free(&p, sa);
    RT(cudaFree(b)); exp_free(&p, sb);
    add_leak((unsigned long long)(uintptr_t)c, sc, "cudaMalloc", "device", 0);
  }
  phase_end(&p);

  // 2. cudaMallocPitch: bytes = pitch * height
  phase_begin(&p, "cudaMallocPitch");
  {
    void *a = NULL, *b = NULL;
    size_t pa = 0, pb = 0;
    RT(cudaMallocPitch(&a, &pa, 1000, 513)); exp_alloc(&p, pa * 513);
    RT(cudaMallocPitch(&b, &pb, 4000, 77)); exp_alloc(&p, pb * 77);
    RT(cudaMemset2D(a, pa, 0, 1000, 513));
    RT(cudaFree(a)); exp_free(&p, pa * 513);
    add_leak((unsigned long long)(uintptr_t)b, pb * 77, "cudaMallocPitch", "device", 0);
    static char note[96];
    snprintf(note, sizeof note, "pitches %zu and %zu", pa, pb);
    p.note = note;
  }
  phase_end(&p);

  // 3. cudaMallocManaged (small: never ask for managed memory near the card's size)
  if (!getenv("GGV_SKIP_MANAGED")) {
    phase_begin(&p, "cudaMallocManaged");
    void *a = NULL, *b = NULL;
    size_t sa = 4 * MiB, sb = 1 * MiB + 64;
    RT(cudaMallocManaged(&a, sa, cudaMemAttachGlobal)); exp_alloc(&p, sa);
    RT(cudaMallocManaged(&b, sb, cudaMemAttachGlobal)); exp_alloc(&p, sb);
    RT(cudaMemset(a, 0, sa)); RT(cudaMemset(b, 0, sb));
    RT(cudaFree(a)); exp_free(&p, sa);
    add_leak((unsigned long long)(uintptr_t)b, sb, "cudaMallocManaged", "managed", 0);
    phase_end(&p);
  }

  // 4. stream-ordered: default pool and an explicit pool
  phase_begin(&p, "cudaMallocAsync");
  {
    cudaStream_t s;
    RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void *x1 = NULL, *x2 = NULL, *x3 = NULL;
    size_t s1 = 16 * MiB, s2 = 3 * MiB + 512, s3 = 5 * MiB;
    RT(cudaMallocAsync(&x1, s1, s)); exp_alloc(&p, s1);
    RT(cudaMallocAsync(&x2, s2, s)); exp_alloc(&p, s2);
    RT(cudaMemsetAsync(x1, 0, s1, s)); RT(cudaMemsetAsync(x2, 0, s2, s));
    RT(cudaFreeAsync(x1, s)); exp_free(&p, s1);
    cudaMemPool_t pool;
    cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    RT(cudaMemPoolCreate(&pool, &props));
    RT(cudaMallocFromPoolAsync(&x3, s3, pool, s)); exp_alloc(&p, s3);
    RT(cudaMemsetAsync(x3, 0, s3, s));
    RT(cudaFreeAsync(x3, s)); exp_free(&p, s3);
    RT(cudaStreamSynchronize(s));
    cudaMemPool_t def;
    RT(cudaDeviceGetDefaultMemPool(&def, 0));
    RT(cudaMemPoolTrimTo(def, 0));  // pool trimming frees no live block
    RT(cudaMemPoolDestroy(pool));
    add_leak((unsigned long long)(uintptr_t)x2, s2, "cudaMallocAsync", "device", 0);
    p.note = "live stream-ordered blocks count; pool reserve does not";
    // the stream stays alive: x2 belongs to it until exit
  }
  phase_end(&p);

  // 5. pinned host memory: host_pinned only, device counters unchanged
  phase_begin(&p, "cudaMallocHost");
  {
    void *h1 = NULL, *h2 = NULL;
    size_t s1 = 64 * MiB, s2 = 1 * MiB + 100;
    RT(cudaMallocHost(&h1, s1)); p.exp_pinned += (long long)s1;
    RT(cudaHostAlloc(&h2, s2, cudaHostAllocPortable)); p.exp_pinned += (long long)s2;
    memset(h1, 1, s1);
    RT(cudaFreeHost(h1)); p.exp_pinned -= (long long)s1;
    add_leak((unsigned long long)(uintptr_t)h2, s2, "cudaHostAlloc", "host_pinned", 0);
    p.note = "pinned host memory: gpuguard_host_pinned moves, device counters do not";
  }
  phase_end(&p);

  // 6. driver API bound by symbol (-lcuda)
  phase_begin(&p, "cuMemAlloc");
  {
    CUdeviceptr d1 = 0, d2 = 0, d3 = 0;
    size_t s1 = 5 * MiB, s2 = 7 * MiB + 4096, pitch = 0;
    DRV(cuMemAlloc(&d1, s1)); exp_alloc(&p, s1);
    DRV(cuMemAlloc(&d2, s2)); exp_alloc(&p, s2);
    DRV(cuMemAllocPitch(&d3, &pitch, 3000, 100, 16)); exp_alloc(&p, pitch * 100);
    DRV(cuMemsetD8(d1, 0, s1));
    DRV(cuMemFree(d1)); exp_free(&p, s1);
    DRV(cuMemFree(d3)); exp_free(&p, pitch * 100);
    add_leak((unsigned long long)d2, s2, "cuMemAlloc_v2", "device", 0);
  }
  phase_end(&p);

  // 7. driver API through dlopen + dlsym (the path JAX and PyTorch use)
  phase_begin(&p, "dlsym_cuMemAlloc");
  {
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!h) h = dlopen("libcuda.so.1", RTLD_LAZY);
    cuMemAlloc_fn fa = h ? (cuMemAlloc_fn)dlsym(h, "cuMemAlloc_v2") : NULL;
    cuMemFree_fn ff = h ? (cuMemFree_fn)dlsym(h, "cuMemFree_v2") : NULL;
    if (fa && ff) {
      CUdeviceptr d1 = 0, d2 = 0;
      size_t s1 = 2 * MiB + 1, s2 = 6 * MiB + 8;
      DRV(fa(&d1, s1)); exp_alloc(&p, s1);
      DRV(fa(&d2, s2)); exp_alloc(&p, s2);
      DRV(ff(d1)); exp_free(&p, s1);
      add_leak((unsigned long long)d2, s2, "cuMemAlloc_v2(dlsym)", "device", 0);
    } else {
      fprintf(stderr, "FAIL dlopen/dlsym libcuda.so.1: %s\n", dlerror());
      failures++;
    }
  }
  phase_end(&p);

  // 8. driver API through cuGetProcAddress (the path the CUDA runtime uses)
  phase_begin(&p, "cuGetProcAddress");
  {
    void *fa = NULL, *ff = NULL;
    CUdriverProcAddressQueryResult st;
    DRV(cuGetProcAddress("cuMemAlloc", &fa, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &st));
    DRV(cuGetProcAddress("cuMemFree", &ff, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &st));
    if (fa && ff) {
      CUdeviceptr d = 0;
      size_t s1 = 9 * MiB;
      DRV(((cuMemAlloc_fn)fa)(&d, s1)); exp_alloc(&p, s1);
      DRV(((cuMemFree_fn)ff)(d)); exp_free(&p, s1);
    }
  }
  phase_end(&p);

  // 9. VMM: physical memory is the cuMemCreate handle
  {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t g = 0;
    DRV(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    if (g == 0) g = 2 * MiB;
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

    phase_begin(&p, "vmm_create_map_release");
    {
      size_t sz = 3 * g;
      CUmemGenericAllocationHandle h = 0;
      CUdeviceptr va = 0;
      DRV(cuMemCreate(&h, sz, &prop, 0)); exp_alloc(&p, sz);
      DRV(cuMemAddressReserve(&va, sz, 0, 0, 0));
      DRV(cuMemMap(va, sz, 0, h, 0));
      DRV(cuMemSetAccess(va, sz, &acc, 1));
      DRV(cuMemsetD8(va, 7, sz));
      DRV(cuCtxSynchronize());
      DRV(cuMemUnmap(va, sz));
      DRV(cuMemRelease(h)); exp_free(&p, sz);
      DRV(cuMemAddressFree(va, sz));
    }
    phase_end(&p);

    // Release while still mapped: the driver keeps the memory until the unmap.
    CUmemGenericAllocationHandle h2 = 0;
    CUdeviceptr va2 = 0;
    size_t sz2 = 2 * g;
    phase_begin(&p, "vmm_release_while_mapped");
    DRV(cuMemCreate(&h2, sz2, &prop, 0)); exp_alloc(&p, sz2);
    DRV(cuMemAddressReserve(&va2, sz2, 0, 0, 0));
    DRV(cuMemMap(va2, sz2, 0, h2, 0));
    DRV(cuMemSetAccess(va2, sz2, &acc, 1));
    DRV(cuMemRelease(h2));  // still mapped: still occupies the device
    p.note = "cuMemRelease on a mapped handle frees nothing yet (driver frees at the last unmap)";
    phase_end(&p);
    phase_begin(&p, "vmm_unmap_after_release");
    DRV(cuMemUnmap(va2, sz2)); exp_free(&p, sz2);
    DRV(cuMemAddressFree(va2, sz2));
    p.note = "the unmap of a released handle frees it";
    phase_end(&p);

    phase_begin(&p, "vmm_leak");
    {
      CUmemGenericAllocationHandle h = 0;
      CUdeviceptr va = 0;
      DRV(cuMemCreate(&h, g, &prop, 0)); exp_alloc(&p, g);
      DRV(cuMemAddressReserve(&va, g, 0, 0, 0));
      DRV(cuMemMap(va, g, 0, h, 0));
      DRV(cuMemSetAccess(va, g, &acc, 1));
      add_leak((unsigned long long)va, g, "cuMemCreate", "vmm", (unsigned long long)h);
    }
    phase_end(&p);
  }

  // 10. CUDA arrays (sizes are driver-internal: nominal w*h*d*elem)
  if (!getenv("GGV_SKIP_ARRAYS")) {
    phase_begin(&p, "arrays");
    p.arrays = 1;
    cudaArray_t a1 = NULL, a3 = NULL;
    cudaChannelFormatDesc f1 = cudaCreateChannelDesc<float>();
    cudaChannelFormatDesc f4 = cudaCreateChannelDesc<float4>();
    size_t n1 = 1024 * 1024 * sizeof(float), n3 = 64 * 64 * 64 * sizeof(float4);
    RT(cudaMallocArray(&a1, &f1, 1024, 1024, 0)); exp_alloc(&p, n1);
    RT(cudaMalloc3DArray(&a3, &f4, make_cudaExtent(64, 64, 64), 0)); exp_alloc(&p, n3);
    RT(cudaFreeArray(a1)); exp_free(&p, n1);
    add_leak((unsigned long long)(uintptr_t)a3, n3, "cudaMalloc3DArray", "array", 0);
    p.note = "cudaMallocArray 1024x1024 float (freed), cudaMalloc3DArray 64^3 float4 (leaked)";
    phase_end(&p);
  }

  // ---- totals, leak list, mid-run signal, request report ----
  snap end = take();
  long long exp_live = 0;
  for (int i = 0; i < n_leaks; i++) {
    if (strcmp(leaks[i].kind, "host_pinned") != 0) exp_live += (long long)leaks[i].bytes;
    if (leaks[i].handle)
      printf("LEAK 0x%llx bytes %llu api=%s kind=%s handle=0x%llx\n", leaks[i].addr, leaks[i].bytes,
             leaks[i].api, leaks[i].kind, leaks[i].handle);
    else
      printf("LEAK 0x%llx bytes %llu api=%s kind=%s\n", leaks[i].addr, leaks[i].bytes, leaks[i].api,
             leaks[i].kind);
  }
  exp_live += array_adjust;  // arrays: gpuguard's own estimate, accepted in the arrays phase
  long long gg_live = (long long)end.c.current_bytes - (long long)base.c.current_bytes;
  const char *tv = !end.ok ? "no-gpuguard" : (gg_live == exp_live ? "agree" : "mismatch");
  if (end.ok && gg_live != exp_live) n_mismatch++;
  printf("{\"check\":\"total_live\",\"framework\":\"cuda_c\",\"expected_live_device_bytes\":%lld,"
         "\"gpuguard_delta_since_start\":%lld,\"diff\":%lld,\"gpuguard_current\":%llu,\"gpuguard_peak\":%llu,"
         "\"gpuguard_allocs\":%llu,\"gpuguard_frees\":%llu,\"gpuguard_unknown_frees\":%llu,"
         "\"driver_used_delta_since_start\":%lld,\"n_leaks\":%d,\"verdict\":\"%s\","
         "\"explanation\":\"device bytes of the LEAK list (pinned excluded) vs gpuguard current since start; "
         "array bytes as gpuguard estimated them in the arrays phase\"}\n",
         exp_live, gg_live, gg_live - exp_live, (unsigned long long)end.c.current_bytes,
         (unsigned long long)end.c.peak_bytes, (unsigned long long)end.c.allocs,
         (unsigned long long)end.c.frees, (unsigned long long)end.c.unknown_frees,
         (long long)base.free_b - (long long)end.free_b, n_leaks, tv);

  midrun();

  if (gg_write) {
    char path[4096] = "";
    int rc = gg_write("request", path, sizeof path);
    printf("{\"check\":\"request_report\",\"framework\":\"cuda_c\",\"rc\":%d,\"report\":\"%s\","
           "\"gpuguard_current\":%llu}\n",
           rc, path, (unsigned long long)take().c.current_bytes);
  }
  printf("{\"check\":\"summary\",\"framework\":\"cuda_c\",\"verdict\":\"info\",\"cuda_call_failures\":%d,"
         "\"phases_agree\":%d,\"phases_explained\":%d,\"phases_mismatch\":%d}\n",
         failures, n_agree, n_explained, n_mismatch);
  fflush(stdout);
  // Leaks stay allocated: the exit report must list them.
  return failures ? 1 : 0;
}

/* gpuguard: the C API of libgpuguard.so.
 *
 * A program running under LD_PRELOAD=libgpuguard.so can ask gpuguard directly. Look
 * the functions up with dlsym(RTLD_DEFAULT, "gpuguard_...") so the program still runs
 * without gpuguard, or link against libgpuguard.so. From Python:
 *     lib = ctypes.CDLL(None); lib.gpuguard_device_counters(...)
 *
 * Every function is safe to call from any thread, at any time, also before the
 * program's first CUDA call (counters are zero then).
 */
#ifndef GPUGUARD_H
#define GPUGUARD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Counters of one device, as gpuguard counts them at the driver layer. */
typedef struct gpuguard_device_counters {
    int32_t device;          /* the ordinal asked for */
    uint32_t reserved0;
    uint64_t total_bytes;    /* device memory as the driver states it; 0 if not yet known */
    uint64_t cap_bytes;      /* 0: no cap on this device */
    uint64_t current_bytes;  /* live device memory (all kinds but pinned host) */
    uint64_t peak_bytes;     /* highest current_bytes so far */
    uint64_t allocs;         /* successful allocations */
    uint64_t frees;          /* frees of allocations gpuguard saw */
    uint64_t failed;         /* allocations the driver refused */
    uint64_t denied;         /* allocations refused by a cap */
    uint64_t unknown_frees;  /* frees of addresses gpuguard never saw */
} gpuguard_device_counters;

/* The library's version, e.g. "0.1.0". Never NULL. */
const char *gpuguard_version(void);

/* Fills *out for `device` (0..63). Returns 0, or -1 for a bad device or NULL out. */
int gpuguard_device_counters(int device, gpuguard_device_counters *out);

/* Pinned host memory: current and peak bytes (either pointer may be NULL). Returns 0. */
int gpuguard_host_pinned(uint64_t *current_bytes, uint64_t *peak_bytes);

/* Writes a report now, with `reason` (NULL: "request") in its name and body. On success
 * returns 0 and copies the file's path into path_out (NUL-terminated, truncated to
 * path_len; path_out may be NULL). Returns -1 if no file could be written (the report
 * then went to stderr). */
int gpuguard_write_report(const char *reason, char *path_out, size_t path_len);

/* Trims now: framework caches (PyTorch, CuPy), then CUDA pools, as a trim signal
 * does, and waits up to timeout_ms for the trim's report. Returns 0 when it is
 * written (its path copied into path_out as above; empty when it went to stderr), 1
 * on timeout (the trim still runs), -1 when gpuguard is disabled. Called from the
 * main thread of a Python process (which would have to run the framework part), the
 * trim runs in the calling thread and leaves the framework caches alone: call e.g.
 * torch.cuda.empty_cache() first. */
int gpuguard_trim(uint32_t timeout_ms, char *path_out, size_t path_len);

/* Sets device `device`'s cap to `bytes` while the program runs (0 lifts it; above the
 * device's memory it is clamped). Usage already above the new cap stays: the
 * allocations that follow are refused until usage is back under it. Returns 0, 1
 * when usage is already above the new cap, -1 for a bad device or when gpuguard is
 * disabled. GPUGUARD_WARN_AT and GPUGUARD_TRIM_AT apply to the new cap. */
int gpuguard_set_cap(int device, uint64_t bytes);

/* Phase labels, per thread: allocations the thread makes between
 * gpuguard_push_tag("eval") and the matching gpuguard_pop_tag() carry the innermost
 * label; in reports their sites end in a "tag: eval" frame (the outermost), so sites
 * and the flame graph split by phase. Labels nest (64 deep); longer than 256 bytes
 * they are cut. With GPUGUARD_STACK_DEPTH=0 there are no sites and no labels; an
 * allocation left without a stack past GPUGUARD_STACK_RATE under a label gets a site
 * of the label alone, so memory still splits by phase.
 * Return 0, or -1 (NULL tag, too deep, 65536 distinct labels; pop: none pushed). */
int gpuguard_push_tag(const char *tag);
int gpuguard_pop_tag(void);

#ifdef __cplusplus
}
#endif

#endif /* GPUGUARD_H */

/*
 * gg_graph.c - CUDA graph capture (stream capture) under gpuguard: a capture must
 * survive gpuguard's reports and trims, and gpuguard must count capturing streams
 * whichever way the program reached the capture calls. Links the driver (-lcuda).
 * See gg_common.h for the output protocol; the modes add:
 *   GOT <signum>        the program's own handler saw the signal (gpuguard chains it)
 *   POOL reserved=<n> used=<n>   the default pool's attributes
 *   DURING <export> <n> calls of the sim's export made while the capture ran
 *   INVALIDATED <n>     captures an unsafe call invalidated so far (the sim's count)
 *   CAPTURING / ENDED   handshakes
 * Usage: gg_graph MODE [args].
 */
#include "gg_common.h"

#include <pthread.h>

static void got_signal(int sig)
{
    char msg[16] = "GOT ";
    int n = 4;
    if (sig >= 10) msg[n++] = (char)('0' + sig / 10);
    msg[n++] = (char)('0' + sig % 10);
    msg[n++] = '\n';
    ssize_t r = write(1, msg, (size_t)n); /* async-signal-safe */
    (void)r;
}

/* The program's own handlers for the report and trim signals, installed before its
 * first CUDA call: gpuguard puts its own in front at activation and chains to them,
 * so a GOT line says gpuguard's handler has counted the request. */
static void install_echo(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = got_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    MUST(sigaction(SIGUSR1, &sa, NULL));
    MUST(sigaction(SIGUSR2, &sa, NULL));
}

static void pool_line(CUmemoryPool p)
{
    cuuint64_t reserved = 0, used = 0;
    MUST(cuMemPoolGetAttribute(p, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
    MUST(cuMemPoolGetAttribute(p, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used));
    printf("POOL reserved=%llu used=%llu\n", reserved, used);
}

/* The calls a capture forbids (or that gpuguard must not make during one), counted. */
static const char *const g_watched[] = {
    "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize", "cuMemPoolTrimTo",
    "cuMemPoolGetAttribute", "cuMemAlloc_v2", "cuMemFree_v2", NULL,
};

static unsigned long long g_at_begin[16];

static unsigned long long calls_of(const char *name)
{
    unsigned long long (*calls)(const char *) =
        (unsigned long long (*)(const char *))sim_sym("simcuda_calls");
    return calls ? calls(name) : 0ULL;
}

static void note_calls(void)
{
    for (int i = 0; g_watched[i]; i++) g_at_begin[i] = calls_of(g_watched[i]);
}

static void print_during(void)
{
    for (int i = 0; g_watched[i]; i++)
        printf("DURING %s %llu\n", g_watched[i], calls_of(g_watched[i]) - g_at_begin[i]);
    unsigned long long (*inv)(void) =
        (unsigned long long (*)(void))sim_sym("simcuda_captures_invalidated");
    printf("INVALIDATED %llu\n", inv ? inv() : 0ULL);
}

/* hold: a stream-ordered pool keeps 8 MiB of freed blocks; a stream captures in
 * global mode (CAPTURING), and stdin drives the rest, one command a line:
 *   alloc  a stream-ordered allocation and free on the capturing stream (legal)
 *   end    ends the capture (DURING..., RC end_capture, ENDED)
 *   quit   the pool line, the books, OK
 * The test sends its signals while the capture runs and reads the reports. */
static int mode_hold(int argc, char **argv)
{
    (void)argc; (void)argv;
    install_echo();
    gg_setup(0);
    CUmemoryPool dp;
    MUST(cuDeviceGetDefaultMemPool(&dp, 0));
    cuuint64_t keep = ~0ULL;
    MUST(cuMemPoolSetAttribute(dp, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
    CUstream s;
    MUST(cuStreamCreate(&s, 0));
    CUdeviceptr a, b;
    MUST(cuMemAllocAsync(&a, 8 * MiB, s));
    MUST(cuMemAllocAsync(&b, 1 * MiB, s));
    alloc_line(b, 1 * MiB, 0, "pool");
    MUST(cuMemFreeAsync(a, s));
    MUST(cuStreamSynchronize(s));
    step("before");
    pool_line(dp);
    note_calls();
    rc_line("begin_capture", cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    puts("CAPTURING");
    fflush(stdout);
    char line[64];
    int capturing = 1;
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "alloc", 5) == 0) {
            CUdeviceptr p = 0;
            rc_line("capture_alloc", cuMemAllocAsync(&p, 1 * MiB, s));
            rc_line("capture_free", cuMemFreeAsync(p, s));
        } else if (strncmp(line, "end", 3) == 0 && capturing) {
            print_during();
            CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
            MUST(cuStreamIsCapturing(s, &st));
            printf("STATUS %d\n", (int)st);
            CUgraph g = NULL;
            rc_line("end_capture", cuStreamEndCapture(s, &g));
            if (g) MUST(cuGraphDestroy(g));
            capturing = 0;
            puts("ENDED");
        } else if (strncmp(line, "quit", 4) == 0) {
            break;
        }
        fflush(stdout);
    }
    step("after");
    pool_line(dp);
    leak_line(b, 1 * MiB);
    print_gg();
    print_sim();
    puts("OK");
    return 0;
}

typedef CUresult (*begin_v1_fn)(CUstream);
typedef CUresult (*begin_v2_fn)(CUstream, CUstreamCaptureMode);
typedef CUresult (*begin_graph_fn)(CUstream, CUgraph, const CUgraphNode *, const void *, size_t,
                                   CUstreamCaptureMode);
typedef CUresult (*end_fn)(CUstream, CUgraph *);

static void *proc(const char *name, int version, cuuint64_t flags)
{
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    MUST(cuGetProcAddress_v2(name, &p, version, flags, &st));
    return p;
}

static CUresult end_with(end_fn f, CUstream s)
{
    CUgraph g = NULL;
    CUresult rc = f(s, &g);
    if (g) MUST(cuGraphDestroy(g));
    return rc;
}

/* paths: captures begun and ended through each way a program reaches the driver
 * (linked symbol, dlsym, cuGetProcAddress with and without the per-thread flag),
 * with each variant (CUDA 10.0 form, _v2, _ptsz, ToGraph), plus begins and ends the
 * driver refuses. With GG_MIDREPORT=1 a report is asked for at three points
 * (MIDREPORT lines: 4 streams capturing, 1, none). */
static int mode_paths(int argc, char **argv)
{
    (void)argc; (void)argv;
    gg_setup(0);
    CUstream s1, s2, s3, s4;
    MUST(cuStreamCreate(&s1, 0));
    MUST(cuStreamCreate(&s2, 0));
    MUST(cuStreamCreate(&s3, 0));
    MUST(cuStreamCreate(&s4, 0));
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) return 2;
    begin_v1_fn dl_begin_v1 = (begin_v1_fn)dlsym(h, "cuStreamBeginCapture");
    end_fn dl_end = (end_fn)dlsym(h, "cuStreamEndCapture");
    begin_v2_fn gpa_begin_ptsz = (begin_v2_fn)proc(
        "cuStreamBeginCapture", 10010, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    end_fn gpa_end_ptsz =
        (end_fn)proc("cuStreamEndCapture", 10000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    begin_graph_fn gpa_to_graph = (begin_graph_fn)proc("cuStreamBeginCaptureToGraph", 12030, 0);
    if (!dl_begin_v1 || !dl_end || !gpa_begin_ptsz || !gpa_end_ptsz || !gpa_to_graph) return 2;
    CUgraph into;
    MUST(cuGraphCreate(&into, 0));

    rc_line("begin_symbol_v2", cuStreamBeginCapture_v2(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    rc_line("begin_dlsym_v1", dl_begin_v1(s2));
    rc_line("begin_proc_ptsz", gpa_begin_ptsz(NULL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    rc_line("begin_proc_to_graph",
            gpa_to_graph(s3, into, NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_RELAXED));
    /* refused: the legacy stream, a stream already capturing */
    rc_line("begin_legacy", cuStreamBeginCapture_v2(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL));
    rc_line("begin_again", cuStreamBeginCapture_v2(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUdeviceptr p;
    rc_line("alloc_async_in_capture", cuMemAllocAsync(&p, 1 * MiB, s1));
    rc_line("free_async_in_capture", cuMemFreeAsync(p, s1));
    mid_report("caps4");

    rc_line("end_dlsym", end_with(dl_end, s1));
    rc_line("end_symbol_v1_stream", end_with(cuStreamEndCapture, s2));
    rc_line("end_proc_ptsz", end_with(gpa_end_ptsz, NULL));
    rc_line("end_again", end_with(cuStreamEndCapture, s1));
    mid_report("caps1");

    /* A capture an unsafe call invalidates still ends, with its error. */
    rc_line("begin_s4", cuStreamBeginCapture_v2(s4, CU_STREAM_CAPTURE_MODE_GLOBAL));
    rc_line("sync_in_capture", cuCtxSynchronize());
    rc_line("end_invalidated", end_with(cuStreamEndCapture, s4));
    rc_line("end_to_graph", end_with(cuStreamEndCapture, s3));
    mid_report("caps0");
    MUST(cuGraphDestroy(into));
    dlclose(h);
    puts("OK");
    return 0;
}

static const struct gg_mode g_modes[] = {
    {"hold", mode_hold},
    {"paths", mode_paths},
    {NULL, NULL},
};

int main(int argc, char **argv) { return gg_dispatch(g_modes, argc, argv); }

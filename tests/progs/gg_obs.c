/*
 * gg_obs.c - test program for watching a process: the timeline (GPUGUARD_TRACE),
 * status files (gpuguard ps), GPUGUARD_WARN_AT lines, GPUGUARD_LOG_EVERY lines and
 * the C API's trim and set_cap. Usage: gg_obs MODE [args]; output as in gg_common.h,
 * plus:
 *   READY                      the program holds its memory and waits for stdin's end
 *   TRIM rc=<n> path=<p>       gpuguard_trim's answer
 *   SETCAP bytes=<n> rc=<n>    gpuguard_set_cap's answer
 */
#include "gg_common.h"
#include "gg_burst.h"

#include <pthread.h>
#include <sys/wait.h>

typedef int (*gg_trim_fn)(uint32_t, char *, size_t);
typedef int (*gg_set_cap_fn)(int, uint64_t);

static void setup(void)
{
    CUcontext c;
    MUST(cuInit(0));
    MUST(cuDevicePrimaryCtxRetain(&c, 0));
    MUST(cuCtxSetCurrent(c));
}

static CUdeviceptr dev_alloc(size_t bytes)
{
    CUdeviceptr p;
    MUST(cuMemAlloc_v2(&p, bytes));
    alloc_line(p, bytes, 0, "device");
    return p;
}

static void dev_free(CUdeviceptr p)
{
    MUST(cuMemFree_v2(p));
    free_line(p);
}

static void trim_now(void)
{
    gg_trim_fn trim = (gg_trim_fn)dlsym(RTLD_DEFAULT, "gpuguard_trim");
    char path[4096] = "";
    int rc = trim ? trim(10000, path, sizeof path) : -2;
    printf("TRIM rc=%d path=%s\n", rc, path);
}

static void set_cap(uint64_t bytes)
{
    gg_set_cap_fn f = (gg_set_cap_fn)dlsym(RTLD_DEFAULT, "gpuguard_set_cap");
    printf("SETCAP bytes=%llu rc=%d\n", (unsigned long long)bytes, f ? f(0, bytes) : -2);
}

/* Waits for stdin to end (the test closes it). */
static void wait_stdin(void)
{
    puts("READY");
    fflush(stdout);
    char buf[64];
    while (fread(buf, 1, sizeof buf, stdin) > 0) {
    }
}

static void wait_trace(const char *text); /* below */

/* ---- trace [wait]: 30 MiB, a refused 40 MiB (cap 64 MiB), a trim (gpuguard_trim
 * waits for its report), 8 MiB left behind (the exit's last sample has it). `wait`:
 * before the refusal, until the trace holds a sample of the 30 MiB (a handshake on
 * the file; leave it out when the trace cannot be written) ---- */
static int mode_trace(int argc, char **argv)
{
    int wait = argc > 1 && strcmp(argv[1], "wait") == 0;
    setup();
    CUdeviceptr a = dev_alloc(30 * MiB);
    if (wait) wait_trace("\"live\":31457280,");
    CUdeviceptr b;
    rc_line("refused", cuMemAlloc_v2(&b, 40 * MiB));
    trim_now();
    dev_free(a);
    CUdeviceptr c = dev_alloc(8 * MiB);
    leak_line(c, 8 * MiB);
    puts("OK");
    return 0;
}

/* ---- hold MIB: holds MIB MiB until stdin ends ---- */
static int mode_hold(int argc, char **argv)
{
    long mib = argc > 1 ? atol(argv[1]) : 24;
    setup();
    CUdeviceptr a = dev_alloc((size_t)mib * MiB);
    wait_stdin();
    dev_free(a);
    puts("OK");
    return 0;
}

/* ---- fork_hold: the parent holds 8 MiB, a forked child 4 MiB of its own; both
 * until stdin ends (CHILD <pid> names the child). READY once both hold theirs: the
 * child says so through a pipe ---- */
static int mode_fork_hold(int argc, char **argv)
{
    (void)argc; (void)argv;
    setup();
    CUdeviceptr a = dev_alloc(8 * MiB);
    int ready[2];
    MUST(pipe(ready));
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        close(ready[0]);
        CUdeviceptr p;
        MUST(cuMemAlloc_v2(&p, 4 * MiB));
        printf("CHILD %d\n", (int)getpid());
        fflush(stdout);
        MUST(write(ready[1], "1", 1) != 1);
        close(ready[1]);
        char buf[64];
        while (fread(buf, 1, sizeof buf, stdin) > 0) {
        }
        exit(0); /* its exit handler removes its status file */
    }
    close(ready[1]);
    char byte;
    ssize_t got;
    while ((got = read(ready[0], &byte, 1)) < 0 && errno == EINTR) {
    }
    close(ready[0]);
    if (got != 1) {
        fprintf(stderr, "fork_hold: the child ended before it held its memory\n");
        return 3;
    }
    wait_stdin();
    int st;
    waitpid(child, &st, 0);
    dev_free(a);
    puts("OK");
    return 0;
}

/* ---- warnloop N: 45 MiB held, then N steps of +10 MiB and back; then all freed
 * and 55 MiB once more (cap 100 MiB, GPUGUARD_WARN_AT 0.5: 50 MiB) ---- */
static int mode_warnloop(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 20;
    setup();
    CUdeviceptr a = dev_alloc(45 * MiB);
    for (int i = 0; i < n; i++) {
        CUdeviceptr b = dev_alloc(10 * MiB);
        fprintf(stderr, "MARK step %d\n", i);
        dev_free(b);
    }
    dev_free(a);
    fprintf(stderr, "MARK freed\n");
    CUdeviceptr c = dev_alloc(55 * MiB);
    fprintf(stderr, "MARK again\n");
    dev_free(c);
    puts("OK");
    return 0;
}

/* ---- warn_exit: crosses GPUGUARD_WARN_AT and _exit()s at once ---- */
static int mode_warn_exit(int argc, char **argv)
{
    (void)argc; (void)argv;
    setup();
    dev_alloc(60 * MiB);
    fflush(stdout);
    _exit(0);
}

/* ---- a tee of stderr: gpuguard writes its lines to fd 2, which becomes a pipe; a
 * thread copies what comes through to the real stderr, in order, and counts
 * gpuguard's `memory:` lines, so that the program can wait for the next one (a
 * handshake) instead of guessing how long a period takes on a loaded machine ---- */
static int g_tee_out = -1, g_tee_in = -1;
static int g_memory_lines;
/* MARK lines copied so far, and how many memory lines came before the last one */
static int g_marks, g_memory_at_mark;
static pthread_t g_tee;

static void *tee_main(void *arg)
{
    (void)arg;
    char buf[4096], line[512];
    size_t len = 0;
    ssize_t n;
    while ((n = read(g_tee_in, buf, sizeof buf)) > 0) {
        for (ssize_t off = 0; off < n;) {
            ssize_t w = write(g_tee_out, buf + off, (size_t)(n - off));
            if (w <= 0) break;
            off += w;
        }
        for (ssize_t i = 0; i < n; i++) {
            if (buf[i] != '\n') {
                if (len < sizeof line - 1) line[len++] = buf[i];
                continue;
            }
            line[len] = 0;
            len = 0;
            if (strncmp(line, "gpuguard[", 9) == 0 && strstr(line, "]: memory:")) {
                __atomic_add_fetch(&g_memory_lines, 1, __ATOMIC_SEQ_CST);
            } else if (strncmp(line, "MARK ", 5) == 0) {
                __atomic_store_n(&g_memory_at_mark, __atomic_load_n(&g_memory_lines, __ATOMIC_SEQ_CST),
                                 __ATOMIC_SEQ_CST);
                __atomic_add_fetch(&g_marks, 1, __ATOMIC_SEQ_CST);
            }
        }
    }
    return NULL;
}

/* At exit (before gpuguard's own exit work, registered later): stderr is the real
 * one again and what the pipe holds is copied out before anything else is written. */
static void tee_stop(void)
{
    fflush(stderr);
    dup2(g_tee_out, 2);
    pthread_join(g_tee, NULL);
}

static void tee_stderr(void)
{
    int p[2];
    MUST(pipe(p));
    fflush(stderr);
    g_tee_out = dup(2);
    g_tee_in = p[0];
    MUST(dup2(p[1], 2) < 0);
    close(p[1]);
    MUST(pthread_create(&g_tee, NULL, tee_main, NULL));
    atexit(tee_stop);
}

/* Waits until gpuguard has written `n` memory lines in all (60 s at most). */
static void wait_memory_lines(int n)
{
    for (long waited = 0; waited < GG_WAIT_BOUND_MS; waited++) {
        if (__atomic_load_n(&g_memory_lines, __ATOMIC_SEQ_CST) >= n) return;
        sleep_ms(1);
    }
    fprintf(stderr, "gave up waiting for memory line %d\n", n);
}

/* Writes MARK <name> and waits until the tee copied it: returns how many memory
 * lines came before it in the output. */
static int mark_seen(const char *name)
{
    int before = __atomic_load_n(&g_marks, __ATOMIC_SEQ_CST);
    fprintf(stderr, "MARK %s\n", name);
    while (__atomic_load_n(&g_marks, __ATOMIC_SEQ_CST) == before) sleep_ms(1);
    return __atomic_load_n(&g_memory_at_mark, __ATOMIC_SEQ_CST);
}

/* ---- logevery_sync (run with GPUGUARD_LOG_EVERY): 10 MiB until two memory lines
 * were written; MARK before; 30 MiB for a moment; MARK spike; 10 MiB until three
 * more lines come after MARK spike in the output; MARK end. Of those three, the
 * last two were begun after the first was written, so after the spike: they see
 * 10 MiB live, and the last one's period holds no spike ---- */
static int mode_logevery_sync(int argc, char **argv)
{
    (void)argc; (void)argv;
    tee_stderr();
    setup();
    CUdeviceptr a = dev_alloc(10 * MiB);
    wait_memory_lines(2);
    fprintf(stderr, "MARK before\n");
    CUdeviceptr b = dev_alloc(20 * MiB);
    dev_free(b);
    wait_memory_lines(mark_seen("spike") + 3);
    fprintf(stderr, "MARK end\n");
    dev_free(a);
    puts("OK");
    return 0;
}

/* ---- logevery N (run with GPUGUARD_LOG_EVERY): 10 MiB held until gpuguard has
 * written N memory lines (a handshake on its own output, through the tee: its helper
 * thread has run through N periods, whatever the machine's load) ---- */
static int mode_logevery(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 3;
    tee_stderr();
    setup();
    CUdeviceptr a = dev_alloc(10 * MiB);
    wait_memory_lines(n);
    fprintf(stderr, "MARK end\n");
    dev_free(a);
    puts("OK");
    return 0;
}

/* Waits until the trace ($GPUGUARD_TRACE) holds `text` (GG_WAIT_BOUND_MS at most):
 * the helper thread has written that sample. */
static void wait_trace(const char *text)
{
    const char *path = getenv("GPUGUARD_TRACE");
    static char buf[1 << 20];
    for (long waited = 0; path && waited < GG_WAIT_BOUND_MS; waited++) {
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f) fclose(f);
        buf[n] = 0;
        if (strstr(buf, text)) return;
        sleep_ms(1);
    }
    fprintf(stderr, "gave up waiting for %s in the trace\n", text);
}

/* ---- spike (run with GPUGUARD_TRACE): 10 MiB until the trace has that sample;
 * 500 MiB for a moment (made and freed between two of the helper's samples); then
 * 11 MiB until the trace has that sample too; all freed ---- */
static int mode_spike(int argc, char **argv)
{
    (void)argc; (void)argv;
    setup();
    CUdeviceptr a = dev_alloc(10 * MiB);
    wait_trace("\"live\":10485760,");
    CUdeviceptr b = dev_alloc(500 * MiB);
    dev_free(b);
    CUdeviceptr c = dev_alloc(1 * MiB);
    wait_trace("\"live\":11534336,");
    dev_free(c);
    dev_free(a);
    puts("OK");
    return 0;
}

/* ---- capi: caps set and lifted at run time, a trim on request ---- */
static int mode_capi(int argc, char **argv)
{
    (void)argc; (void)argv;
    setup();
    CUdeviceptr a = dev_alloc(4 * MiB);
    set_cap(16 * MiB);
    CUdeviceptr b;
    rc_line("over_cap", cuMemAlloc_v2(&b, 20 * MiB));
    set_cap(0);
    int rc = cuMemAlloc_v2(&b, 20 * MiB);
    rc_line("uncapped", rc);
    if (rc == 0) alloc_line(b, 20 * MiB, 0, "device");
    set_cap(8 * MiB);
    step("capped");
    print_gg();
    if (rc == 0) dev_free(b);
    trim_now();
    dev_free(a);
    puts("OK");
    return 0;
}

/* ---- tags: 3 MiB under "train", 5 MiB under "eval" inside it, 7 MiB untagged,
 * 11 MiB under "eval" in another thread; all left behind ---- */
typedef int (*gg_push_fn)(const char *);
typedef int (*gg_pop_fn)(void);

static void *tagged_thread(void *arg)
{
    (void)arg;
    gg_push_fn push = (gg_push_fn)dlsym(RTLD_DEFAULT, "gpuguard_push_tag");
    gg_pop_fn pop = (gg_pop_fn)dlsym(RTLD_DEFAULT, "gpuguard_pop_tag");
    setup();
    rc_line("push_thread", push("eval"));
    CUdeviceptr p = dev_alloc(11 * MiB);
    leak_line(p, 11 * MiB);
    rc_line("pop_thread", pop());
    return NULL;
}

/* ---- tags_burst MS: `burst_for` under the label "burst" (past GPUGUARD_STACK_RATE
 * most allocations are sampled out): all left behind ---- */
static int mode_tags_burst(int argc, char **argv)
{
    long ms = argc > 1 ? atol(argv[1]) : 300;
    gg_push_fn push = (gg_push_fn)dlsym(RTLD_DEFAULT, "gpuguard_push_tag");
    if (!push) {
        puts("GG absent");
        return 0;
    }
    setup();
    rc_line("push_burst", push("burst"));
    int n = burst_for(ms);
    if (n < 0) return 1;
    printf("BURST n=%d\n", n);
    puts("OK");
    return 0;
}

static int mode_tags(int argc, char **argv)
{
    (void)argc; (void)argv;
    gg_push_fn push = (gg_push_fn)dlsym(RTLD_DEFAULT, "gpuguard_push_tag");
    gg_pop_fn pop = (gg_pop_fn)dlsym(RTLD_DEFAULT, "gpuguard_pop_tag");
    if (!push || !pop) {
        puts("GG absent");
        return 0;
    }
    setup();
    rc_line("push_train", push("train"));
    CUdeviceptr a = dev_alloc(3 * MiB);
    leak_line(a, 3 * MiB);
    rc_line("push_eval", push("eval"));
    CUdeviceptr b = dev_alloc(5 * MiB);
    leak_line(b, 5 * MiB);
    rc_line("pop_eval", pop());
    rc_line("pop_train", pop());
    rc_line("pop_none", pop());
    rc_line("push_null", push(NULL));
    CUdeviceptr c = dev_alloc(7 * MiB);
    leak_line(c, 7 * MiB);
    pthread_t t;
    pthread_create(&t, NULL, tagged_thread, NULL);
    pthread_join(t, NULL);
    puts("OK");
    return 0;
}

static const struct gg_mode g_modes[] = {
    {"tags", mode_tags},
    {"tags_burst", mode_tags_burst},
    {"trace", mode_trace},
    {"hold", mode_hold},
    {"fork_hold", mode_fork_hold},
    {"warnloop", mode_warnloop},
    {"warn_exit", mode_warn_exit},
    {"logevery", mode_logevery},
    {"logevery_sync", mode_logevery_sync},
    {"spike", mode_spike},
    {"capi", mode_capi},
    {NULL, NULL},
};

int main(int argc, char **argv) { return gg_dispatch(g_modes, argc, argv); }

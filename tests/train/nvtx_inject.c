/* nvtx_inject.c - an NVTX injection library for the tests: a tool as NVTX v3 loads one (the path
 * in NVTX_INJECTION64_PATH, its InitializeInjectionNvtx2 handed NVTX's export table), which takes
 * over the core ranges (RangePushEx, RangePushA, RangePop) of the NVTX instance that loaded it
 * and appends each call to NVTX_TEST_DIR/nvtx.<pid>.log as one line:
 *   init <pid> <OMPI_COMM_WORLD_RANK or ->    (first: NVTX loaded this library)
 *   push <tid> <message> <int64 payload or ->
 *   pop <tid>
 * Each line is one write(2) to a file opened with O_APPEND, so lines stay whole across threads.
 */
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <nvtx3/nvToolsExt.h>

static int log_fd = -1;

static void log_line(const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n > 0 && log_fd >= 0)
        (void)!write(log_fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

static void log_push(const char *message, const nvtxEventAttributes_t *a)
{
    if (a && a->payloadType == NVTX_PAYLOAD_TYPE_INT64)
        log_line("push %d %s %lld\n", (int)gettid(), message, (long long)a->payload.llValue);
    else
        log_line("push %d %s -\n", (int)gettid(), message);
}

static int inject_push_ex(const nvtxEventAttributes_t *a)
{
    int ascii = a && a->messageType == NVTX_MESSAGE_TYPE_ASCII && a->message.ascii;
    log_push(ascii ? a->message.ascii : "?", a);
    return 0;
}

static int inject_push_a(const char *message)
{
    log_push(message ? message : "?", NULL);
    return 0;
}

static int inject_pop(void)
{
    log_line("pop %d\n", (int)gettid());
    return 0;
}

/* NVTX's entry point into a tool: non-zero when it attached. */
int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_table);
int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_table)
{
    const char *dir = getenv("NVTX_TEST_DIR"), *rank = getenv("OMPI_COMM_WORLD_RANK");
    char path[4096];
    if (!dir || snprintf(path, sizeof path, "%s/nvtx.%d.log", dir, (int)getpid()) >= (int)sizeof path)
        return 0;
    const NvtxExportTableCallbacks *cb = get_table ? get_table(NVTX_ETID_CALLBACKS) : NULL;
    NvtxFunctionTable core = NULL;
    unsigned int size = 0;
    if (!cb || !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &core, &size) ||
        size < NVTX_CBID_CORE_RangePop)
        return 0;
    log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0)
        return 0;
    *core[NVTX_CBID_CORE_RangePushEx] = (NvtxFunctionPointer)inject_push_ex;
    *core[NVTX_CBID_CORE_RangePushA] = (NvtxFunctionPointer)inject_push_a;
    *core[NVTX_CBID_CORE_RangePop] = (NvtxFunctionPointer)inject_pop;
    log_line("init %d %s\n", (int)getpid(), rank ? rank : "-");
    return 1;
}

/* train_report.c - ddp-train output: progress bar or lines, the metrics lines (written through
 * common/jsonl.c). */
#include "train_report.h"

#include "ddp_trace.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double train_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void metrics_epoch(jsonl_file *m, const epoch_stats *e)
{
    char loss[64];
    jsonl_line(m, "{\"epoch\":%d,\"steps\":%ld,\"train_loss\":%s,\"test_accuracy\":%.6f,"
                 "\"samples_per_s\":%.1f}\n",
                 e->epoch, e->steps, jsonl_num(loss, sizeof loss, "%.6f", e->train_loss),
                 e->test_accuracy, e->samples_per_s);
}

/* A figure that may be missing (negative): JSON null, else the number. */
#define json_opt(buf, v) ((v) < 0 ? "null" : jsonl_num(buf, sizeof buf, "%.3f", (v)))
/* A count that may be missing (negative): JSON null, else the integer. */
#define json_count(buf, v) ((v) < 0 ? "null" : jsonl_num(buf, sizeof buf, "%.0f", (double)(v)))

void metrics_summary(jsonl_file *m, const train_opts *o, const run_stats *r)
{
    char loss[64], comm[256];
    jsonl_line(m, "{\"summary\":true,\"model\":\"%s\",\"backend\":\"%s\",\"world_size\":%d,"
                 "\"batch\":%d,\"accum\":%d,\"epochs\":%d,\"steps\":%ld,\"train_loss\":%s,"
                 "\"test_accuracy\":%.6f,\"samples_per_s\":%.1f,\"train_seconds\":%.3f,"
                 "\"wall_seconds\":%.3f,\"stopped_by_signal\":%s%s}\n",
                 o->model.kind == MODEL_CNN ? "cnn" : "mlp", r->backend, r->world_size, o->batch,
                 o->accum, r->epochs, r->steps,
                 jsonl_num(loss, sizeof loss, "%.6f", r->train_loss), r->test_accuracy,
                 r->samples_per_s, r->train_seconds, r->wall_seconds,
                 r->stopped_by_signal ? "true" : "false", metrics_comm(comm, sizeof comm, r));
}

const char *metrics_comm(char *buf, size_t n, const run_stats *r)
{
    char exposed[64], comm[64], hidden[64], gather[64], calls[32], bytes[32];
    snprintf(buf, n, ",\"exposed_comm_ms\":%s,\"comm_ms\":%s,\"hidden_fraction\":%s,"
             "\"gather_wait_ms\":%s,\"allgather_calls\":%s,\"allgather_bytes\":%s",
             json_opt(exposed, r->exposed_comm_ms), json_opt(comm, r->comm_ms),
             json_opt(hidden, r->hidden_fraction), json_opt(gather, r->gather_wait_ms),
             json_count(calls, r->allgather_calls), json_count(bytes, r->allgather_bytes));
    return buf;
}

/* ---- --link-check and --trace ---------------------------------------------------------------- */

ddp_status train_observe_start(ddp_ctx *ctx, const train_opts *o)
{
    if (o->link_check) {
        ddp_link_check_opts lo;
        ddp_link_check_opts_default(&lo);
        int slow = 0;
        ddp_status st = ddp_link_check(ctx, &lo, &slow);
        if (st != DDP_OK)
            return st;
        if (slow > 0)
            DDP_WARN0("--link-check: %d node(s) have links under half the median (named above); "
                      "training goes on, but every all-reduce runs at their speed", slow);
    }
    return o->trace_path ? ddp_trace_start(ctx, 0) : DDP_OK;
}

void train_comm_stats(ddp_ctx *ctx, run_stats *r)
{
    ddp_comm_stats c;
    int counted = ddp_comm_stats_get(ctx, &c) == DDP_OK;
    r->allgather_calls = counted ? (long long)c.allgather_calls : -1;
    r->allgather_bytes = counted ? (long long)c.allgather_bytes : -1;
    ddp_trace_summary t;
    (void)ddp_trace_summarize(ctx, &t); /* all -1 when it fails */
    r->exposed_comm_ms = t.exposed_comm_ms;
    r->comm_ms = t.comm_ms;
    r->hidden_fraction = t.hidden_fraction;
    r->gather_wait_ms = t.gather_wait_ms;
}

ddp_status train_observe_end(ddp_ctx *ctx, const train_opts *o)
{
    if (!o->trace_path)
        return DDP_OK;
    ddp_status st = ddp_trace_write(ctx, o->trace_path);
    if (st == DDP_OK && ddp_rank(ctx) == 0)
        printf("trace: %s (open in https://ui.perfetto.dev or chrome://tracing)\n", o->trace_path);
    return st;
}

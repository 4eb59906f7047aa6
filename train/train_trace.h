/* train_trace.h - ddp-train's optional observation of a run: the start-up link check (--link-check)
 * and the timeline (--trace FILE) with its communication summary. */
#ifndef TRAIN_TRACE_H
#define TRAIN_TRACE_H

#include "ddp.h"
#include "train_opts.h"
#include "train_report.h"

/* Before training: the link check (o->link_check; a slow node is a warning, training goes on),
 * then tracing (o->trace_path). Collective; a failure is returned on every rank. */
ddp_status train_observe_start(ddp_ctx *ctx, const train_opts *o);

/* Fills r's communication figures (means over ranks, per synchronisation) from the trace; leaves
 * them at -1 when tracing is off. Collective. */
void train_comm_stats(ddp_ctx *ctx, run_stats *r);

/* After training: rank 0 writes the trace file (when tracing). Collective. */
ddp_status train_observe_end(ddp_ctx *ctx, const train_opts *o);

#endif /* TRAIN_TRACE_H */

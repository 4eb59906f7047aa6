/* reducer_private.h - the bucketed reducer's state and the calls between its files, in layers
 * (each file calls only those below it):
 *   reducer.c        the public ddp_reducer_* calls, stage 0 (all-reduce) and stage 1
 *                    (reduce-scatter into the gradient buffer's shard)
 *   reducer_owned.c  stage 2: bucket-owned gradients
 *   reducer_core.c   what every stage shares: marking, launching ready buckets in bucket order,
 *                    waiting, shards, and the stage contracts of the public calls; it reaches a
 *                    stage only through the reducer_stage_ops that create sets.
 * Private to runtime/.
 */
#ifndef DDP_REDUCER_PRIVATE_H
#define DDP_REDUCER_PRIVATE_H

#include "internal.h"
#include "reducer_cuda.h"

/* Bucket-owned gradients: reduce-scatters under way at most; launching one more first waits for
 * the oldest (its buffer then goes back to the pool), which bounds the buffers alive. */
#define OWNED_IN_FLIGHT 2

/* What a stage does where the shared machinery (reducer_core.c) needs it; one table per stage,
 * chosen by ddp_reducer_create. */
typedef struct reducer_stage_ops {
    /* Multiplies bucket b's gradients by pre (a 16-bit wire's division before the sum). */
    ddp_status (*prescale)(ddp_reducer *r, int b, float pre);
    /* Packs bucket b as the stage sends it and starts its collective into r->requests[b]. */
    ddp_status (*start)(ddp_reducer *r, int b);
    /* Bucket-owned: waits for the oldest collective under way and recycles its buffer; NULL for
     * a stage that holds no bucket buffers. */
    void (*reap)(ddp_reducer *r);
} reducer_stage_ops;

struct ddp_reducer {
    ddp_ctx *ctx;
    const reducer_stage_ops *ops; /* the stage's behaviour (reducer_allreduce_ops, ...) */
    void *grads;          /* flat gradient buffer, backend memory (not owned) */
    ddp_dtype grad_dtype; /* element type of grads */
    ddp_dtype wire_dtype; /* element type of the all-reduces */
    void *wire;           /* (numel total) of wire_dtype, backend memory; NULL when wire = grads */
    void *stream;         /* CUDA: the caller's stream or NULL */
    int n_params;
    size_t *numel;           /* n_params: elements of each parameter (a copy) */
    size_t cap_bytes, first_cap_bytes;
    bucket_plan plan;        /* the buckets: parameter order, or ready order after a rebuild */
    int *order;              /* 1 + n_params: valid flag, then the marking order of this step */
    int *orders;             /* world_size x (1 + n_params): every rank's, gathered once */
    int n_marked;            /* parameters marked in the current micro-step */
    int order_agreed;        /* the ready order was settled (rebuilt, kept, or ranks disagreed) */
    int static_buckets;      /* never rebuild */
    int strict_order;        /* ranks marking in different orders: DDP_ERR_MISMATCH from finish */
    ddp_bucket_order bucket_order;
    int *pending;            /* per bucket: parameters not yet marked in this sync step */
    unsigned char *marked;   /* per parameter: marked in the current micro-step */
    ddp_request **requests;  /* per bucket: launched all-reduce, NULL when none */
    int next_launch;         /* first bucket not launched yet */
    int in_step;             /* begin() called, step not over (a sync step ends in finish()) */
    int sync;                /* the current micro-step communicates */
    int micro_steps;         /* micro-steps since the last finish, this one included */
    ddp_status launch_error; /* first failed launch of this sync step, DDP_OK when none */
    int defer_launch;        /* launch nothing before finish() (no overlap) */
    exposed_timer *timer; /* CUDA: exposed communication per sync step, while tracing */
    exposed_timer *recycle_timer; /* CUDA, bucket-owned: waits mid-backward for a buffer */
    exposed_timer *gather_timer;  /* CUDA, ZeRO: the forward pass's waits for the gather */
    /* ZeRO (zero_stage 1, 2): this rank's shard, the buckets' per-rank counts, the receive
     * buffer of this rank's pieces and, for stage 2, the averaged shard */
    int zero_stage;
    size_t total;            /* elements of the flat buffer */
    size_t shard_off, shard_n;
    size_t *counts;          /* n_params x world_size: bucket b's elements in each shard */
    size_t *recv_off;        /* n_params: where bucket b's piece starts in recv */
    size_t recv_next;        /* recv elements taken by the buckets launched in this step */
    void *recv;              /* shard_n (at least 1) elements of wire_dtype, backend memory */
    void *shard_grads;       /* stage 2: shard_n (at least 1) elements of grad_dtype */
    ddp_request **gather_req; /* n_params: the parameters' all-gathers, one per bucket, in
                                 launch order */
    int *gather_end;          /* n_params: per bucket, the launch index after its gather */
    int gather_launched, gather_waited;
    /* Bucket-owned gradients (zero_stage 2, grads NULL): the buckets' buffers */
    int owned;
    size_t *pack_off;         /* n_params: a parameter's element offset in its bucket's buffer */
    grad_pool *pool;
    int next_reap;            /* first launched bucket whose reduce-scatter is not waited for */
    int local_accum;          /* micro-steps that are not sync steps add into the held buffers */
    int micro_total;          /* opts.micro_total: the step's micro-batches over all ranks, or 0 */
    int order_warned;         /* a marking order other than the plan's was reported */
};

/* The stages' tables: zero_stage 0 and 1 (reducer.c), 2 (reducer_owned.c). */
extern const reducer_stage_ops reducer_allreduce_ops, reducer_sharded_ops, reducer_owned_ops;

/* reducer_core.c: the machinery every stage shares */
/* A bit per zero stage, for reducer_require_stage. */
#define REDUCER_STAGE(s) (1u << (s))
#define REDUCER_SHARDED (REDUCER_STAGE(1) | REDUCER_STAGE(2))
/* Element `offset` of buffer x of type t. */
void *reducer_elem(void *x, ddp_dtype t, size_t offset);
/* The stream the reducer orders its work on (CUDA): the caller's, else libddp's. */
void *reducer_stream(const ddp_reducer *r);
/* Elements of [off, off + len) of the flat buffer in rank q's shard. */
size_t reducer_overlap(const ddp_reducer *r, int q, size_t off, size_t len);
/* The part [*a, *e) of run k of the plan inside this rank's shard (empty when *e <= *a). */
void reducer_run_in_shard(const ddp_reducer *r, int k, size_t *a, size_t *e);
/* Bucket b's elements in each shard (r->counts row b, filled and returned). */
size_t *reducer_zero_counts(ddp_reducer *r, int b);
/* The step's micro-batches over all ranks: opts.micro_total, else world size x micro-steps. */
double reducer_micro_total(const ddp_reducer *r);
/* What a bucket is multiplied by before its collective (1 for fp32 on the wire). */
float reducer_prescale(const ddp_reducer *r);
/* Launches the buckets whose parameters are all marked (every one left with force), in bucket
 * order; bucket-owned, reaps while more than OWNED_IN_FLIGHT are under way. */
void reducer_launch_ready(ddp_reducer *r, int force);
/* Completes every launched request (in launch order); the first failure. */
ddp_status reducer_wait_all(ddp_reducer *r);
/* Logs every parameter left unmarked in the sync step (bucket-owned: in any micro-step);
 * DDP_ERR_STATE when there is one. */
ddp_status reducer_check_marked(const ddp_reducer *r);
/* A public call valid with some zero stages only (`stages`: REDUCER_STAGE bits): DDP_OK when
 * r's stage is one of them, else DDP_ERR_STATE and one error naming `who`, r's stage, the
 * stages it needs and `todo`, what to do instead. */
ddp_status reducer_require_stage(const ddp_reducer *r, unsigned stages, const char *who,
                                 const char *todo);

/* reducer_owned.c: bucket-owned gradients (zero_stage 2, grads NULL) */
/* Each parameter's place in its bucket's buffer and the pool; DDP_ERR_NOMEM (logged). */
ddp_status reducer_owned_setup(ddp_reducer *r);
/* Collective: every rank's plan is the same and every rank's create succeeded (else every rank
 * fails); st: this rank's outcome so far. */
ddp_status reducer_owned_agree(ddp_reducer *r, ddp_status st);
/* Warns once when parameters are marked in another order than the plan's. */
void reducer_owned_check_order(ddp_reducer *r, int param);
/* Every launched reduce-scatter reaped, every buffer back; the step's first failure. */
ddp_status reducer_owned_drain(ddp_reducer *r);
/* Ends a micro-step that was not a sync step; its failure. */
ddp_status reducer_owned_settle(ddp_reducer *r);

#endif /* DDP_REDUCER_PRIVATE_H */

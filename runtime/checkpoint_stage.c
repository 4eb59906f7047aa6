/* checkpoint_stage.c - the staging copy of a rank's shard for a checkpoint folder (see
 * ddp_checkpoint.h): the rank's ddp_shard_range slice of each of a program's float buffers, in a
 * state of its own allocated once and reused by every save, so that a save copies and never
 * allocates. Pinned (ddp_snapshot_pin) for saves written in the background: the copies then go on
 * the side stream and the host does not wait for them; the checkpoint manager's writer does.
 */
#include <stdio.h>
#include <stdlib.h>

#include "ddp_checkpoint.h"
#include "internal.h"

#define STAGE_MAX_BUFS 8

struct ddp_ckpt_stage {
    ddp_ctx *ctx;              /* the pinning's; NULL when not pinned */
    ddp_state *state;
    float *buf[STAGE_MAX_BUFS]; /* the state's own buffers */
    int n_bufs;
    size_t off, n;             /* this rank's ddp_shard_range slice */
};

void ddp_ckpt_stage_destroy(ddp_ckpt_stage *s)
{
    if (!s)
        return;
    for (int i = 0; s->ctx && i < s->n_bufs; i++)
        (void)ddp_snapshot_unpin(s->ctx, s->buf[i]);
    ddp_state_destroy(s->state);
    free(s);
}

/* The state: one 1-D parameter "shard" of n values, and per buffer its values and offset. */
static ddp_status stage_state(ddp_ckpt_stage *s, const char *const *names)
{
    ddp_param_desc shard = {.name = "shard", .n_dims = 1, .shape = {(int64_t)s->n}};
    ddp_status st = ddp_state_create(&shard, 1, NULL, &s->state);
    for (int i = 0; st == DDP_OK && i < s->n_bufs; i++) {
        char key[DDP_NAME_MAX + 16];
        snprintf(key, sizeof key, "shard.offset.%s", names[i]);
        st = ddp_state_f32_buffer(s->state, names[i], s->n, &s->buf[i]);
        if (st == DDP_OK)
            st = ddp_state_set_u64(s->state, key, s->off);
    }
    return st;
}

ddp_status ddp_ckpt_stage_create(ddp_ctx *ctx, size_t n_total, const char *const *names,
                                 int n_bufs, int pin, ddp_ckpt_stage **out)
{
    if (!out || (n_bufs > 0 && !names) || n_bufs < 0 || n_bufs > STAGE_MAX_BUFS)
        return DDP_ERR_INVALID_ARG;
    *out = NULL;
    ddp_ckpt_stage *s = calloc(1, sizeof *s);
    if (!s)
        return DDP_ERR_NOMEM;
    s->n_bufs = n_bufs;
    ddp_status st = ddp_shard_range(n_total, ctx ? ddp_world_size(ctx) : 1, ctx ? ddp_rank(ctx) : 0,
                                    &s->off, &s->n);
    if (st == DDP_OK)
        st = stage_state(s, names);
    if (st != DDP_OK) {
        ddp_ckpt_stage_destroy(s);
        return st;
    }
    /* a refused pinning leaves the copies going through ddp_download's bounce buffers */
    ddp_status pinned = DDP_OK;
    for (int i = 0; pin && ctx && pinned == DDP_OK && i < n_bufs; i++) {
        pinned = ddp_snapshot_pin(ctx, s->buf[i], s->n * sizeof(float));
        if (pinned == DDP_OK)
            s->ctx = ctx;
    }
    if (pinned != DDP_OK)
        DDP_WARN("checkpoint staging: page-locking %.1f MiB failed (%s): the copies for a save wait on "
                 "the host", (double)ddp_ckpt_stage_bytes(s) / (1 << 20), ddp_strerror(pinned));
    *out = s;
    return DDP_OK;
}

ddp_status ddp_ckpt_stage_copy(ddp_ckpt_stage *s, ddp_ctx *ctx, int i, const float *src)
{
    if (!s || !ctx || i < 0 || i >= s->n_bufs || (!src && s->n))
        return DDP_ERR_INVALID_ARG;
    return ddp_snapshot_copy(ctx, s->buf[i], src, s->n * sizeof(float));
}

ddp_state *ddp_ckpt_stage_state(const ddp_ckpt_stage *s) { return s ? s->state : NULL; }

void ddp_ckpt_stage_range(const ddp_ckpt_stage *s, size_t *offset, size_t *n)
{
    *offset = s ? s->off : 0;
    *n = s ? s->n : 0;
}

size_t ddp_ckpt_stage_bytes(const ddp_ckpt_stage *s)
{
    return s ? (size_t)s->n_bufs * s->n * sizeof(float) : 0;
}

/* test_straggler.c - the straggler table (ddp_straggler.h) under real mpirun with 3 ranks.
 *
 * Contracts: the defaults, bad options refused before communicating, every 0 is off (NULL),
 * NULL accepted everywhere, one table per process. Then a run of 20 steps, windows of 2 steps,
 * named after 2 slow judgements in a row: every rank's step sleeps BASE_MS and all-reduces
 * (ddp_allreduce_host, a wait the table counts); in steps 7-12 the last rank sleeps SLOW_MS more.
 * Rank 0 checks: the last rank is named at step 10 (the span 7-10 is all slow, 5-8 half) and no
 * other rank ever; its table line names its node; it is no longer named once the span is quick
 * again (step 16); the others' waits hold its extra time; the JSON and the summary agree.
 * Sleeping steps leave the CPU idle, so the CPU criterion is off here (cpu_share 0).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "ddp_straggler.h"

#define STEPS 20
#define BASE_MS 10
#define SLOW_MS 25

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static void contracts(ddp_ctx *ctx)
{
    ddp_straggler_opts o;
    ddp_straggler_opts_default(&o);
    CHECK(o.every == 5 && o.threshold == 1.5 && o.cpu_share == 0.8 && o.times == 3 &&
          o.out == stdout, "defaults %d %g %g %d", o.every, o.threshold, o.cpu_share, o.times);
    ddp_straggler *s = (ddp_straggler *)1;
    ddp_straggler_opts bad[4] = {o, o, o, o};
    bad[0].every = -1;
    bad[1].threshold = 1.0;
    bad[2].cpu_share = 1.0;
    bad[3].times = 0;
    for (int i = 0; i < 4; i++)
        CHECK(ddp_straggler_create(ctx, &bad[i], &s) == DDP_ERR_INVALID_ARG, "bad option %d", i);
    CHECK(ddp_straggler_create(NULL, &o, &s) == DDP_ERR_INVALID_ARG, "NULL ctx");
    o.every = 0;
    CHECK(ddp_straggler_create(ctx, &o, &s) == DDP_OK && s == NULL, "every 0: off, NULL");
    int closed = -1;
    ddp_straggler_step_begin(NULL);
    CHECK(ddp_straggler_step_end(NULL, 1, &closed) == DDP_OK && closed == 0, "step_end(NULL)");
    CHECK(ddp_straggler_finish(NULL, &closed) == DDP_OK && closed == 0, "finish(NULL)");
    CHECK(strcmp(ddp_straggler_json(NULL), "") == 0, "json(NULL)");
    ddp_straggler_stats st;
    CHECK(ddp_straggler_get(NULL, &st) == DDP_OK && st.step == -1, "get(NULL)");
    CHECK(ddp_straggler_get(NULL, NULL) == DDP_ERR_INVALID_ARG, "get(..., NULL)");
    ddp_straggler_destroy(NULL);
}

/* One step: the sleep, then the all-reduce the others wait in for the slow rank. */
static void step(ddp_ctx *ctx, ddp_straggler *s, long n, int slow)
{
    ddp_straggler_step_begin(s);
    sleep_ms(BASE_MS + (slow ? SLOW_MS : 0));
    double x = 1.0;
    CHECK(ddp_allreduce_host(ctx, &x, 1, DDP_FP64, DDP_SUM) == DDP_OK, "all-reduce");
    int closed = -1;
    CHECK(ddp_straggler_step_end(s, n, &closed) == DDP_OK, "step_end %ld", n);
    CHECK(closed == (ddp_rank(ctx) == 0 && n % 2 == 0), "window_closed at step %ld: %d", n, closed);
}

/* Rank 0, after step n: the ranks named, from the JSON ("named":[...]), as a bit set. */
static int named_set(const ddp_straggler *s)
{
    const char *p = strstr(ddp_straggler_json(s), "\"named\":[");
    int set = 0;
    for (p = p ? p + 9 : ""; *p >= '0' && *p <= '9'; p += *p == ',' ? 1 : 0)
        set |= 1 << strtol(p, (char **)&p, 10);
    return set;
}

static void run(ddp_ctx *ctx)
{
    int rank = ddp_rank(ctx), last = ddp_world_size(ctx) - 1;
    FILE *out = rank == 0 ? tmpfile() : NULL;
    ddp_straggler_opts o;
    ddp_straggler_opts_default(&o);
    o.every = 2;
    o.times = 2;
    o.cpu_share = 0;
    o.out = out;
    ddp_straggler *s = NULL, *second = NULL;
    CHECK(ddp_straggler_create(ctx, &o, &s) == DDP_OK && s, "create");
    CHECK(ddp_straggler_create(ctx, &o, &second) == DDP_ERR_STATE && !second, "one per process");
    long first_named = -1, cleared = -1;
    int others_named = 0;
    for (long n = 1; s && n <= STEPS; n++) {
        step(ctx, s, n, rank == last && n >= 7 && n <= 12);
        if (rank != 0 || n % 2)
            continue;
        int set = named_set(s);
        others_named |= set & ~(1 << last);
        if (first_named < 0 && (set >> last & 1))
            first_named = n;
        if (first_named > 0 && cleared < 0 && !(set >> last & 1))
            cleared = n;
        if (n == 12) {
            CHECK(strstr(ddp_straggler_json(s), "\"step\":12,\"steps\":2,") != NULL, "JSON: %s",
                  ddp_straggler_json(s));
            ddp_straggler_stats st;
            CHECK(ddp_straggler_get(s, &st) == DDP_OK && st.step == 12 && st.n_named == 1 &&
                  st.slowest_rank == last && st.max_ratio > 1.5, "stats at 12: %ld %d %d %g",
                  st.step, st.n_named, st.slowest_rank, st.max_ratio);
        }
    }
    int closed = -1;
    CHECK(ddp_straggler_finish(s, &closed) == DDP_OK && closed == 0, "finish: no window open");
    ddp_straggler_destroy(s);
    if (rank != 0)
        return;
    CHECK(first_named == 10, "the last rank named at step %ld, want 10", first_named);
    CHECK(cleared == 16, "no longer named at step %ld, want 16", cleared);
    CHECK(others_named == 0, "other ranks named: %#x", others_named);
    char text[4096] = "", want[512];
    rewind(out);
    text[fread(text, 1, sizeof text - 1, out)] = '\0';
    fclose(out);
    printf("%s", text);
    snprintf(want, sizeof want, "straggler table at step 10: 1 rank(s) slow (compute over 1.5x the "
             "others' median, 2 checks in a row):\n  rank %d (node %s): compute ", last,
             ddp_hostname(ctx));
    CHECK(strstr(text, want) != NULL, "the table line at step 10 names rank %d and its node", last);
    snprintf(want, sizeof want, "  rank %d (node %s) is no longer slow", last, ddp_hostname(ctx));
    CHECK(strstr(text, want) != NULL, "the table says when it is no longer slow");
    snprintf(want, sizeof want, "straggler table: 20 steps in 10 windows of 2; 1 rank(s) ever "
             "named; slowest rank %d (node %s)", last, ddp_hostname(ctx));
    CHECK(strstr(text, want) != NULL, "the summary names it");
}

int main(void)
{
    ddp_ctx *ctx = NULL;
    ddp_init_opts io;
    ddp_init_opts_default(&io);
    io.backend = DDP_BACKEND_CPU;
    io.print_table = 0;
    if (ddp_init(&io, &ctx) != DDP_OK)
        return 1;
    contracts(ctx);
    run(ctx);
    ddp_finalize(ctx);
    return CHECK_DONE();
}

/* jobtable.c - the --print-env job table: every rank writes its start-up line (host, node, local
 * rank, GPU, CPU set, threads, OpenBLAS core, log files) to a shared folder, and rank 0 waits for
 * them and prints them in rank order, naming the ranks whose line did not arrive. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "launcher.h"

static void table_line(const struct launch_layout *l, const struct launch_setup *s, char *out, size_t len)
{
    char gpu[LAUNCH_GPU_ID_LEN + 16] = "cpu";
    if (s->gpu.device >= 0) {
        struct launch_gpu_list vis;
        char err[LAUNCH_ERRMSG_LEN];
        launch_gpu_list_parse(s->gpu.visible, &vis, err, sizeof err);
        snprintf(gpu, sizeof gpu, "%d(%s)", s->gpu.device, vis.id[s->gpu.device]);
    }
    snprintf(out, len, "%6d  %-20s %5d %6d  %-12s %-18s %7d  %-18s CUDA_VISIBLE_DEVICES=%.600s%s%.700s\n", l->rank,
             s->host, l->node_rank, l->local_rank, gpu, s->cpuset, s->threads, s->blas_note,
             s->gpu.device >= 0 ? s->gpu.visible : "(unset)", s->logs[0] ? "  LOGS=" : "", s->logs);
}

static void print_dir(const struct launch_layout *l, char *dir, size_t len)
{
    const char *set = getenv("DDP_PRINT_DIR");
    if (set) {
        snprintf(dir, len, "%s", set);
        return;
    }
    snprintf(dir, len, "/tmp/ddp-printenv-%s", l->job_key);
    for (char *p = dir + strlen("/tmp/"); *p; p++)
        if (*p == '/')
            *p = '_';
}

static int write_line(const char *dir, int rank, const char *line)
{
    char tmp[4200], path[4200];
    FILE *f;
    snprintf(tmp, sizeof tmp, "%s/.rank-%d.tmp", dir, rank);
    snprintf(path, sizeof path, "%s/rank-%d", dir, rank);
    f = fopen(tmp, "w");
    if (!f)
        return -1;
    fputs(line, f);
    return fclose(f) == 0 && rename(tmp, path) == 0 ? 0 : -1;
}

/* Waits up to the timeout for every rank's line in DIR; returns how many arrived. */
static int wait_for_lines(const char *dir, int world_size)
{
    const char *t = getenv("DDP_PRINT_TIMEOUT");
    double timeout = t ? atof(t) : 10.0, waited = 0;
    int present = 0;
    for (;;) {
        char path[4200];
        present = 0;
        for (int r = 0; r < world_size; r++) {
            snprintf(path, sizeof path, "%s/rank-%d", dir, r);
            present += access(path, F_OK) == 0;
        }
        if (present == world_size || waited >= timeout)
            return present;
        nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
        waited += 0.05;
    }
}

/* Prints the lines found in DIR in rank order, naming the missing ranks, and removes them. */
static void print_table(const struct launch_layout *l, const char *dir)
{
    int missing = 0;
    char *absent = calloc((size_t)l->world_size, 1); /* absent[r]: rank r's line was not there */
    printf("ddp-launch: launcher=%s world_size=%d nodes=%d local_world_size=%d MASTER_ADDR=%s MASTER_PORT=%d\n",
           launch_source_name(l->source), l->world_size, l->n_nodes, l->local_world_size, l->master_addr, l->master_port);
    printf("%6s  %-20s %5s %6s  %-12s %-18s %7s  %-18s %s\n", "RANK", "HOST", "NODE", "LOCAL", "GPU", "CPUSET", "THREADS",
           "OPENBLAS_CORETYPE", "ENV");
    for (int r = 0; r < l->world_size; r++) {
        char path[4200], line[4096];
        FILE *f;
        snprintf(path, sizeof path, "%s/rank-%d", dir, r);
        f = fopen(path, "r");
        if (!f) {
            missing++;
            if (absent)
                absent[r] = 1;
            continue;
        }
        if (fgets(line, sizeof line, f))
            fputs(line, stdout);
        fclose(f);
        unlink(path);
    }
    if (missing)
        printf("ddp-launch: %d rank(s) did not report within the timeout:\n", missing);
    for (int r = 0; missing && absent && r < l->world_size; r++)
        if (absent[r])
            printf("  rank %d missing (not started, or DDP_PRINT_DIR=%s not shared with its node)\n", r, dir);
    free(absent);
    rmdir(dir);
    fflush(stdout);
}

int launch_table_gather(const struct launch_layout *l, const struct launch_setup *s, char *err, size_t errlen)
{
    char dir[4096], line[4096];
    table_line(l, s, line, sizeof line);
    print_dir(l, dir, sizeof dir);
    if ((mkdir(dir, 0777) != 0 && errno != EEXIST) || write_line(dir, l->rank, line) != 0) {
        snprintf(err, errlen, "cannot write to %s; --print-env shows this rank's line only", dir);
        fputs(line, stdout);
        return 1;
    }
    if (l->rank != 0)
        return 0;
    wait_for_lines(dir, l->world_size);
    print_table(l, dir);
    return 0;
}

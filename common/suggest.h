/* suggest.h - "did you mean": the long option nearest to a mistyped one, and whether this process
 * is the job's first rank (usage errors are printed once per job, not once per rank). Shared by
 * ddp-launch and ddp-train. */
#ifndef COMMON_SUGGEST_H
#define COMMON_SUGGEST_H

#include <getopt.h>
#include <stdbool.h>

/* The name (without dashes) of the option in longs (getopt_long's table, ended by a NULL name)
 * nearest to arg ("--max_steps", "--max_steps=3", "-lr"), or NULL when none is near: the same name
 * with '_' for '-' (torchrun's spelling), else the least edit distance, at most 1 for names of up
 * to 4 letters and at most 2 (or a third of the name) for longer ones. */
const char *suggest_option(const struct option *longs, const char *arg);

/* 1 unless a launcher's rank variable (RANK, OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK,
 * SLURM_PROCID, in that order) says this process is another rank than 0. */
int suggest_first_rank(void);

/* A usage error on stderr, by the job's first rank only: "PROG: WHAT 'ARG'", then "; did you mean
 * --NAME?" when unknown is set and an option of longs is near arg, then tail (which ends the
 * line, e.g. " (see PROG --help)\n"). */
void suggest_usage_error(const char *prog, const struct option *longs, bool unknown,
                         const char *what, const char *arg, const char *tail);

#endif /* COMMON_SUGGEST_H */

/* progress.c - a training run's progress on stdout (progress.h). */
#include "progress.h"

#include <math.h>
#include <stdio.h>
#include <unistd.h>

#define PROGRESS_BAR_WIDTH 30

void progress_init(progress_bar *p, int log_every, long total_steps, long samples_per_step)
{
    /* stderr tells a person's terminal: under mpirun stdout is a pseudo-terminal of its own */
    *p = (progress_bar){.tty = isatty(STDOUT_FILENO) && isatty(STDERR_FILENO),
                        .log_every = log_every, .total_steps = total_steps,
                        .samples_per_step = samples_per_step, .unit = "samples"};
}

/* Seconds per step at step `step`: after the steady clock's mark, over the steps since it. */
static double progress_step_seconds(const progress_bar *p, long step)
{
    if (step > p->base_step && p->train_seconds > p->base_seconds && p->base_step > p->first_step)
        return (p->train_seconds - p->base_seconds) / (double)(step - p->base_step);
    return step > p->first_step ? p->train_seconds / (double)(step - p->first_step) : 0.0;
}

/* " | 123.4 ms/step | 38.2 % MFU" for a model that counts its FLOPs (the MFU part when the peak
 * is known), else "". */
static void progress_flops(char *buf, size_t n, const progress_bar *p, double per_step)
{
    buf[0] = '\0';
    if (!(p->flops_per_step > 0.0) || !(per_step > 0.0))
        return;
    int len = snprintf(buf, n, " | %.1f ms/step", 1e3 * per_step);
    if (p->peak_flops > 0.0 && len > 0 && (size_t)len < n)
        snprintf(buf + len, n - (size_t)len, " | %.1f %% MFU",
                 100.0 * p->flops_per_step / per_step / p->peak_flops);
}

/* Writes "12m05s" style durations. */
static void format_duration(char *buf, size_t n, double seconds)
{
    long s = seconds > 0 ? (long)(seconds + 0.5) : 0;
    if (s >= 3600)
        snprintf(buf, n, "%ldh%02ldm", s / 3600, (s / 60) % 60);
    else
        snprintf(buf, n, "%ldm%02lds", s / 60, s % 60);
}

int progress_due(const progress_bar *p, long step)
{
    return step % p->log_every == 0 || step == p->total_steps || step == p->first_step + 1;
}

void progress_update(progress_bar *p, long step, int epoch, double loss)
{
    if (!p->tty && !progress_due(p, step))
        return;
    double per_step = progress_step_seconds(p, step);
    double rate = per_step > 0 ? (double)p->samples_per_step / per_step : 0.0;
    p->rate = rate;
    p->mfu = p->flops_per_step > 0.0 && p->peak_flops > 0.0 && per_step > 0.0
                 ? p->flops_per_step / per_step / p->peak_flops : NAN;
    char eta[32], flops[64];
    long left = p->total_steps - step, evals = p->eval_every > 0 ? left / p->eval_every : 0;
    evals += step < p->total_steps; /* the one at the end */
    format_duration(eta, sizeof eta, per_step * (double)left + p->eval_seconds * (double)evals);
    progress_flops(flops, sizeof flops, p, per_step);
    if (!p->tty) {
        printf("step %ld/%ld epoch %d loss %.4f%s | %.0f %s/s | ETA %s%s\n", step, p->total_steps,
               epoch + 1, loss, p->extra, rate, p->unit, eta, flops);
        fflush(stdout);
        return;
    }
    int filled = (int)((double)PROGRESS_BAR_WIDTH * (double)step / (double)p->total_steps);
    char bar[PROGRESS_BAR_WIDTH + 1];
    for (int i = 0; i < PROGRESS_BAR_WIDTH; i++)
        bar[i] = i < filled ? '#' : '.';
    bar[PROGRESS_BAR_WIDTH] = '\0';
    printf("\r[%s] %ld/%ld epoch %d loss %.4f%s | %.0f %s/s | ETA %s%s  ", bar, step,
           p->total_steps, epoch + 1, loss, p->extra, rate, p->unit, eta, flops);
    fflush(stdout);
}

void progress_end(const progress_bar *p)
{
    if (p->tty)
        fputc('\n', stdout);
}


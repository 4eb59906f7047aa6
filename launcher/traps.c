/* traps.c - recognises launches known to fail or hang (an Open MPI program under `srun --mpi=pmi2`
 * or `--mpi=none`, MPI programs under the other MPI's launcher) and says how to fix them. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launcher.h"

int launch_find_program(char *const *envp, const char *program, char *path_out, size_t len)
{
    const char *dirs = launch_env_get(envp, "PATH");
    if (strchr(program, '/')) {
        snprintf(path_out, len, "%s", program);
        return access(path_out, X_OK);
    }
    for (const char *p = dirs ? dirs : "/usr/bin:/bin"; *p;) {
        size_t n = strcspn(p, ":");
        snprintf(path_out, len, "%.*s/%s", (int)n, n ? p : ".", program);
        if (access(path_out, X_OK) == 0)
            return 0;
        p += n + (p[n] == ':');
    }
    return -1;
}

/* The output of `ldd PATH` (at most LEN-1 bytes) into OUT; "" when ldd fails. */
static void run_ldd(const char *path, char *out, size_t len)
{
    int fds[2];
    size_t used = 0;
    pid_t pid;
    out[0] = '\0';
    if (pipe(fds) != 0)
        return;
    pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        dup2(fds[1], STDOUT_FILENO);
        dup2(devnull, STDERR_FILENO);
        close(fds[0]);
        execlp("ldd", "ldd", path, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    for (ssize_t got = 1; pid > 0 && got > 0 && used + 1 < len; used += (size_t)got)
        got = read(fds[0], out + used, len - 1 - used);
    out[used < len ? used : len - 1] = '\0';
    close(fds[0]);
    if (pid > 0)
        waitpid(pid, NULL, 0);
}

enum launch_mpi_flavour launch_program_mpi(char *const *envp, const char *program)
{
    const char *forced = launch_env_get(envp, "DDP_MPI_PROGRAM");
    static char libs[64 * 1024];
    char path[4096];
    if (forced)
        return strcmp(forced, "openmpi") == 0 ? LAUNCH_MPI_OPENMPI : strcmp(forced, "mpich") == 0 ? LAUNCH_MPI_MPICH : LAUNCH_MPI_NONE;
    if (launch_find_program(envp, program, path, sizeof path) != 0)
        return LAUNCH_MPI_NONE;
    run_ldd(path, libs, sizeof libs);
    if (strstr(libs, "libmpi.so.40") || strstr(libs, "libopen-pal.so") || strstr(libs, "libopen-rte.so"))
        return LAUNCH_MPI_OPENMPI;
    if (strstr(libs, "libmpich") || strstr(libs, "libmpi.so.12"))
        return LAUNCH_MPI_MPICH;
    return LAUNCH_MPI_NONE;
}

int launch_check_traps(char *const *envp, const struct launch_layout *layout, enum launch_mpi_flavour mpi,
                       char *err, size_t errlen)
{
    const char *type = launch_env_get(envp, "SLURM_MPI_TYPE");
    if (layout->source == LAUNCH_SOURCE_SRUN && mpi == LAUNCH_MPI_OPENMPI && !launch_env_get(envp, "PMIX_RANK")) {
        snprintf(err, errlen, "srun started this Open MPI program without PMIx (SLURM_MPI_TYPE=%s): Open MPI 4 "
                 "cannot use Slurm's PMI-1/PMI-2 (\"OMPI was not built with SLURM's PMI support\"). Fix: srun --mpi=pmix "
                 "(or MpiDefault=pmix in slurm.conf), or start it with mpirun inside the allocation",
                 type ? type : "unset");
        return -1;
    }
    if (layout->source == LAUNCH_SOURCE_HYDRA && mpi == LAUNCH_MPI_OPENMPI) {
        snprintf(err, errlen, "MPICH's mpiexec (Hydra) started an Open MPI program: every rank would run alone as a "
                 "singleton. Fix: start it with Open MPI's mpirun, or srun --mpi=pmix");
        return -1;
    }
    if (layout->source == LAUNCH_SOURCE_MPIRUN && mpi == LAUNCH_MPI_MPICH) {
        snprintf(err, errlen, "Open MPI's mpirun started an MPICH program: every rank would run alone as a "
                 "singleton. Fix: start it with MPICH's mpiexec, or srun --mpi=pmi2");
        return -1;
    }
    return 0;
}

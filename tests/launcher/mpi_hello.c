/* mpi_hello.c - an Open MPI program for the launcher tests: ddp-launch must recognise it (ldd) as
 * an MPI program; when run, it prints its MPI rank and the launcher's RANK. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    int rank, size;
    const char *env_rank = getenv("RANK");
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    printf("mpi rank %d of %d, RANK=%s\n", rank, size, env_rank ? env_rank : "unset");
    MPI_Finalize();
    return 0;
}

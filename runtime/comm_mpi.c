/* comm_mpi.c - placeholder: being written. */
#include "internal.h"

/* comm_nccl.c - placeholder: being written. */
#include "internal.h"

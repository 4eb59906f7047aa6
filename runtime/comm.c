/* comm.c - placeholder: being written. */
#include "internal.h"

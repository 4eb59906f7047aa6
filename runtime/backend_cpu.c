/* backend_cpu.c - placeholder: being written. */
#include "internal.h"

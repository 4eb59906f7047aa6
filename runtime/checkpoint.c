/* checkpoint.c - placeholder: being written. */
#include "internal.h"

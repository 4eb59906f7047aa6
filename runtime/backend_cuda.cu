/* backend_cuda.cu - placeholder: being written. */
#include "internal.h"

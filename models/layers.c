/* layers.c - placeholder: being written. */
#include "ddp.h"
int ddp_placeholder_layers;

/* gpumap.c - placeholder. */
int ddp_placeholder_gpumap;

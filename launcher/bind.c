/* bind.c - placeholder. */
int ddp_placeholder_bind;

/* env.c - placeholder. */
int ddp_placeholder_env;

/* hostlist.c - placeholder. */
int ddp_placeholder_hostlist;

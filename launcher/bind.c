/* bind.c - CPU binding with hwloc: splits the allowed cores among a node's ranks, nearest their
 * GPU when known, keeps a binding that Slurm or mpirun already made, and binds this rank. Without
 * hwloc only launch_bind_rank is built, and it binds nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "launcher.h"

#if HAVE_HWLOC

int launch_topology_load(hwloc_topology_t *topo, const char *synthetic, int with_io, char *err,
                         size_t errlen)
{
    if (hwloc_topology_init(topo) != 0) {
        snprintf(err, errlen, "hwloc: cannot initialise a topology");
        return -1;
    }
    if ((synthetic && hwloc_topology_set_synthetic(*topo, synthetic) != 0) ||
        (with_io && hwloc_topology_set_io_types_filter(*topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT) != 0) ||
        hwloc_topology_load(*topo) != 0) {
        snprintf(err, errlen, "hwloc: cannot load the %s topology", synthetic ? synthetic : "machine's");
        hwloc_topology_destroy(*topo);
        return -1;
    }
    return 0;
}

/* The unit that shares of SET are made of: its whole cores, or its PUs when it holds no whole core. */
static hwloc_obj_type_t unit_type(hwloc_topology_t topo, hwloc_const_cpuset_t set)
{
    return hwloc_get_nbobjs_inside_cpuset_by_type(topo, set, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
}

int launch_bind_split(hwloc_topology_t topo, hwloc_const_cpuset_t domain, int index, int count,
                      hwloc_cpuset_t out)
{
    hwloc_obj_type_t type = unit_type(topo, domain);
    int n = hwloc_get_nbobjs_inside_cpuset_by_type(topo, domain, type);
    int first, last;
    hwloc_bitmap_zero(out);
    if (n <= 0 || count <= 0 || index < 0 || index >= count)
        return -1;
    first = count <= n ? (int)((long)index * n / count) : index % n;
    last = count <= n ? (int)((long)(index + 1) * n / count) : first + 1;
    for (int i = first; i < last; i++) {
        hwloc_obj_t unit = hwloc_get_obj_inside_cpuset_by_type(topo, domain, type, (unsigned)i);
        hwloc_bitmap_or(out, out, unit->cpuset);
    }
    hwloc_bitmap_and(out, out, domain);
    return 0;
}

int launch_gpu_near_cpuset(hwloc_topology_t topo, const char *busid, hwloc_cpuset_t out)
{
    hwloc_obj_t dev = busid && *busid ? hwloc_get_pcidev_by_busidstring(topo, busid) : NULL;
    hwloc_obj_t near = dev ? hwloc_get_non_io_ancestor_obj(topo, dev) : NULL;
    if (!near || !near->cpuset)
        return -1;
    hwloc_bitmap_copy(out, near->cpuset);
    return 0;
}

/* The CPUs near local rank R's GPU within ALLOWED, into OUT; 0 when there are some. */
static int near_of(const struct launch_bind_request *req, hwloc_const_cpuset_t allowed, int r, hwloc_cpuset_t out)
{
    if (!req->gpu_near || !req->gpu_near[r])
        return -1;
    hwloc_bitmap_and(out, req->gpu_near[r], allowed);
    return hwloc_bitmap_iszero(out) ? -1 : 0;
}

/* Splits the CPUs near this rank's GPU among the local ranks with the same locality; -1 when
 * this rank has none (or its GPU is near all allowed CPUs, where the plain split is better). */
static int split_by_gpu(hwloc_topology_t topo, const struct launch_bind_request *req,
                        hwloc_const_cpuset_t allowed, hwloc_cpuset_t out)
{
    hwloc_bitmap_t mine = hwloc_bitmap_alloc(), other = hwloc_bitmap_alloc();
    int index = 0, count = 0, rc = -1;
    if (near_of(req, allowed, req->local_rank, mine) == 0 && !hwloc_bitmap_isequal(mine, allowed)) {
        for (int r = 0; r < req->local_size; r++) {
            if (near_of(req, allowed, r, other) == 0 && hwloc_bitmap_isequal(mine, other)) {
                index += r < req->local_rank;
                count++;
            }
        }
        rc = launch_bind_split(topo, mine, index, count, out);
    }
    hwloc_bitmap_free(mine);
    hwloc_bitmap_free(other);
    return rc;
}

int launch_bind_plan(hwloc_topology_t topo, const struct launch_bind_request *req, hwloc_cpuset_t out,
                     enum launch_bind_action *action)
{
    hwloc_const_cpuset_t allowed = hwloc_topology_get_allowed_cpuset(topo);
    int bound_already = hwloc_bitmap_isincluded(req->current, allowed) && !hwloc_bitmap_isequal(req->current, allowed);
    if (req->mode == LAUNCH_BIND_NONE || (req->mode == LAUNCH_BIND_AUTO && bound_already)) {
        hwloc_bitmap_copy(out, req->current);
        *action = req->mode == LAUNCH_BIND_NONE ? LAUNCH_BIND_UNBOUND : LAUNCH_BIND_KEPT;
        return 0;
    }
    *action = LAUNCH_BIND_BOUND;
    if (split_by_gpu(topo, req, allowed, out) == 0)
        return 0;
    return launch_bind_split(topo, allowed, req->local_rank, req->local_size, out);
}

int launch_cpuset_cores(hwloc_topology_t topo, hwloc_const_cpuset_t set)
{
    int n = hwloc_get_nbobjs_inside_cpuset_by_type(topo, set, unit_type(topo, set));
    return n > 0 ? n : 1;
}

/* The CPUs near each local rank's GPU, when the GPUs' bus ids are known and not narrowed. */
static void gpu_near_sets(hwloc_topology_t topo, const struct launch_gpu_list *gpus, const struct launch_layout *l,
                          int share_gpus, hwloc_cpuset_t *near)
{
    char err[LAUNCH_ERRMSG_LEN];
    for (int r = 0; r < l->local_world_size; r++) {
        struct launch_gpu_choice c;
        near[r] = NULL;
        if (launch_gpu_map(gpus, 0, r, l->local_world_size, share_gpus, &c, err, sizeof err) != 0 || c.device < 0)
            continue;
        near[r] = hwloc_bitmap_alloc();
        if (launch_gpu_near_cpuset(topo, gpus->busid[c.device], near[r]) != 0) {
            hwloc_bitmap_free(near[r]);
            near[r] = NULL;
        }
    }
}

/* Plans this rank's binding on TOPO and (unless dry-run) applies it; fills cpuset and threads.
 * Returns 0, 1 when the chosen CPUs could not be bound, -1 when there is nothing to bind to. */
static int plan_and_bind(hwloc_topology_t topo, const struct launch_options *opt, const struct launch_layout *l,
                         hwloc_cpuset_t *near, struct launch_setup *s, char *err, size_t errlen)
{
    hwloc_bitmap_t current = hwloc_bitmap_alloc(), chosen = hwloc_bitmap_alloc();
    enum launch_bind_action action = LAUNCH_BIND_UNBOUND;
    int rc = 0;
    hwloc_get_cpubind(topo, current, HWLOC_CPUBIND_PROCESS);
    struct launch_bind_request req = {opt->bind, current, l->local_rank, l->local_world_size, (hwloc_const_cpuset_t *)near};
    if (launch_bind_plan(topo, &req, chosen, &action) != 0) {
        snprintf(err, errlen, "hwloc: no allowed CPU to bind this rank to");
        rc = -1;
    } else if (action == LAUNCH_BIND_BOUND && !opt->dry_run && hwloc_set_cpubind(topo, chosen, HWLOC_CPUBIND_PROCESS) != 0) {
        snprintf(err, errlen, "could not bind to the chosen CPUs; running unbound");
        rc = 1;
    }
    hwloc_bitmap_list_snprintf(s->cpuset, sizeof s->cpuset, chosen);
    s->threads = launch_cpuset_cores(topo, chosen);
    if (action == LAUNCH_BIND_UNBOUND)
        s->threads = s->threads / l->local_world_size > 0 ? s->threads / l->local_world_size : 1;
    hwloc_bitmap_free(current);
    hwloc_bitmap_free(chosen);
    return rc;
}

int launch_bind_rank(const struct launch_options *opt, const struct launch_layout *l, const struct launch_gpu_list *gpus,
                     int narrowed, struct launch_setup *s, char *err, size_t errlen)
{
    hwloc_topology_t topo;
    int with_io = gpus->n > 0 && !narrowed && gpus->busid[0][0];
    hwloc_cpuset_t *near = calloc((size_t)l->local_world_size, sizeof *near);
    int rc;
    if (!near) {
        snprintf(err, errlen, "out of memory for %d local ranks", l->local_world_size);
        return -1;
    }
    rc = launch_topology_load(&topo, NULL, with_io, err, errlen);
    if (rc == 0) {
        if (with_io)
            gpu_near_sets(topo, gpus, l, opt->share_gpus, near);
        rc = plan_and_bind(topo, opt, l, near, s, err, errlen);
        for (int r = 0; r < l->local_world_size; r++)
            hwloc_bitmap_free(near[r]);
        hwloc_topology_destroy(topo);
    }
    free(near);
    return rc;
}
#else
/* Without hwloc there is no binding: the rank's share of the online CPUs sets the thread count. */
int launch_bind_rank(const struct launch_options *opt, const struct launch_layout *l, const struct launch_gpu_list *gpus,
                     int narrowed, struct launch_setup *s, char *err, size_t errlen)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    (void)opt, (void)gpus, (void)narrowed, (void)err, (void)errlen;
    snprintf(s->cpuset, sizeof s->cpuset, "unbound (built without hwloc)");
    s->threads = cpus / l->local_world_size > 0 ? (int)(cpus / l->local_world_size) : 1;
    return 0;
}
#endif

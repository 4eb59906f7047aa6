/* bind.c - CPU binding with hwloc: splits the allowed cores among a node's ranks, nearest their
 * GPU when known, and keeps a binding that Slurm or mpirun already made. Built only with hwloc. */
#include <stdio.h>
#include <string.h>

#include "launcher.h"

int topology_load(hwloc_topology_t *topo, const char *synthetic, int with_io, char *err,
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

int bind_split(hwloc_topology_t topo, hwloc_const_cpuset_t domain, int index, int count,
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

int gpu_near_cpuset(hwloc_topology_t topo, const char *busid, hwloc_cpuset_t out)
{
    hwloc_obj_t dev = busid && *busid ? hwloc_get_pcidev_by_busidstring(topo, busid) : NULL;
    hwloc_obj_t near = dev ? hwloc_get_non_io_ancestor_obj(topo, dev) : NULL;
    if (!near || !near->cpuset)
        return -1;
    hwloc_bitmap_copy(out, near->cpuset);
    return 0;
}

/* The CPUs near local rank R's GPU within ALLOWED, into OUT; 0 when there are some. */
static int near_of(const struct bind_request *req, hwloc_const_cpuset_t allowed, int r, hwloc_cpuset_t out)
{
    if (!req->gpu_near || !req->gpu_near[r])
        return -1;
    hwloc_bitmap_and(out, req->gpu_near[r], allowed);
    return hwloc_bitmap_iszero(out) ? -1 : 0;
}

/* Splits the CPUs near this rank's GPU among the local ranks with the same locality; -1 when
 * this rank has none (or its GPU is near all allowed CPUs, where the plain split is better). */
static int split_by_gpu(hwloc_topology_t topo, const struct bind_request *req,
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
        rc = bind_split(topo, mine, index, count, out);
    }
    hwloc_bitmap_free(mine);
    hwloc_bitmap_free(other);
    return rc;
}

int bind_plan(hwloc_topology_t topo, const struct bind_request *req, hwloc_cpuset_t out,
                  enum bind_action *action)
{
    hwloc_const_cpuset_t allowed = hwloc_topology_get_allowed_cpuset(topo);
    int bound_already = hwloc_bitmap_isincluded(req->current, allowed) && !hwloc_bitmap_isequal(req->current, allowed);
    if (req->mode == DDP_BIND_NONE || (req->mode == DDP_BIND_AUTO && bound_already)) {
        hwloc_bitmap_copy(out, req->current);
        *action = req->mode == DDP_BIND_NONE ? DDP_BIND_UNBOUND : DDP_BIND_KEPT;
        return 0;
    }
    *action = DDP_BIND_BOUND;
    if (split_by_gpu(topo, req, allowed, out) == 0)
        return 0;
    return bind_split(topo, allowed, req->local_rank, req->local_size, out);
}

int cpuset_cores(hwloc_topology_t topo, hwloc_const_cpuset_t set)
{
    int n = hwloc_get_nbobjs_inside_cpuset_by_type(topo, set, unit_type(topo, set));
    return n > 0 ? n : 1;
}

/* test_bind.c - test 7 on simulated topologies: local ranks get disjoint CPU sets covering the
 * allowed cores, ranks go to the cores nearest their GPU, an existing binding is kept unless
 * --bind=force, and --bind=none leaves it. */
#include <stdlib.h>

#include "../check.h"
#include "launcher.h"

/* Plans COUNT ranks without GPUs and checks the sets are non-empty, cover the PUs, and are
 * disjoint while there are enough cores (8 here). */
static void check_even_split(hwloc_topology_t topo, int count, int want_cores_first)
{
    hwloc_const_cpuset_t allowed = hwloc_topology_get_allowed_cpuset(topo);
    hwloc_bitmap_t seen = hwloc_bitmap_alloc(), set = hwloc_bitmap_alloc();
    int overlap = 0;
    for (int r = 0; r < count; r++) {
        struct launch_bind_request req = {LAUNCH_BIND_AUTO, allowed, r, count, NULL};
        enum launch_bind_action action;
        CHECK(launch_bind_plan(topo, &req, set, &action) == 0 && action == LAUNCH_BIND_BOUND, "rank %d of %d", r, count);
        CHECK(!hwloc_bitmap_iszero(set), "rank %d of %d got no CPU", r, count);
        overlap |= hwloc_bitmap_intersects(seen, set);
        hwloc_bitmap_or(seen, seen, set);
        if (r == 0)
            CHECK(launch_cpuset_cores(topo, set) == want_cores_first, "rank 0 of %d: %d cores, want %d", count,
                  launch_cpuset_cores(topo, set), want_cores_first);
    }
    CHECK(count > 8 || !overlap, "%d ranks: CPU sets overlap", count);
    CHECK(hwloc_bitmap_isequal(seen, allowed), "%d ranks do not cover the allowed CPUs", count);
    hwloc_bitmap_free(seen);
    hwloc_bitmap_free(set);
}

static void near_gpus(hwloc_topology_t topo)
{
    /* GPU 0 sits by package 0, GPU 1 by package 1; ranks 0 and 2 use GPU 0, ranks 1 and 3 GPU 1. */
    hwloc_obj_t p0 = hwloc_get_obj_by_type(topo, HWLOC_OBJ_PACKAGE, 0), p1 = hwloc_get_obj_by_type(topo, HWLOC_OBJ_PACKAGE, 1);
    hwloc_const_cpuset_t near[4] = {p0->cpuset, p1->cpuset, p0->cpuset, p1->cpuset};
    hwloc_bitmap_t set = hwloc_bitmap_alloc(), other = hwloc_bitmap_alloc();
    enum launch_bind_action action;
    for (int r = 0; r < 4; r++) {
        struct launch_bind_request req = {LAUNCH_BIND_AUTO, hwloc_topology_get_allowed_cpuset(topo), r, 4, near};
        CHECK(launch_bind_plan(topo, &req, set, &action) == 0, "gpu rank %d", r);
        CHECK(hwloc_bitmap_isincluded(set, near[r]) && launch_cpuset_cores(topo, set) == 2,
              "rank %d must get 2 cores of its GPU's package", r);
        if (r == 2)
            CHECK(!hwloc_bitmap_intersects(set, other), "ranks 0 and 2 share a package but not cores");
        if (r == 0)
            hwloc_bitmap_copy(other, set);
    }
    hwloc_bitmap_free(set);
    hwloc_bitmap_free(other);
}

static void existing_binding(hwloc_topology_t topo)
{
    hwloc_bitmap_t current = hwloc_bitmap_alloc(), set = hwloc_bitmap_alloc();
    enum launch_bind_action action;
    hwloc_bitmap_set_range(current, 4, 5); /* what srun/mpirun gave: one core */
    struct launch_bind_request req = {LAUNCH_BIND_AUTO, current, 0, 2, NULL};
    CHECK(launch_bind_plan(topo, &req, set, &action) == 0 && action == LAUNCH_BIND_KEPT && hwloc_bitmap_isequal(set, current),
          "auto must keep an existing binding");
    req.mode = LAUNCH_BIND_FORCE;
    CHECK(launch_bind_plan(topo, &req, set, &action) == 0 && action == LAUNCH_BIND_BOUND && hwloc_bitmap_first(set) == 0 &&
          launch_cpuset_cores(topo, set) == 4, "force must replace it with rank 0's half");
    req.mode = LAUNCH_BIND_NONE;
    req.current = hwloc_topology_get_allowed_cpuset(topo);
    CHECK(launch_bind_plan(topo, &req, set, &action) == 0 && action == LAUNCH_BIND_UNBOUND &&
          hwloc_bitmap_isequal(set, req.current), "none must leave the process as it is");
    hwloc_bitmap_free(current);
    hwloc_bitmap_free(set);
}

int main(void)
{
    hwloc_topology_t topo;
    char err[LAUNCH_ERRMSG_LEN];
    if (launch_topology_load(&topo, "pack:2 core:4 pu:2", 0, err, sizeof err) != 0) {
        CHECK(0, "%s", err);
        return CHECK_DONE();
    }
    check_even_split(topo, 1, 8);
    check_even_split(topo, 2, 4);
    check_even_split(topo, 3, 2);
    check_even_split(topo, 8, 1);
    check_even_split(topo, 16, 1); /* more ranks than cores: sharing cores */
    near_gpus(topo);
    existing_binding(topo);
    hwloc_topology_destroy(topo);
    return CHECK_DONE();
}

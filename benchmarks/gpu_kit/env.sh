# env.sh - sourced on the GPU machine (pack.sh copies it into .gpu/) after kit.tar.xz is unpacked
# into $DDP_KIT (default /tmp/ddp-kit): Open MPI from the kit (relocated with OPAL_PREFIX), the kit's libraries, the
# fallbacks the system lacks, and cuDNN / NCCL / cuBLAS from the Python wheels.
K=${DDP_KIT:-/tmp/ddp-kit}
O=$K/ompi/usr
OL=$O/lib/x86_64-linux-gnu
export OPAL_PREFIX=$O OPAL_SYSCONFDIR=$K/ompi/etc/openmpi PMIX_INSTALL_PREFIX=$OL/pmix2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# one node, no rsh agent, no UCX/libfabric/verbs: shared memory and TCP, ob1; a singleton MPI_Init
# (ddp-train started without mpirun) stays in its process instead of forking orted
export OMPI_MCA_plm=isolated OMPI_MCA_ess_singleton_isolated=1 OMPI_MCA_pml=ob1 \
    OMPI_MCA_btl=self,vader,tcp OMPI_MCA_mtl=^ofi,psm,psm2 OMPI_MCA_osc=^ucx,pt2pt \
    OMPI_MCA_btl_base_warn_component_unused=0 OMPI_MCA_rmaps_base_oversubscribe=1 \
    OMPI_MCA_btl_vader_single_copy_mechanism=none
export PATH=$O/bin:$PATH
# fallbacks: only the libraries the system's loader does not know
mkdir -p "$K/fallback-used"
for f in "$K"/fallback/*.so.[0-9]; do
  [ -e "$f" ] || continue
  n=${f##*/}
  ldconfig -p 2>/dev/null | grep -q "^[[:space:]]*$n " || ln -sf "$(readlink -f "$f")" "$K/fallback-used/$n"
done
# the wheels' CUDA libraries (cuDNN, NCCL, cuBLAS; CUDA 13 wheels keep cuBLAS in nvidia/cu13/lib)
wheels=$(python3 - <<'PY' 2>/dev/null
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = glob.glob("/usr/local/lib/python3*/dist-packages/nvidia") + glob.glob("/opt/*/.venv/lib/python3*/site-packages/nvidia")
dirs = []
for r in roots:
    for pat in ("cudnn/lib", "nccl/lib", "cu13/lib", "cublas/lib", "cuda_runtime/lib"):
        for d in glob.glob(os.path.join(r, pat)):
            if d not in dirs:
                dirs.append(d)
print(":".join(dirs))
PY
)
cuda=${CUDA_HOME:-/usr/local/cuda}/lib64
export DDP_WHEEL_LIBS=$wheels
export LD_LIBRARY_PATH=$K/lib:$OL/openmpi/lib:$OL/pmix2/lib:$OL:$cuda${wheels:+:$wheels}:$K/fallback-used${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}

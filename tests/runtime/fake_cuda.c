/* fake_cuda.c - LD_PRELOAD shim that simulates GPUs for the device-selection tests on machines
 * without one: cudaGetDeviceCount reports DDP_FAKE_CUDA_DEVICES devices, and
 * cudaDeviceGetPCIBusId reports one bus id for every process (DDP_FAKE_CUDA_BUS=shared: ranks
 * that see the same single GPU) or one per local rank (=per-rank: the launcher narrowed
 * CUDA_VISIBLE_DEVICES per rank). Every other CUDA call goes to the real runtime.
 * Declared without CUDA's headers: the runtime's cudaError_t is an int-sized enum, 0 = success.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cudaGetDeviceCount(int *count);
int cudaDeviceGetPCIBusId(char *bus, int len, int device);

int cudaGetDeviceCount(int *count)
{
    const char *n = getenv("DDP_FAKE_CUDA_DEVICES");
    *count = n ? atoi(n) : 0;
    return 0;
}

int cudaDeviceGetPCIBusId(char *bus, int len, int device)
{
    const char *mode = getenv("DDP_FAKE_CUDA_BUS");
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    int slot = mode && !strcmp(mode, "per-rank") && local ? atoi(local) : 0;
    snprintf(bus, (size_t)len, "0000:%02x:00.0", 6 + slot + device);
    return 0;
}

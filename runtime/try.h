/* try.h - the check macros of ddp's C and CUDA code (private, not installed; in runtime/ because
 * it logs through libddp): one per library, each with one meaning.
 *
 *   TRY_<LIB>(call)        on failure: logs "file:line: call failed: why" and RETURNS the
 *                          ddp_status the failure maps to, from the enclosing function.
 *   TRY_<LIB>_GOTO(call)   on failure: logs the same, sets the enclosing function's `st` to that
 *                          status and jumps to its `cleanup` label.
 *   LOG_<LIB>(call)        on failure: logs the same and goes on (release paths, which have no
 *                          status to return).
 *
 * LIB is OK (a ddp_status, passed through without a second log line: the callee logged), MPI,
 * CUDA, CUBLAS, CUDNN, NCCL or DNNL. Each library's macros exist when its header was included
 * before this one. The failure is logged through libddp's log (ddp.h), with rank and host.
 */
#ifndef DDP_TRY_H
#define DDP_TRY_H

#include "ddp.h"

/* The three shapes, given a result type, its success value and a function
 * `ddp_status fail(type, const char *call, const char *file, int line)` that logs and maps. */
#define TRY_RETURN_(type, ok, fail, call)                                     \
    do {                                                                        \
        type check_e_ = (call);                                                 \
        if (check_e_ != (ok))                                                   \
            return fail(check_e_, #call, __FILE__, __LINE__);                   \
    } while (0)
#define TRY_GOTO_(type, ok, fail, call)                                       \
    do {                                                                        \
        type check_e_ = (call);                                                 \
        if (check_e_ != (ok)) {                                                 \
            st = fail(check_e_, #call, __FILE__, __LINE__);                     \
            goto cleanup;                                                       \
        }                                                                       \
    } while (0)
#define TRY_LOG_(type, ok, fail, call)                                        \
    do {                                                                        \
        type check_e_ = (call);                                                 \
        if (check_e_ != (ok))                                                   \
            (void)fail(check_e_, #call, __FILE__, __LINE__);                    \
    } while (0)

/* ---- ddp_status: the callee has logged the reason ---------------------------------------- */
static inline ddp_status check_ok_fail(ddp_status s, const char *call, const char *file, int line)
{
    (void)call, (void)file, (void)line;
    return s;
}
#define TRY_OK(call) TRY_RETURN_(ddp_status, DDP_OK, check_ok_fail, call)
#define TRY_OK_GOTO(call) TRY_GOTO_(ddp_status, DDP_OK, check_ok_fail, call)

/* ---- MPI ------------------------------------------------------------------------------------ */
#ifdef MPI_SUCCESS
static inline ddp_status check_mpi_fail(int rc, const char *call, const char *file, int line)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
        len = 0;
    msg[len] = '\0';
    ddp_log_write(DDP_LOG_ERROR, 0, file, line, "%s failed: %s", call, len ? msg : "unknown MPI error");
    return DDP_ERR_MPI;
}
#define TRY_MPI(call) TRY_RETURN_(int, MPI_SUCCESS, check_mpi_fail, call)
#define TRY_MPI_GOTO(call) TRY_GOTO_(int, MPI_SUCCESS, check_mpi_fail, call)
#define LOG_MPI(call) TRY_LOG_(int, MPI_SUCCESS, check_mpi_fail, call)
#endif

/* ---- CUDA runtime --------------------------------------------------------------------------- */
#ifdef CUDART_VERSION
static inline ddp_status check_cuda_fail(cudaError_t e, const char *call, const char *file, int line)
{
    ddp_log_write(DDP_LOG_ERROR, 0, file, line, "%s failed: %s", call, cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? DDP_ERR_NOMEM : DDP_ERR_CUDA;
}
#define TRY_CUDA(call) TRY_RETURN_(cudaError_t, cudaSuccess, check_cuda_fail, call)
#define TRY_CUDA_GOTO(call) TRY_GOTO_(cudaError_t, cudaSuccess, check_cuda_fail, call)
#define LOG_CUDA(call) TRY_LOG_(cudaError_t, cudaSuccess, check_cuda_fail, call)
/* Ends every kernel launcher: a launch that failed (bad configuration, no kernel image). */
#define TRY_CUDA_LAUNCH() TRY_CUDA(cudaGetLastError())
#endif

/* ---- cuBLAS --------------------------------------------------------------------------------- */
#ifdef CUBLAS_VER_MAJOR
static inline ddp_status check_cublas_fail(cublasStatus_t s, const char *call, const char *file, int line)
{
    ddp_log_write(DDP_LOG_ERROR, 0, file, line, "%s failed: %s (%s)", call, cublasGetStatusName(s),
                  cublasGetStatusString(s));
    return s == CUBLAS_STATUS_ALLOC_FAILED ? DDP_ERR_NOMEM : DDP_ERR_BLAS;
}
#define TRY_CUBLAS(call) TRY_RETURN_(cublasStatus_t, CUBLAS_STATUS_SUCCESS, check_cublas_fail, call)
#define TRY_CUBLAS_GOTO(call) TRY_GOTO_(cublasStatus_t, CUBLAS_STATUS_SUCCESS, check_cublas_fail, call)
#define LOG_CUBLAS(call) TRY_LOG_(cublasStatus_t, CUBLAS_STATUS_SUCCESS, check_cublas_fail, call)
#endif

/* ---- cuDNN ---------------------------------------------------------------------------------- */
#ifdef CUDNN_MAJOR
static inline ddp_status check_cudnn_fail(cudnnStatus_t s, const char *call, const char *file, int line)
{
    ddp_log_write(DDP_LOG_ERROR, 0, file, line, "%s failed: %s", call, cudnnGetErrorString(s));
    return s == CUDNN_STATUS_ALLOC_FAILED ? DDP_ERR_NOMEM : DDP_ERR_CUDA;
}
#define TRY_CUDNN(call) TRY_RETURN_(cudnnStatus_t, CUDNN_STATUS_SUCCESS, check_cudnn_fail, call)
#define TRY_CUDNN_GOTO(call) TRY_GOTO_(cudnnStatus_t, CUDNN_STATUS_SUCCESS, check_cudnn_fail, call)
#define LOG_CUDNN(call) TRY_LOG_(cudnnStatus_t, CUDNN_STATUS_SUCCESS, check_cudnn_fail, call)
#endif

/* ---- NCCL ----------------------------------------------------------------------------------- */
#ifdef NCCL_MAJOR
static inline ddp_status check_nccl_fail(ncclResult_t r, const char *call, const char *file, int line)
{
    ddp_log_write(DDP_LOG_ERROR, 0, file, line, "%s failed: %s (%s)", call, ncclGetErrorString(r),
                  ncclGetLastError(NULL));
    return DDP_ERR_NCCL;
}
#define TRY_NCCL(call) TRY_RETURN_(ncclResult_t, ncclSuccess, check_nccl_fail, call)
#define TRY_NCCL_GOTO(call) TRY_GOTO_(ncclResult_t, ncclSuccess, check_nccl_fail, call)
#define LOG_NCCL(call) TRY_LOG_(ncclResult_t, ncclSuccess, check_nccl_fail, call)
#endif

/* ---- oneDNN --------------------------------------------------------------------------------- */
#ifdef DNNL_VERSION_MAJOR
static inline ddp_status check_dnnl_fail(dnnl_status_t s, const char *call, const char *file, int line)
{
    ddp_log_write(DDP_LOG_ERROR, 0, file, line, "%s failed: oneDNN status %d%s", call, (int)s,
                  s == dnnl_unimplemented ? " (no implementation for this shape and data type)" : "");
    switch (s) {
    case dnnl_out_of_memory: return DDP_ERR_NOMEM;
    case dnnl_invalid_arguments: return DDP_ERR_INVALID_ARG;
    case dnnl_unimplemented: return DDP_ERR_UNSUPPORTED;
    default: return DDP_ERR_BLAS;
    }
}
#define TRY_DNNL(call) TRY_RETURN_(dnnl_status_t, dnnl_success, check_dnnl_fail, call)
#define TRY_DNNL_GOTO(call) TRY_GOTO_(dnnl_status_t, dnnl_success, check_dnnl_fail, call)
#define LOG_DNNL(call) TRY_LOG_(dnnl_status_t, dnnl_success, check_dnnl_fail, call)
#endif

#endif /* DDP_TRY_H */

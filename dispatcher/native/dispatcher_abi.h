/* The C ABI every built gemm-dispatcher library exports.
 *
 * One header for every target and variant, so the Python loader
 * (dispatcher/library.py) can talk to any library the same way. Pointers are
 * in the target's memory: host memory for `cpu`, device memory for `cuda`.
 * Leading dimensions are explicit, in elements, so views and slices of larger
 * arrays work without copies.
 *
 * Status codes: 0 ok, -1 runtime failure (read dispatcher_last_error),
 * -2 the problem is not supported by this kernel (selection falls back to
 * another kernel). -2 is always decided by an explicit check, never by
 * matching error text.
 */
#ifndef GEMM_DISPATCHER_ABI_H
#define GEMM_DISPATCHER_ABI_H

#include <stdint.h>

#define DISPATCHER_ABI_VERSION 2
#define DISPATCHER_EXPORT __attribute__((visibility("default")))
#define DISPATCHER_OK 0
#define DISPATCHER_ERROR (-1)
#define DISPATCHER_UNSUPPORTED (-2)

#ifdef __cplusplus
extern "C" {
#endif

/* An extra operand of a problem (a bias, a scale vector, a variant's own
 * tensor): element (b, i, j) is at data[b*batch_stride + i*row_stride +
 * j*col_stride], strides in elements; a stride of 0 broadcasts along that
 * axis (a bias per output column has row_stride 0). */
typedef struct dispatcher_operand {
    const void* data;
    int64_t row_stride;
    int64_t col_stride;
    int64_t batch_stride;
} dispatcher_operand;

/* One GEMM, or `batch` GEMMs of one shape:
 *   C[b] = epilogue(alpha * scale_a * scale_b * op(A[b]) @ op(B[b]) + beta * C[b])
 * The layouts of A, B and C and the epilogue (bias, activation) are compiled
 * into the kernel; lda/ldb/ldc are the distances between consecutive rows
 * (row-major) or columns (column-major). The fields after `stream` came with
 * ABI version 2, and all of them 0 is the plain GEMM: a caller that
 * value-initializes the struct and fills the version-1 fields still means
 * what it meant (batch 0 is one problem, a scale of 0 is unscaled). */
typedef struct dispatcher_gemm_args {
    const void* a;
    const void* b;
    void* c;
    int64_t m, n, k;
    int64_t lda, ldb, ldc;
    double alpha, beta;
    void* workspace;          /* variant-owned scratch (stream-K), may be NULL */
    int64_t workspace_bytes;
    int32_t workers;          /* persistent workers; 0 = the kernel's default */
    void* stream;             /* cudaStream_t on cuda, unused on cpu */
    int64_t batch;            /* problems in the launch (0 or 1: one) */
    int64_t batch_stride_a;   /* elements between A[b] and A[b+1]; 0 = one A for all */
    int64_t batch_stride_b;   /* likewise for B */
    int64_t batch_stride_c;   /* likewise for C (never 0 when batch > 1) */
    double scale_a, scale_b;  /* per-tensor input scales (fp8); 0 or 1 = unscaled */
    int32_t extra_count;      /* extra operands, in the order the variant declares them */
    const dispatcher_operand* extra;
    int32_t param_count;      /* a variant's own scalar parameters, in declared order */
    const double* params;
} dispatcher_gemm_args;

/* G independent problems in one launch; every array has group_count entries. */
typedef struct dispatcher_grouped_args {
    int64_t group_count;
    const int64_t* m;
    const int64_t* n;
    const int64_t* k;
    const void* const* a;
    const void* const* b;
    void* const* c;
    const int64_t* lda;
    const int64_t* ldb;
    const int64_t* ldc;
    double alpha, beta;
    void* workspace;
    int64_t workspace_bytes;
    void* stream;
} dispatcher_grouped_args;

/* The stacked (mixture-of-experts) form of a grouped GEMM, as torch._grouped_mm
 * takes it: A is one (total_m, k) matrix whose rows [offsets[g-1], offsets[g])
 * belong to group g (offsets[-1] = 0), B is group_count (k, n) matrices
 * stride_b elements apart, C is one row-major (total_m, n) matrix. `offsets`
 * (int32, group_count entries, non-decreasing, at most total_m) is in the
 * target's memory: a CUDA kernel derives the groups' sizes and pointers on the
 * device, so the host never reads them. Rows of C past offsets[G-1] are set
 * to zero. Offsets that break these rules write nothing: on cpu the call
 * fails (status -1); on cuda the kernels skip every group (reporting it
 * would need a host synchronisation, which the caller may ask for). */
typedef struct dispatcher_grouped_mm_args {
    int64_t group_count;
    const int32_t* offsets;
    int64_t total_m, n, k;
    const void* a;
    int64_t lda;
    const void* b;
    int64_t ldb, stride_b;
    void* c;
    int64_t ldc;
    double alpha;
    void* workspace;
    int64_t workspace_bytes;
    void* stream;
} dispatcher_grouped_mm_args;

typedef int (*dispatcher_gemm_fn)(const dispatcher_gemm_args*);

/* A kernel registry table: the regular variant launches through it. */
typedef struct dispatcher_registry_entry {
    const char* name;
    dispatcher_gemm_fn run;
} dispatcher_registry_entry;

/* Every library exports these three ... */
int dispatcher_abi_version(void);
const char* dispatcher_kernel_name(void);
const char* dispatcher_last_error(void);

/* ... and, by variant (the loader probes which are present):
 *   int dispatcher_run_gemm(const dispatcher_gemm_args*);            single problem
 *   int dispatcher_run_grouped_gemm(const dispatcher_grouped_args*); grouped
 *   const dispatcher_registry_entry* dispatcher_registry(int* count); kernel table
 *   int64_t dispatcher_workspace_size(const dispatcher_gemm_args*);  scratch bytes
 *   int64_t dispatcher_grouped_workspace_size(const dispatcher_grouped_args*);
 *   int dispatcher_run_grouped_mm(const dispatcher_grouped_mm_args*);  stacked grouped
 *   int64_t dispatcher_grouped_mm_workspace_size(const dispatcher_grouped_mm_args*);
 */

#ifdef __cplusplus
}
#endif

#ifdef __cplusplus
#include <exception>
#include <string>

namespace dispatcher_abi {
inline std::string& last_error() {
    static thread_local std::string message;
    return message;
}
inline int fail(int status, const std::string& message) {
    last_error() = message;
    return status;
}
/* Runs body() and turns any C++ exception into status -1 with its text. */
template <class Body>
int guarded(Body&& body) {
    try {
        last_error().clear();
        return body();
    } catch (const std::exception& e) {
        return fail(DISPATCHER_ERROR, e.what());
    } catch (...) {
        return fail(DISPATCHER_ERROR, "unknown C++ exception");
    }
}
}  // namespace dispatcher_abi

/* The exports every library shares; a generated source invokes this once. */
#define DISPATCHER_DEFINE_COMMON_EXPORTS(KERNEL_NAME_STRING)                    \
    extern "C" DISPATCHER_EXPORT int dispatcher_abi_version(void) {             \
        return DISPATCHER_ABI_VERSION;                                          \
    }                                                                           \
    extern "C" DISPATCHER_EXPORT const char* dispatcher_kernel_name(void) {     \
        return KERNEL_NAME_STRING;                                              \
    }                                                                           \
    extern "C" DISPATCHER_EXPORT const char* dispatcher_last_error(void) {      \
        return dispatcher_abi::last_error().c_str();                            \
    }

/* ... and those of a single-problem library whose entry point is RUN. */
#define DISPATCHER_DEFINE_GEMM_EXPORTS(KERNEL_NAME_STRING, RUN)                 \
    DISPATCHER_DEFINE_COMMON_EXPORTS(KERNEL_NAME_STRING)                        \
    extern "C" DISPATCHER_EXPORT int dispatcher_run_gemm(const dispatcher_gemm_args* args) { \
        return RUN(args);                                                       \
    }
#endif

#endif /* GEMM_DISPATCHER_ABI_H */

/* cuda_check.h - error checks for CUDA runtime, cuBLAS and cuDNN calls in
 * the cuda backend's host code.
 *
 * Each check evaluates a call once; on failure it writes
 *     "file:line: <call text>: <library error string>"
 * into err (a char array, such as the backend's ps_compute.err: its size is
 * taken with sizeof) and then either
 * returns the mapped negative code from the enclosing function
 * (CUDA_CHECK & co.) or stores it in rc and jumps to a cleanup label
 * (CUDA_CHECK_GOTO & co.).
 *
 * Codes: out of memory -> -ENOMEM, a bad argument -> -EINVAL, no usable
 * device, driver or architecture -> PS_ENOTSUP, anything else -> -EIO.
 */
#ifndef PS_CUDA_CHECK_H
#define PS_CUDA_CHECK_H

#include <errno.h>
#include <stdio.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <cudnn.h>
#include "ps_err.h"

static inline int ps__cuda_code(cudaError_t e)
{
	switch (e) {
	case cudaSuccess:
		return 0;
	case cudaErrorMemoryAllocation:
		return -ENOMEM;
	case cudaErrorInvalidValue:
	case cudaErrorInvalidDevicePointer:
	case cudaErrorInvalidConfiguration:
		return -EINVAL;
	case cudaErrorNoDevice:
	case cudaErrorInsufficientDriver:
	case cudaErrorStubLibrary:            /* the driver's stub, no real driver */
	case cudaErrorInitializationError:
	case cudaErrorDevicesUnavailable:     /* exclusive or prohibited compute mode */
	case cudaErrorSystemNotReady:
	case cudaErrorSystemDriverMismatch:
	case cudaErrorCompatNotSupportedOnDevice:
	case cudaErrorInvalidDevice:
	case cudaErrorNoKernelImageForDevice:
	case cudaErrorUnsupportedPtxVersion:
		return PS_ENOTSUP;
	default:
		return -EIO;
	}
}

static inline int ps__cublas_code(cublasStatus_t s)
{
	switch (s) {
	case CUBLAS_STATUS_SUCCESS:
		return 0;
	case CUBLAS_STATUS_ALLOC_FAILED:
		return -ENOMEM;
	case CUBLAS_STATUS_INVALID_VALUE:
		return -EINVAL;
	case CUBLAS_STATUS_NOT_SUPPORTED:
	case CUBLAS_STATUS_ARCH_MISMATCH:
	case CUBLAS_STATUS_NOT_INITIALIZED:
		return PS_ENOTSUP;
	default:
		return -EIO;
	}
}

/* cuDNN 9 codes carry their category in the thousands. */
static inline int ps__cudnn_code(cudnnStatus_t s)
{
	if (s == CUDNN_STATUS_SUCCESS)
		return 0;
	if (s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
	    s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
		return -ENOMEM;
	if (CUDNN_STATUS_CATEGORY(s) == CUDNN_STATUS_CATEGORY(CUDNN_STATUS_BAD_PARAM))
		return -EINVAL;
	/* 3xxx: not supported here; 1xxx: not initialized (no GPU), library
	 * loading, version or license trouble. */
	if (CUDNN_STATUS_CATEGORY(s) == CUDNN_STATUS_CATEGORY(CUDNN_STATUS_NOT_SUPPORTED) ||
	    CUDNN_STATUS_CATEGORY(s) == CUDNN_STATUS_CATEGORY(CUDNN_STATUS_NOT_INITIALIZED))
		return PS_ENOTSUP;
	return -EIO;
}

/* Formats the failure message; returns code unchanged. */
static inline int ps__cuda_fail(char *err, size_t errlen, const char *file, int line,
				const char *call, const char *what, int code)
{
	snprintf(err, errlen, "%s:%d: %s: %s", file, line, call, what);
	return code;
}

/* CUDA runtime errors also clear the thread's last error, so a failed call
 * that is not sticky (an allocation, a bad argument) is not reported again
 * by the cudaGetLastError() after a later kernel launch. */
static inline int ps__cuda_rt_fail(char *err, size_t errlen, const char *file, int line,
				   const char *call, cudaError_t e)
{
	(void)cudaGetLastError();
	return ps__cuda_fail(err, errlen, file, line, call, cudaGetErrorString(e),
			     ps__cuda_code(e));
}

#define PS__CUDA_EVAL(err, call)                                                           \
	({                                                                                 \
		cudaError_t ps__e = (call);                                                \
		ps__e == cudaSuccess ? 0                                                   \
			: ps__cuda_rt_fail((err), sizeof(err), __FILE__, __LINE__, #call,  \
					   ps__e);                                         \
	})
#define PS__CUBLAS_EVAL(err, call)                                                         \
	({                                                                                 \
		cublasStatus_t ps__s = (call);                                             \
		ps__s == CUBLAS_STATUS_SUCCESS ? 0                                         \
			: ps__cuda_fail((err), sizeof(err), __FILE__, __LINE__, #call,     \
					cublasGetStatusString(ps__s),                      \
					ps__cublas_code(ps__s));                           \
	})
#define PS__CUDNN_EVAL(err, call)                                                          \
	({                                                                                 \
		cudnnStatus_t ps__s = (call);                                              \
		ps__s == CUDNN_STATUS_SUCCESS ? 0                                          \
			: ps__cuda_fail((err), sizeof(err), __FILE__, __LINE__, #call,     \
					cudnnGetErrorString(ps__s),                        \
					ps__cudnn_code(ps__s));                            \
	})

/* On failure: message into err, return the code. */
#define CUDA_CHECK(err, call)                                                              \
	do {                                                                               \
		int ps__rc = PS__CUDA_EVAL(err, call);                                     \
		if (ps__rc)                                                                \
			return ps__rc;                                                     \
	} while (0)
#define CUBLAS_CHECK(err, call)                                                            \
	do {                                                                               \
		int ps__rc = PS__CUBLAS_EVAL(err, call);                                   \
		if (ps__rc)                                                                \
			return ps__rc;                                                     \
	} while (0)
#define CUDNN_CHECK(err, call)                                                             \
	do {                                                                               \
		int ps__rc = PS__CUDNN_EVAL(err, call);                                    \
		if (ps__rc)                                                                \
			return ps__rc;                                                     \
	} while (0)

/* On failure: message into err, the code into rc, goto label. */
#define CUDA_CHECK_GOTO(err, call, rc, label)                                              \
	do {                                                                               \
		if (((rc) = PS__CUDA_EVAL(err, call)) != 0)                                \
			goto label;                                                        \
	} while (0)
#define CUBLAS_CHECK_GOTO(err, call, rc, label)                                            \
	do {                                                                               \
		if (((rc) = PS__CUBLAS_EVAL(err, call)) != 0)                              \
			goto label;                                                        \
	} while (0)
#define CUDNN_CHECK_GOTO(err, call, rc, label)                                             \
	do {                                                                               \
		if (((rc) = PS__CUDNN_EVAL(err, call)) != 0)                               \
			goto label;                                                        \
	} while (0)

#endif

/* softmax_xent.cuh - softmax cross-entropy over logits[n, classes] on the
 * cuda backend's stream, reduced on the device to one small result that is
 * copied, still on the stream, to the caller's pinned host struct. */
#ifndef PS_SOFTMAX_XENT_CUH
#define PS_SOFTMAX_XENT_CUH

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime.h>
#include "compute.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device scratch bytes the launcher needs (fixed, independent of n). */
size_t ps__cuda_xent_scratch_bytes(void);

/* Queues: a check of every label; if one is outside [0, classes), nothing
 * more is written but st's bad_row and bad_label. Otherwise per example a
 * stable softmax (max subtracted), its loss, its first argmax and, if
 * dlogits is not NULL, dlogits = softmax - onehot(label); then the sums,
 * into *st (pinned host memory, complete once the stream reaches it).
 * scratch is device memory of ps__cuda_xent_scratch_bytes(). Sums run in
 * a fixed order: results repeat bit for bit for the same inputs. */
cudaError_t ps__cuda_softmax_xent(cudaStream_t st, const float *logits, const int32_t *labels,
				  int n, int classes, float *dlogits, void *scratch,
				  struct ps_xent_stats *out);

#ifdef __cplusplus
}
#endif
#endif

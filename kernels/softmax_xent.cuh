/* softmax_xent.cuh - softmax cross-entropy over logits[n, classes] on the
 * cuda backend's stream, reduced on the device to one small result that the
 * host copies back. */
#ifndef PS_SOFTMAX_XENT_CUH
#define PS_SOFTMAX_XENT_CUH

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What one call leaves in device memory for the host to download. */
struct ps__xent_result {
	double loss_sum;   /* sum over valid examples of -log softmax[label] */
	int correct;       /* examples whose first argmax equals the label */
	int bad_row;       /* first example whose label is outside [0, classes), or -1 */
	int bad_label;     /* that label */
	int pad;
};

/* Device scratch bytes the launcher needs (fixed, independent of n). */
size_t ps__cuda_xent_scratch_bytes(void);

/* Queues the loss: per example a stable softmax (max subtracted), its loss,
 * argmax, and if dlogits is not NULL, dlogits = (softmax - onehot(label)) / n;
 * then the sums into *out (device memory). scratch is device memory of
 * ps__cuda_xent_scratch_bytes(). Sums run in a fixed order: results repeat
 * bit for bit for the same inputs. */
cudaError_t ps__cuda_softmax_xent(cudaStream_t st, const float *logits, const int32_t *labels,
				  int n, int classes, float *dlogits, void *scratch,
				  struct ps__xent_result *out);

#ifdef __cplusplus
}
#endif
#endif

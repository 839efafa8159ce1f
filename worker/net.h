/* net.h - a model's layers instantiated on a compute backend for training.
 *
 * Holds, in backend memory, every layer's parameters, activations and
 * gradients for a fixed maximum batch, and in host memory (pinned for cuda)
 * one buffer per parameter tensor for the weights pulled from the shards and
 * one for the gradients pushed to them. Only those host buffers cross
 * between host and device; everything else stays on the backend.
 */
#ifndef PS_NET_H
#define PS_NET_H

#include <stdint.h>
#include "compute.h"
#include "config.h"
#include "layers.h"

struct ps_net_layer {
	const struct ps_layer_cfg *cfg;
	struct ps_layer_shape sh;
	size_t out_count;            /* per example */
	float *y, *dy;               /* batch x out_count: output and its gradient */
	int32_t *idx;                /* maxpool argmax */
	float *W, *b, *dW, *db;      /* dense / conv2d */
	struct ps_conv_shape cs;
	struct ps_pool_shape ps;
};

struct ps_net {
	const struct ps_config *cfg;
	const struct ps_compute_ops *ops;
	struct ps_compute *c;
	int batch;
	int nlayers;
	struct ps_net_layer *l;
	float *x;                    /* batch input on the backend */
	int32_t *labels;
	float *dx_scratch;           /* gradient into the first layer (unused) */
	void *ws;
	size_t ws_bytes;
	int ntensors;
	float **host_w;              /* per tensor: weights from pulls */
	float **host_g;              /* per tensor: gradients to push */
	float **dev_w, **dev_g;      /* per tensor: the layer buffers they map to */
	int64_t *count;              /* per tensor: elements */
};

/* Builds the net for cfg->model on backend c, for batches of up to batch
 * examples. The config's tensors must be the model's (ps_layers_tensors
 * order). On error returns a negative code with the reason in err. */
int ps_net_init(struct ps_net *n, const struct ps_config *cfg, const struct ps_compute_ops *ops,
		struct ps_compute *c, int batch, char *err, size_t errlen);
void ps_net_free(struct ps_net *n);

/* Copies host_w of every tensor to the backend. */
int ps_net_upload_weights(struct ps_net *n);

/* Forward pass of count examples (host x: count x input floats, y labels),
 * then softmax cross-entropy: mean loss and number correct. */
int ps_net_forward(struct ps_net *n, const float *x, const int32_t *y, int count, float *loss,
		   int *correct);

/* Backward pass after ps_net_forward. As soon as a layer's gradients exist
 * they are multiplied by scale, copied into host_g and ready(arg, weight
 * tensor, bias tensor) is called, last layer first, so the caller can push
 * them while the earlier layers are still being differentiated. */
int ps_net_backward(struct ps_net *n, int count, float scale,
		    int (*ready)(void *arg, int wt, int bt), void *arg);

#endif

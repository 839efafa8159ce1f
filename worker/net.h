/* net.h - a model's layers instantiated on a compute backend for training.
 *
 * Holds, in backend memory, every layer's parameters, activations and
 * gradients for a fixed maximum batch, and in host memory (pinned for cuda)
 * the two input batches, one buffer per parameter tensor for the weights
 * pulled from the shards and one for the gradients pushed to them. Only
 * those host buffers cross between host and device.
 *
 * A training step never waits for the device on the thread that queues it:
 *
 *   ps_net_batch_buffers(n, &x, &y)    fill x, y with the next batch
 *   ps_net_batch_ready(n, count)       its upload starts on the copy stream
 *   ps_net_forward(n)                  queued
 *   ps_net_backward(n, scale, &gen)    queued; each weighted layer's
 *                                      gradients travel to host_g behind
 *                                      their own event, last layer first
 *   (another thread) ps_net_grad_wait(n, gen, k, ...) for k = 0..ngrads-1,
 *                                      pushing each pair as it lands
 *   ps_net_loss(n, ...)                the step's one read of the loss
 *   ps_net_upload_weights(n)           after the pull (or ps_net_upload_pair
 *                                      as each layer's pull lands, then
 *                                      ps_net_upload_mark); ps_net_weights_wait()
 *                                      before the next pull writes host_w
 *
 * The next batch can be filled and readied while the current step runs
 * (two input slots), but not before the gradients of the step that used
 * its slot two batches ago have all been waited for.
 */
#ifndef PS_NET_H
#define PS_NET_H

#include <pthread.h>
#include <stdint.h>
#include "compute.h"
#include "config.h"
#include "layers.h"

struct ps_net_layer {
	const struct ps_layer_cfg *cfg;
	struct ps_layer_shape sh;
	size_t out_count;            /* per example */
	float *y, *dy;               /* batch x out_count: output and its gradient */
	int view;                    /* flatten: y, dy are the previous layer's
				      * (the input batch's, for layer 0) */
	int grad_below;              /* a layer below has parameters: dx needed */
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
	size_t in_count;             /* input floats per example */
	/* Input: two slots, each a pinned host batch and its backend copy. */
	float *x[2], *host_x[2];
	int32_t *labels[2], *host_y[2];
	struct ps_compute_event *e_in[2];    /* the slot's upload has landed */
	struct ps_compute_event *e_used[2];  /* the compute stream is done with it */
	int fill;                    /* slot the host fills next */
	int ready, ready_count;      /* slot forward takes next (-1: none), its size */
	int cur, count;              /* slot and size of the last forward */
	struct ps_xent_stats *stats; /* pinned: the last forward's loss */
	struct ps_compute_event *e_loss;
	void *ws;
	size_t ws_bytes;
	int ntensors;
	float **host_w;              /* per tensor: weights from pulls */
	float **host_g;              /* per tensor: gradients to push */
	float **dev_w, **dev_g;      /* per tensor: the layer buffers they map to */
	int64_t *count_of;           /* per tensor: elements */
	struct ps_compute_event *e_wup;      /* upload of host_w done */
	/* Gradients in push order: grad_layer[0] is the last weighted layer. */
	int ngrads;
	int *grad_layer;
	struct ps_compute_event **e_grad;
	pthread_mutex_t mu;          /* guards gen, queued, failed */
	pthread_cond_t cv;
	uint64_t gen;                /* backward passes begun */
	int queued;                  /* gradients of pass gen queued so far */
	int failed;                  /* an error of pass gen: waiters return it */
	char err[256];               /* ps_net_grad_wait's reason */
};

/* Builds the net for cfg->model on backend c, for batches of up to batch
 * examples. The config's tensors must be the model's (ps_layers_tensors
 * order). On error returns a negative code with the reason in err. */
int ps_net_init(struct ps_net *n, const struct ps_config *cfg, const struct ps_compute_ops *ops,
		struct ps_compute *c, int batch, char *err, size_t errlen);
void ps_net_free(struct ps_net *n);

/* The host buffers (batch x in_count floats, batch labels) to fill with
 * the next batch; waits if their last upload is still under way. */
int ps_net_batch_buffers(struct ps_net *n, float **x, int32_t **y);
/* Starts the upload of the count examples filled in; the next forward
 * takes them. Labels are checked here: -EINVAL naming the first one
 * outside 0..classes-1, before anything is sent to the backend. */
int ps_net_batch_ready(struct ps_net *n, int count);
/* Copies x, y into the batch buffers and readies them (tests, evaluation). */
int ps_net_load_batch(struct ps_net *n, const float *x, const int32_t *y, int count);

/* Queues the forward pass of the ready batch and its loss. */
int ps_net_forward(struct ps_net *n);
/* Waits for the last forward's loss: mean loss and number correct. */
int ps_net_loss(struct ps_net *n, float *loss, int *correct);

/* Queues the backward pass of the last forward. Each weighted layer's
 * gradients, scaled by scale / count (folded into the backward ops), are
 * copied to host_g behind an event; *gen numbers the pass for
 * ps_net_grad_wait. Makes no host synchronization. */
int ps_net_backward(struct ps_net *n, float scale, uint64_t *gen);
/* Blocks (any thread) until gradient pair k (0 = the last weighted layer)
 * of pass gen is in host_g; *wt and *bt name its weight and bias tensors.
 * For k = 0 it first checks the forward's loss: a bad label or a loss that
 * is not finite fails the pass (nothing of it is to be pushed). Returns
 * the pass's error, with the reason in n->err. */
int ps_net_grad_wait(struct ps_net *n, uint64_t gen, int k, int *wt, int *bt);

/* Queues the copy of host_w of every tensor to the backend. */
int ps_net_upload_weights(struct ps_net *n);
/* The same piecewise, as per-layer pulls land: queues the copy of gradient
 * pair k's two tensors (ps_net_pair), and marks the end of a step's
 * uploads (what ps_net_weights_wait waits for). */
int ps_net_upload_pair(struct ps_net *n, int k);
int ps_net_upload_mark(struct ps_net *n);
/* Waits until the copies marked last have read host_w (before a pull
 * overwrites it). */
int ps_net_weights_wait(struct ps_net *n);
/* The weight and bias tensors of gradient pair k (push order). */
void ps_net_pair(const struct ps_net *n, int k, int *wt, int *bt);

#endif

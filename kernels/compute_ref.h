/* compute_ref.h - the parts of the reference backend (compute_ref.c) that
 * the oneDNN backend "cpu" uses as they are: host memory, copies and events
 * (both run every op to completion on the calling thread), shape checks,
 * the loss, and the ops where the plain code measures as fast (see
 * compute_dnnl.c). Each takes the struct ps_compute of either backend and
 * touches only its base members. Internal to kernels/.
 */
#ifndef PS_COMPUTE_REF_H
#define PS_COMPUTE_REF_H

#include "compute.h"

/* Writes the reason into c->err and returns rc. */
int ps__ref_fail(struct ps_compute *c, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* 0 for a usable shape whose oh, ow are ps_conv_out()'s, else -EINVAL. */
int ps__ref_conv_check(struct ps_compute *c, const struct ps_conv_shape *s);
int ps__ref_dense_check(struct ps_compute *c, int n, int in, int out);

float *ps__ref_alloc(struct ps_compute *c, size_t bytes);
void ps__ref_free(struct ps_compute *c, void *p);
void *ps__ref_host_alloc(struct ps_compute *c, size_t bytes);
int ps__ref_copy(struct ps_compute *c, void *dst, const void *src, size_t bytes);
int ps__ref_sync(struct ps_compute *c);
int ps__ref_event_create(struct ps_compute *c, struct ps_compute_event **ev);
void ps__ref_event_free(struct ps_compute *c, struct ps_compute_event *ev);
int ps__ref_event_noop(struct ps_compute *c, struct ps_compute_event *ev);
int ps__ref_download_async(struct ps_compute *c, void *dst, const void *src, size_t bytes,
			   struct ps_compute_event *ev);
int ps__ref_upload_async(struct ps_compute *c, void *dst, const void *src, size_t bytes,
			 struct ps_compute_event *after, struct ps_compute_event *ev);
int ps__ref_zero(struct ps_compute *c, float *x, size_t n);
int ps__ref_scale(struct ps_compute *c, float *y, const float *x, float a, size_t n);
int ps__ref_dense_fwd(struct ps_compute *c, const float *x, const float *W, const float *b,
		      float *y, int n, int in, int out);
int ps__ref_dense_bwd(struct ps_compute *c, const float *x, const float *W, const float *dy,
		      float *dx, float *dW, float *db, int n, int in, int out, float alpha);
int ps__ref_maxpool_fwd(struct ps_compute *c, const struct ps_pool_shape *s, const float *x,
			float *y, int32_t *idx);
int ps__ref_maxpool_bwd(struct ps_compute *c, const struct ps_pool_shape *s, const float *dy,
			const int32_t *idx, float *dx);
int ps__ref_relu_fwd(struct ps_compute *c, const float *x, float *y, size_t n);
int ps__ref_relu_bwd(struct ps_compute *c, const float *y, const float *dy, float *dx, size_t n);
int ps__ref_softmax_xent(struct ps_compute *c, const float *logits, const int32_t *labels,
			 int n, int classes, float *dlogits, struct ps_xent_stats *st);

#endif

/* compute_dnnl.h - the oneDNN backend "cpu" (compute_dnnl.c, compute_dnnl_conv.c),
 * internal to kernels/.
 *
 * Every op the backend runs through oneDNN is a struct dn_prim: one
 * primitive made once per shape and kept in the backend's cache, with
 * each of its arguments bound either straight to the caller's plain
 * (NCHW, row-major) buffer or, where the primitive prefers another layout
 * (blocked nChw8c, OIhw8i8o, ...), to a buffer in the op's workspace that a
 * reorder fills before the primitive runs (inputs) or empties into the
 * caller's buffer after it (outputs). The scratchpad oneDNN asks for lives
 * in the workspace too, so ops allocate nothing as they run.
 */
#ifndef PS_COMPUTE_DNNL_H
#define PS_COMPUTE_DNNL_H

#include <dnnl.h>
#include "compute.h"

#define DN_MAXARGS 6
#define DN_CACHE 48     /* shapes kept; the presets use about a dozen */

struct dn_arg {
	int arg;                  /* DNNL_ARG_* */
	int out;                  /* the primitive writes it */
	dnnl_memory_t user;       /* the caller's buffer, plain layout */
	dnnl_memory_t mem;        /* what the primitive reads or writes */
	dnnl_primitive_t reorder; /* user -> mem (in) or mem -> user (out); NULL: mem is user */
	size_t ws_off;            /* mem's place in the workspace when reordered */
};

struct dn_prim {
	dnnl_primitive_t p;
	int nargs;
	struct dn_arg a[DN_MAXARGS];
	dnnl_memory_t scratch;    /* oneDNN's scratchpad in the workspace, or NULL */
	size_t scratch_off;
	size_t ws_bytes;          /* workspace this primitive needs */
};

enum dn_kind { DN_CONV = 1, DN_DENSE, DN_RELU };

/* One cached shape: up to three primitives (conv: forward, backward data,
 * backward weights; dense: forward, dx, dW; relu: forward, backward). */
struct dn_entry {
	enum dn_kind kind;
	int key[12];
	struct dn_prim prim[3];
	size_t ws_bytes;          /* the most any of them needs */
	void *own_ws;             /* ws_bytes of the entry's own, for ops given no
				   * workspace (dense, relu); made with the entry */
	unsigned long used;       /* last use, for eviction */
};

struct dn_backend {
	struct ps_compute base;   /* first: ops receive &base */
	dnnl_engine_t eng;
	dnnl_stream_t strm;
	int threads;              /* OpenMP threads oneDNN runs with */
	unsigned long tick;
	struct dn_entry cache[DN_CACHE];
	int ncache;
};

static inline struct dn_backend *dn_of(struct ps_compute *c)
{
	return (struct dn_backend *)c;
}

/* Sets the calling thread's OpenMP thread count to the backend's: oneDNN
 * parallelizes each primitive over that many threads. */
void ps__dn_enter(struct dn_backend *b);
/* Makes the primitive of pd into *p, binding args[i] (DNNL_ARG_*; out[i]
 * set for outputs) to plain layouts plain[i]; an arg whose preferred
 * layout differs gets a workspace buffer and a reorder. Frees pd. */
int ps__dn_prim_make(struct dn_backend *b, struct dn_prim *p, dnnl_primitive_desc_t pd,
		     int nargs, const int *args, const int *out, const dnnl_memory_desc_t *plain,
		     const char *what);
void ps__dn_prim_free(struct dn_prim *p);
/* Runs p on the caller's buffers ptrs[i] (in the order of the args it was
 * made with; NULL leaves that arg out) with workspace ws (at least
 * p->ws_bytes), and waits for it. */
int ps__dn_prim_run(struct dn_backend *b, struct dn_prim *p, void *const *ptrs, void *ws,
		    const char *what);
/* The cache entry of kind and key (nkey ints), or NULL with *fresh set:
 * a slot to fill (kind and key already written, the least recently used
 * entry freed), or NULL on no room at all (cannot happen: it evicts). */
struct dn_entry *ps__dn_cache_get(struct dn_backend *b, enum dn_kind kind, const int *key,
				  int nkey, int *fresh);
/* Sets e->ws_bytes from its primitives and, with own set, allocates
 * e->own_ws to match. */
int ps__dn_entry_ws(struct dn_backend *b, struct dn_entry *e, int own);
/* Drops an entry whose primitives could not all be made. */
void ps__dn_cache_drop(struct dn_backend *b, struct dn_entry *e);
/* A plain memory descriptor: dims with row-major strides. */
void ps__dn_md(dnnl_memory_desc_t *md, int ndims, const dnnl_dim_t *dims);
/* rc for a failed oneDNN call, its status named in c->err. */
int ps__dn_fail(struct ps_compute *c, dnnl_status_t st, const char *what);

int ps__dn_conv2d_workspace(struct ps_compute *c, const struct ps_conv_shape *s, size_t *bytes);
int ps__dn_conv2d_fwd(struct ps_compute *c, const struct ps_conv_shape *s, const float *x,
		      const float *W, const float *b, float *y, void *ws, size_t ws_bytes);
int ps__dn_conv2d_bwd(struct ps_compute *c, const struct ps_conv_shape *s, const float *x,
		      const float *W, const float *dy, float *dx, float *dW, float *db, void *ws,
		      size_t ws_bytes, float alpha);

#endif

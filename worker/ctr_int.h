/* ctr_int.h - the ctr preset's model inside ps-worker, shared by its two
 * files: ctr_model.c (the model on the compute backend, its batches and
 * the requests that pull and push its weights and rows) and ctr_train.c
 * (the training loop: which batch at which clock, epochs, reports).
 */
#ifndef PS_CTR_INT_H
#define PS_CTR_INT_H

#include <stdint.h>
#include "compute.h"
#include "config.h"
#include "ctr_data.h"
#include "layers.h"
#include "ps_client.h"

#define F PS_CTR_FIELDS
#define NUMF PS_CTR_NUMERIC

struct layer {
	enum ps_layer_kind kind;
	int in, out;                 /* per example */
	float *W, *b, *dW, *db;      /* dense */
	float *y, *dy;               /* batch x out */
	int wt;                      /* dense: weight tensor index (bias wt + 1) */
};

/* One batch's ids of one group, on the host (pinned) and on the backend. */
struct bags {
	int nu;                      /* unique ids */
	uint64_t *uniq;              /* B x F */
	int32_t *h_off, *h_idx, *h_roff, *h_rbags; /* host mirrors */
	int32_t *off, *idx, *roff, *rbags;        /* backend */
};

/* The fields that bag from one table. */
struct group {
	int t;                       /* index in cfg->tables */
	int nf, dim, col;            /* fields, floats per row, first column of its bags in x */
	int field[F];                /* its fields, increasing */
	float *rows, *drows, *h_rows, *h_drows; /* B*nf x dim */
	struct bags bg[2];           /* this step's and the next's */
	int64_t rid, pid;            /* its rows' pull and push in flight, 0 = none */
};

struct ctr {
	const struct ps_config *cfg;
	const struct ps_compute_ops *ops;
	struct ps_compute *c;
	int B, in, bagw, nl;         /* bagw: the bags' columns of x (in - 13) */
	struct layer l[PS_MAX_LAYERS];
	float *x, *dx;               /* B x in */
	float *h_x;                  /* pinned */
	int32_t *labels, *h_labels;
	float *h_logits;             /* B x 2 */
	struct ps_xent_stats *st;
	float **h_w, **h_g;          /* per dense tensor */
	int ng;
	struct group g[F];
	int64_t did;                 /* the dense pull in flight, 0 = none */
	/* dedup hash: slot -> unique index, valid when stamp matches */
	int hbits;
	uint64_t *hkey;
	int32_t *hval;
	uint32_t *hstamp, stamp;
	int32_t *count;              /* per unique row: entries (transpose) */
	struct ps_tensor *pt;        /* per tensor, for pulls and pushes */
};

/* Sets up m for batches of B on backend c (buffers, layers, groups); 0 or
 * a negative code with the reason in err. ps__ctr_free undoes it (also a
 * partly set up m). */
int ps__ctr_init(struct ctr *m, const struct ps_config *cfg, const struct ps_compute_ops *ops,
		 struct ps_compute *c, int B, char *err, size_t errlen);
void ps__ctr_free(struct ctr *m);

/* Fills bags k of every group with examples first..first+n-1 of d
 * (order[] maps positions to examples when not NULL), and the host input
 * x's numeric columns and the labels (one x for both k: build the next
 * batch only after this one's upload). */
void ps__ctr_build_batch(struct ctr *m, int k, const struct ps_ctr_data *d, const int *order,
			 int first, int n);

/* Starts the pull of the dense weights (when dense) and of every group's
 * rows of bags k (when k >= 0); waits for those under way (0 or the first
 * error). */
int ps__ctr_pull_start(struct ctr *m, struct ps_client *cli, int k, int dense,
		       uint64_t min_version);
int ps__ctr_pull_wait(struct ctr *m, struct ps_client *cli);

/* The backend's part of a step: the pulled dense weights up; the input and
 * bags k of n examples up with their rows, bagged into x; the forward pass
 * and the loss; the backward pass with gradients scaled by alpha and
 * copied to the host. 0 or the backend's code (reason in its err). */
int ps__ctr_upload_dense(struct ctr *m);
int ps__ctr_upload(struct ctr *m, int k, int n);
int ps__ctr_forward(struct ctr *m, int n, int train);
int ps__ctr_backward(struct ctr *m, int k, int n, float alpha);

/* Held-out logloss and AUC with the weights on the backend (rows pulled as
 * they are now; uses bags 1, x and the rows' buffer). 0 or a code. */
int ps__ctr_evaluate(struct ctr *m, struct ps_client *cli, const struct ps_ctr_data *test,
		     double *auc, double *logloss);

/* "cat 26x16" or "a 13x8, b 13x4" into buf. */
const char *ps__ctr_tables_text(const struct ctr *m, char *buf, size_t len);

/* Starts the pushes of bags k's row gradients and the dense gradients that
 * end clock (and leave with leave): the dense push's id or a negative code;
 * waits for them (0 or the first error). */
int64_t ps__ctr_push_start(struct ctr *m, struct ps_client *cli, int k, uint64_t clock,
			   int leave);
int ps__ctr_push_wait(struct ctr *m, struct ps_client *cli, int64_t dpid);

#endif

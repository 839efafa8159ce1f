/* ctr_train.h - ps-worker's training loop for the ctr preset: click logs
 * in Criteo's format, 26 categorical fields bagged from an embedding table
 * on the shards, 13 numeric features, an MLP and a logistic loss, with
 * logloss and AUC on held-out data every epoch (docs/embeddings.md). */
#ifndef PS_CTR_TRAIN_H
#define PS_CTR_TRAIN_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include "compute.h"
#include "config.h"
#include "ps_client.h"

/* A click log in memory, ready for batches: per example 26 embedding ids
 * (ps_criteo_id), 13 numeric features as log(1 + x) for x > 0 (else 0)
 * and the label. */
struct ps_ctr_data {
	int n;
	uint64_t *ids;            /* n x 26 */
	float *num;               /* n x 13 */
	int32_t *label;           /* n */
};

/* Reads up to limit examples (0 = all) of path. A malformed line is an
 * error (FILE:LINE and the text in err). 0 or a negative code. */
int ps_ctr_load(struct ps_ctr_data *d, const char *path, int64_t limit, char *err,
		size_t errlen);
void ps_ctr_data_free(struct ps_ctr_data *d);

/* The exact AUC of n (score, label) pairs: the probability that a random
 * positive scores above a random negative, ties counting one half (ranks
 * averaged over ties). Sorts score and label together. NaN without both
 * classes. */
double ps_ctr_auc(float *score, int32_t *label, int n);

/* Trains cfg's ctr model as worker rank through cli on backend c for
 * cfg->train.epochs; rank 0 reports held-out logloss and AUC each epoch
 * (stdout "epoch E test auc A logloss L", the log and metrics). Stops
 * after the current step once *stop is set. 0, or 1 on failure (logged). */
int ps_ctr_train(const struct ps_config *cfg, int rank, const struct ps_compute_ops *ops,
		 struct ps_compute *c, struct ps_client *cli, FILE *metrics,
		 volatile sig_atomic_t *stop);

#endif

/* ctr_train.h - ps-worker's training loop for the ctr preset: click logs
 * in Criteo's format, 26 categorical fields bagged from embedding tables
 * on the shards (one for all fields, or several: model.embeddings[].fields),
 * 13 numeric features, an MLP and a logistic loss, with logloss and AUC on
 * held-out data every epoch (docs/embeddings.md). */
#ifndef PS_CTR_TRAIN_H
#define PS_CTR_TRAIN_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include "compute.h"
#include "config.h"
#include "ctr_data.h"
#include "ps_client.h"

/* Trains cfg's ctr model as worker rank through cli on backend c for
 * cfg->train.epochs, counted from clock 0: at each clock the members take
 * the next batch slots of the epoch's shuffled order, one each in rank
 * order (ps_client_members), so every example of an epoch is trained once
 * whoever joins or leaves; rank 0 reports held-out logloss and AUC each
 * epoch (stdout "epoch E test auc A logloss L", the log and metrics).
 * Once *stop is set the current step's batch is trained and its push
 * leaves the cluster. rec (NULL: none) gets one line per step: "clock
 * epoch slot example...". 0, 130 when stopped, or 1 on failure (logged). */
int ps_ctr_train(const struct ps_config *cfg, int rank, const struct ps_compute_ops *ops,
		 struct ps_compute *c, struct ps_client *cli, FILE *metrics, FILE *rec,
		 volatile sig_atomic_t *stop);

#endif

/* epoch.h - the epochs of ps-worker's dense training: which batch a
 * worker trains at a clock (the members of each clock take the next batch
 * slots of the epoch's shuffled order), and what an epoch reports (epoch.c).
 */
#ifndef PS_EPOCH_H
#define PS_EPOCH_H

#include <stdint.h>
#include <stdio.h>
#include "compute.h"
#include "config.h"
#include "dataset.h"
#include "net.h"
#include "ps_client.h"

/* What a worker's epoch counts: its steps, examples and loss, and where
 * its steps spent their time on the main thread: computing (forward,
 * backward, the next batch, reading the loss), waiting for the push thread
 * to hand the gradients to the client, waiting for the network (push acks
 * and the pull, which in sync mode includes waiting for the other workers'
 * pushes), and uploading the pulled weights. */
struct ps_epoch_acc {
	int e, steps;
	long seen, correct;
	double loss_sum, t_epoch, t_compute, t_push, t_net, t_upload;
};

/* The batches of an epoch's slots (slot i: images order[i * batch ...]
 * of the epoch's order) and, with --record-examples, the images of the
 * batch staged last, written out when it is trained. */
struct ps_slot_stage {
	struct ps_batcher *bt; /* over the whole training set (rank 0 of 1) */
	int epoch;             /* the epoch the batcher's order is for */
	long slots;            /* per epoch */
	FILE *record;
	long slot;             /* staged last */
	int idx[65536];
	int n;
};

/* Stages global slot g (epoch g / slots) for the next forward. 0 or the
 * net's error code (reason in the backend's err). */
int ps_slot_stage(struct ps_net *net, struct ps_slot_stage *st, long g);

/* --record-examples: "clock epoch slot image..." of the batch staged last
 * (tests check that an epoch trains every image once). */
void ps_slot_record(const struct ps_slot_stage *st, uint64_t clock, long g);

/* Test-set accuracy and mean loss with the weights on the backend. */
int ps_epoch_evaluate(struct ps_net *net, const struct ps_dataset *test, double *acc,
		      double *loss);

/* The end of this worker's part of epoch ea->e: rank 0 reports the test
 * accuracy (not when stopped by a signal), and the epoch's JSON line goes
 * to metrics (when not NULL). 0, or -1 with the error logged. */
int ps_epoch_end(const struct ps_config *cfg, int rank, struct ps_net *net,
		 const struct ps_dataset *test, const struct ps_compute_ops *ops, FILE *metrics,
		 struct ps_client *cli, const struct ps_epoch_acc *ea, double t_start,
		 const double *t_layer, int tty, int stopped);

#endif

/* epoch.c - the epochs of ps-worker's dense training: which batch a
 * worker trains at a clock, and what an epoch reports.
 *
 * One shuffled order of the training set per epoch, cut into slots of a
 * batch; at each clock the members take the next slots, one each in rank
 * order: slot before + index of ps_client_members. Over any run of clocks
 * every slot is taken once, so whoever joins or leaves, an epoch trains
 * every image once (sync; docs/reliability.md).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "codec.h"
#include "epoch.h"
#include "ps_log.h"
#include "ps_time.h"

/* Test-set accuracy and mean loss with the weights on the backend. */
int ps_epoch_evaluate(struct ps_net *net, const struct ps_dataset *test, double *acc,
		      double *loss)
{
	int correct_total = 0;
	double loss_sum = 0;

	for (int first = 0; first < test->n; first += net->batch) {
		int count = test->n - first < net->batch ? test->n - first : net->batch;
		float l, *x;
		int32_t *y;
		int correct, rc = ps_net_batch_buffers(net, &x, &y);
		if (!rc) {
			ps_dataset_fill(test, first, count, x, y);
			rc = ps_net_batch_ready(net, count);
		}
		if (!rc)
			rc = ps_net_forward(net);
		if (!rc)
			rc = ps_net_loss(net, &l, &correct);
		if (rc)
			return rc;
		correct_total += correct;
		loss_sum += (double)l * count;
	}
	*acc = (double)correct_total / test->n;
	*loss = loss_sum / test->n;
	return 0;
}

/* Stages global slot g (epoch g / slots) for the next forward. */
int ps_slot_stage(struct ps_net *net, struct ps_slot_stage *st, long g)
{
	float *x;
	int32_t *y;
	int e = (int)(g / st->slots), rc = ps_net_batch_buffers(net, &x, &y), count;

	if (rc)
		return rc;
	if (e != st->epoch) {
		ps_batcher_epoch(st->bt, e);
		st->epoch = e;
	}
	ps_batcher_seek(st->bt, (int)(g % st->slots) * st->bt->batch);
	if (st->record) {
		st->n = st->bt->batch;
		memcpy(st->idx, ps_batcher_peek(st->bt), (size_t)st->n * sizeof(int));
	}
	st->slot = g;
	count = ps_batcher_next(st->bt, x, y);
	return ps_net_batch_ready(net, count);
}

/* --record-examples: "clock epoch slot image..." of the batch about to be
 * trained (tests check that an epoch trains every image once). */
void ps_slot_record(const struct ps_slot_stage *st, uint64_t clock, long g)
{
	if (!st->record)
		return;
	fprintf(st->record, "%llu %ld %ld", (unsigned long long)clock, g / st->slots, g);
	for (int i = 0; i < st->n; i++)
		fprintf(st->record, " %d", st->idx[i]);
	fputc('\n', st->record);
	fflush(st->record);
}

/* The end of this worker's part of epoch ea->e: rank 0 reports the test
 * accuracy (not after a stop signal), and the epoch's JSON line goes to
 * the metrics file. 0, or -1 with the error logged. */
int ps_epoch_end(const struct ps_config *cfg, int rank, struct ps_net *net,
		 const struct ps_dataset *test, const struct ps_compute_ops *ops, FILE *metrics,
		 struct ps_client *cli, const struct ps_epoch_acc *ea, double t_start,
		 const double *t_layer, int tty, int stopped)
{
	double elapsed = ps_now_s() - ea->t_epoch, acc = NAN, tloss = NAN;

	if (tty)
		fputc('\n', stderr);
	/* every worker's own share: with members joining and leaving, the
	 * steps a rank trained in an epoch are known only at its end */
	ps_info("epoch %d: %d steps, %ld examples, train loss %.4f, %.0f samples/s", ea->e + 1,
		ea->steps, (long)ea->seen, ea->seen ? ea->loss_sum / ea->seen : NAN,
		elapsed > 0 ? ea->seen / elapsed : 0.0);
	if (rank == 0 && !stopped) {
		if (ps_epoch_evaluate(net, test, &acc, &tloss)) {
			ps_error("evaluation: %s", net->c->err);
			return -1;
		}
		ps_info("epoch %d: test accuracy %.4f, test loss %.4f (%d images)", ea->e + 1, acc,
			tloss, test->n);
		printf("epoch %d test accuracy %.4f\n", ea->e + 1, acc);
		fflush(stdout);
	}
	if (!metrics)
		return 0;
	uint64_t raw, wire;
	ps_client_push_bytes(cli, &raw, &wire);
	fprintf(metrics, "{\"mb_pushed_raw\":%.3f,\"mb_pushed_wire\":%.3f,\"codec\":\"%s\",",
		raw / 1e6, wire / 1e6, ps_codec_get(cfg->compress.codec)->name);
	fprintf(metrics,
		"\"rank\":%d,\"epoch\":%d,\"steps\":%d,\"time_s\":%.3f,\"train_loss\":%.6f,"
		"\"train_accuracy\":%.6f,\"samples_per_s\":%.1f,\"mb_pushed\":%.3f,"
		"\"device\":\"%s\",\"consistency\":\"%s\",\"compute_s\":%.3f,"
		"\"push_wait_s\":%.3f,\"net_wait_s\":%.3f,\"upload_s\":%.3f,"
		"\"net_wait_fraction\":%.4f",
		rank, ea->e + 1, ea->steps, ps_now_s() - t_start,
		ea->seen ? ea->loss_sum / ea->seen : NAN,
		ea->seen ? (double)ea->correct / ea->seen : NAN, ea->seen / elapsed, raw / 1e6,
		ops->name, cfg->consistency == PS_SYNC ? "sync" : "async", ea->t_compute,
		ea->t_push, ea->t_net, ea->t_upload,
		elapsed > 0 ? (ea->t_push + ea->t_net) / elapsed : 0.0);
	if (cfg->train.pull == PS_PULL_LAYER) {
		/* keyed by each layer's weight tensor, in push order */
		fputs(",\"net_wait_layers_s\":{", metrics);
		for (int k = 0; k < net->ngrads; k++) {
			int wt, bt;
			ps_net_pair(net, k, &wt, &bt);
			fprintf(metrics, "%s\"%s\":%.3f", k ? "," : "", cfg->tensors[wt].name,
				t_layer[k]);
		}
		fputc('}', metrics);
	}
	if (!isnan(acc))
		fprintf(metrics, ",\"test_accuracy\":%.6f,\"test_loss\":%.6f", acc, tloss);
	fprintf(metrics, "}\n");
	fflush(metrics);
	return 0;
}

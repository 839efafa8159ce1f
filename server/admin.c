/* admin.c - what a shard does for operators rather than for training:
 * checkpoints (periodic, on request, on SIGTERM; the file format is
 * checkpoint.c's) and the counters a Stats request asks for (ps-stat; the
 * Prometheus page renders the same counters in metrics_http.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include "ps_time.h"
#include "checkpoint.h"
#include "msg.h"
#include "ps_err.h"
#include "ps_log.h"
#include "server_int.h"

/* Writes the checkpoint now and logs the outcome; 0 or a negative code. */
int ps__srv_write_checkpoint(struct ps_server *s, const char *why, uint64_t *bytes,
			     double *secs, char *err, size_t errlen)
{
	double t0 = ps_now_s();
	int rc = ps_checkpoint_write(s, s->ckpt_path, bytes, err, errlen);

	*secs = ps_now_s() - t0;
	if (rc)
		ps_error("checkpoint (%s) failed: %s", why, err);
	else
		ps_info("checkpoint (%s): %s, %.1f MiB in %.3f s", why, s->ckpt_path,
			(double)*bytes / 1048576.0, *secs);
	return rc;
}

void ps__srv_on_ckpt_timer(uv_timer_t *t)
{
	struct ps_server *s = t->data;
	char err[512];
	uint64_t bytes;
	double secs;

	ps__srv_write_checkpoint(s, "periodic", &bytes, &secs, err, sizeof(err));
}

void ps__srv_handle_stats(struct ps_server *s, struct ps_srv_conn *sc, const Ps__StatsRequest *m)
{
	Ps__Stats st = PS__STATS__INIT;
	char ckerr[600] = "";   /* referenced by st until it is sent */
	int nw = s->cfg->nworkers;
	Ps__WorkerClock *wc = calloc((size_t)nw, sizeof(*wc));
	Ps__WorkerClock **wp = calloc((size_t)nw, sizeof(*wp));

	if (!wc || !wp) {
		ps_msg_send_error(sc->conn, m->req_id, -ENOMEM, "out of memory");
		goto out_free;
	}
	for (int r = 0; r < nw; r++) {
		ps__worker_clock__init(&wc[r]);
		wc[r].rank = r;
		wc[r].clock = s->finished[r];
		wc[r].connected = s->connected[r] > 0;
		wp[r] = &wc[r];
	}
	if (m->checkpoint) {
		if (!s->ckpt_path[0]) {
			st.checkpoint_status = PS_ESTATE;
			snprintf(ckerr, sizeof(ckerr), "checkpoints are off (no checkpoint.dir)");
		} else {
			st.checkpoint_status =
				ps__srv_write_checkpoint(s, "on request", &st.checkpoint_bytes,
							 &st.checkpoint_seconds, ckerr,
							 sizeof(ckerr));
		}
		st.checkpoint_path = s->ckpt_path;
		st.checkpoint_error = ckerr;
	}
	st.req_id = m->req_id;
	st.shard = s->shard;
	st.uptime_s = ps_now_s() - s->started;
	st.pushes = s->c.pushes;
	st.pulls = s->c.pulls;
	st.bytes_in = s->c.bytes_in;
	st.bytes_out = s->c.bytes_out;
	st.applies = s->store.applies;
	st.apply_seconds = s->store.apply_seconds;
	st.apply_bytes = s->store.bytes_applied;
	st.n_push_raw_bytes = PS_CODEC_COUNT;
	st.push_raw_bytes = s->c.push_raw;
	st.n_push_wire_bytes = PS_CODEC_COUNT;
	st.push_wire_bytes = s->c.push_wire;
	st.pull_raw_bytes = s->c.pull_raw;
	st.pull_wire_bytes = s->c.pull_wire;
	st.errors = s->c.errors;
	st.rejected_frames = s->c.rejected_frames;
	st.auth_failures = s->c.auth_failures;
	st.duplicate_pushes = s->c.duplicate_pushes;
	st.connections = (uint32_t)s->nconns;
	if (s->transport->ops->queue_stats) {
		struct ps_queue_stats q;
		s->transport->ops->queue_stats(s->transport, &q);
		st.reply_queue_bytes = q.bytes;
		st.reply_queue_peak = q.peak_conn;
		st.reply_queue_total_peak = q.peak_total;
		st.paused_connections = (uint32_t)q.paused;
	}
	st.n_workers = (size_t)nw;
	st.workers = wp;
	st.max_clock_gap = s->c.max_clock_gap;
	st.param_checksum = ps_store_checksum(&s->store);
	st.n_push_latency_log2us = PS_HISTO_BUCKETS;
	st.push_latency_log2us = s->c.push_lat.count;
	st.push_latency_sum_s = s->c.push_lat.sum_s;
	st.n_pull_latency_log2us = PS_HISTO_BUCKETS;
	st.pull_latency_log2us = s->c.pull_lat.count;
	st.pull_latency_sum_s = s->c.pull_lat.sum_s;
	ps_msg_send(sc->conn, PS_MSG_STATS, &st.base, NULL, 0, PS_SEND_VOLATILE, NULL, NULL);
out_free:
	free(wc);
	free(wp);
}

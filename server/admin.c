/* admin.c - what a shard does for operators rather than for training:
 * checkpoints (periodic, on request, on SIGTERM; the file format is
 * checkpoint.c's) and the counters a Stats request asks for (ps-stat; the
 * Prometheus page renders the same counters in metrics_http.c).
 */
#define _GNU_SOURCE /* close_range */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "ps_time.h"
#include "checkpoint.h"
#include "msg.h"
#include "ps_err.h"
#include "ps_log.h"
#include "rows.h"
#include "table_ckpt.h"
#include "replica.h"
#include "members.h"
#include "server_int.h"

/* A checkpoint was written: a full one (seq 0) is the new base of the
 * incremental ones (the writer removed the old chain's files after its
 * rename: write_ckpt); an incremental one extends the chain. A failed one
 * (rc) makes the next a full one, since the changes it held are no longer
 * marked. */
static void ckpt_written(struct ps_server *s, int rc, uint32_t seq, const struct ps_ckpt_image *img)
{
	if (rc) {
		s->ckpt_have_base = 0;
		s->ckpt_failures++;
		return;
	}
	s->ckpt_last_ok = ps_now_s();
	if (img->tables_gen != s->tables_gen) {
		/* a replication snapshot replaced the tables since it was
		 * taken: the next checkpoint is a full one */
		s->ckpt_have_base = 0;
		return;
	}
	if (seq) {
		s->ckpt_seq = seq;
		return;
	}
	s->ckpt_have_base = 1;
	s->ckpt_base_crc = img->crc;
	s->ckpt_base_len = img->len + sizeof(uint32_t);
	s->ckpt_seq = 0;
	if (s->reshard_marker[0]) {
		/* the re-shard's state is in this shard's own file now */
		if (unlink(s->reshard_marker) && errno != ENOENT)
			ps_warn("cannot remove %s: %s", s->reshard_marker, strerror(errno));
		s->reshard_marker[0] = '\0';
	}
}

/* Writes img as a checkpoint at path (any thread); a full one (seq 0)
 * then removes the files of the chain it replaces, delta-1..retire and any
 * after (the deltas of the old base would not apply to the new one; a
 * crash before they are gone leaves them for the loader to set aside). */
static int write_ckpt(struct ps_ckpt_image *img, const char *path, uint32_t seq,
		      uint32_t retire, uint64_t *bytes, char *err, size_t errlen)
{
	int rc = ps_checkpoint_write_image(img, path, bytes, err, errlen);

	if (!rc && !seq)
		ps_checkpoint_retire_deltas(path, retire);
	return rc;
}

/* Writes a checkpoint now and logs the outcome; 0 or a negative code.
 * A full one, except at a committed re-shard stop after a pre-copy
 * (ps__srv_precopy): then, with tables and a base to build on, the next
 * incremental one of the chain (the rows changed since the pre-copy's
 * base and the dense state), which the staged new shards apply to the
 * base they loaded (reshard_stage.c); the chain restores the same state at a
 * restart, so a re-shard rolled back loses nothing. */
int ps__srv_write_checkpoint(struct ps_server *s, const char *why, uint64_t *bytes,
			     double *secs, char *err, size_t errlen)
{
	double t0 = ps_now_s();
	struct ps_ckpt_image img = { 0 };
	char path[700];
	uint32_t seq = 0;
	int rc;

	if (s->precopy && s->stop_committed && s->cfg->ntables && s->ckpt_have_base &&
	    ps__rows_delta_possible(s))
		seq = s->ckpt_seq + 1;
	if (seq) {
		ps_checkpoint_delta_path(s->ckpt_path, seq, path, sizeof(path));
		rc = ps_checkpoint_snapshot_delta(s, seq, &img, err, errlen);
	} else {
		snprintf(path, sizeof(path), "%s", s->ckpt_path);
		rc = ps_checkpoint_snapshot(s, &img, err, errlen);
	}
	img.tables_gen = s->tables_gen;
	if (!rc) {
		ps__rows_ckpt_taken(s);
		rc = write_ckpt(&img, path, seq, s->ckpt_seq + 1, bytes, err, errlen);
		ckpt_written(s, rc, seq, &img);
	}
	ps_checkpoint_image_free(&img);

	*secs = ps_now_s() - t0;
	if (rc)
		ps_error("checkpoint (%s) failed: %s", why, err);
	else
		ps_info("checkpoint (%s): %s, %.1f MiB in %.3f s%s", why, path,
			(double)*bytes / 1048576.0, *secs,
			seq ? " (incremental: on the re-shard's pre-copy)" : "");
	return rc;
}

/* ---- checkpoints in the background ----
 * The loop thread copies the state (ps_checkpoint_snapshot: the shard's
 * only pause, a memcpy) and a libuv pool thread writes the copy, so pushes
 * and pulls go on while the file is written and fsynced. One at a time.
 * A checkpoint (full or incremental) of a state of checkpoint.fork_bytes
 * or more (big embedding tables) is written instead by a child made with
 * fork(): it copies and writes from its copy-on-write view of the shard,
 * so the shard pauses for the fork (its page tables), not for a copy; the
 * tick collects the child (ps__srv_ckpt_poll). */
struct ps_ckpt_job {
	uv_work_t req;
	struct ps_server *s;
	struct ps_ckpt_image img;
	uint32_t seq;                  /* 0: full; else its place in the incremental chain */
	uint32_t retire;               /* full: the last delta of the chain it replaces */
	char path[700];
	const char *why;
	double t0, pause_s;
	int rc;
	uint64_t bytes;
	double secs;
	char err[512];
	struct ps_srv_conn *requester; /* answered when done; NULL: none or gone */
	uint64_t req_id;
	pid_t child;                   /* the forked writer, 0 when none */
	int loud;                      /* logged at warn: a launcher waits for the line */
};

static void send_stats(struct ps_server *s, struct ps_srv_conn *sc, uint64_t req_id,
		       const struct ps_ckpt_job *ck, int ck_status, const char *ck_err,
		       const Ps__StatsRequest *q);

static void ckpt_work(uv_work_t *req)
{
	struct ps_ckpt_job *j = req->data;

	j->rc = write_ckpt(&j->img, j->path, j->seq, j->retire, &j->bytes, j->err, sizeof(j->err));
}

/* A background checkpoint ended (j->rc): bookkeeping, log, answer. */
static void ckpt_finish(struct ps_ckpt_job *j)
{
	struct ps_server *s = j->s;

	j->secs = ps_now_s() - j->t0;
	ckpt_written(s, j->rc, j->seq, &j->img);
	if (j->rc)
		ps_error("checkpoint (%s) failed: %s", j->why, j->err);
	else
		ps_log(j->loud ? PS_LOG_WARN : PS_LOG_INFO, "checkpoint (%s)%s: %s, %.1f MiB in "
		       "%.3f s (the shard paused %.3f s for %s)", j->why, j->loud ? " written" : "",
		       j->path, (double)j->bytes / 1048576.0, j->secs, j->pause_s,
		       j->img.buf ? "the copy" : "fork()");
	ps_checkpoint_image_free(&j->img);
	s->ckpt_job = NULL;
	if (j->requester)
		send_stats(s, j->requester, j->req_id, j, j->rc, j->err, NULL);
	free(j);
	if (s->precopy_pending && !s->ckpt_final) {
		s->precopy_pending = 0;
		ps__srv_precopy(s);
	}
	if (s->ckpt_final) {
		/* a signal came meanwhile: the last checkpoint has every update */
		char err[512];
		uint64_t bytes;
		double secs;
		if (ps__srv_write_checkpoint(s, s->ckpt_final, &bytes, &secs, err, sizeof(err)))
			s->exit_status = 1;
		ps_server_stop(s);
	}
}

static void ckpt_done(uv_work_t *req, int status)
{
	(void)status;
	ckpt_finish(req->data);
}

/* The child: copies its view of the shard and writes it; never returns.
 * It dies with the shard (a shard killed and started again must not have
 * an old writer rename a file under it later) and holds none of its
 * sockets (the restarted shard binds the same port at once). */
static void ckpt_child(struct ps_server *s, const char *path, uint32_t seq, uint32_t retire,
		       pid_t parent)
{
	struct ps_ckpt_image img = { 0 };
	char err[512];
	uint64_t bytes;
	int rc;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(1);
	close_range(3, ~0u, 0);
	rc = seq ? ps_checkpoint_snapshot_delta(s, seq, &img, err, sizeof(err))
		 : ps_checkpoint_snapshot(s, &img, err, sizeof(err));

	if (!rc)
		rc = write_ckpt(&img, path, seq, retire, &bytes, err, sizeof(err));
	if (rc)
		ps_error("checkpoint writer (pid %d): %s", (int)getpid(), err);
	_exit(rc ? 1 : 0);
}

void ps__srv_ckpt_poll(struct ps_server *s)
{
	struct ps_ckpt_job *j = s->ckpt_job;
	struct stat st;
	uint32_t crc;
	int status, fd = -1;
	pid_t r;

	if (!j || j->child <= 0)
		return;
	r = waitpid(j->child, &status, WNOHANG);
	if (r == 0)
		return;
	j->rc = 0;
	if (r < 0 || !WIFEXITED(status) || WEXITSTATUS(status)) {
		j->rc = -EIO;
		snprintf(j->err, sizeof(j->err), "the checkpoint writer (pid %d) %s; the old "
			 "checkpoint stays", (int)j->child, r < 0 ? "was lost"
			 : WIFSIGNALED(status) ? "was killed" : "failed (its log line says why)");
	} else if ((fd = open(j->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)) < 0 || fstat(fd, &st) ||
		   st.st_size < 4 || pread(fd, &crc, 4, st.st_size - 4) != 4) {
		/* the CRC of the file is its last 4 bytes: the base of the incremental chain */
		j->rc = -EIO;
		snprintf(j->err, sizeof(j->err), "%.400s: cannot read back what the writer wrote",
			 j->path);
	} else {
		j->bytes = (uint64_t)st.st_size;
		j->img.len = (size_t)st.st_size - 4;
		j->img.crc = crc;
	}
	if (fd >= 0)
		close(fd);
	j->child = 0;
	ckpt_finish(j);
}

/* Starts a checkpoint in the background (full: never an incremental
 * one); 0, or -EBUSY when one is being written, or a negative code with
 * err. */
static int ckpt_start(struct ps_server *s, const char *why, struct ps_srv_conn *requester,
		      uint64_t req_id, int full, char *err, size_t errlen)
{
	struct ps_ckpt_job *j;
	int rc;

	if (s->ckpt_job) {
		snprintf(err, errlen, "a checkpoint is being written now");
		return -EBUSY;
	}
	j = calloc(1, sizeof(*j));
	if (!j) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	j->s = s;
	j->why = why;
	j->requester = requester;
	j->req_id = req_id;
	j->req.data = j;
	j->t0 = ps_now_s();
	/* incremental when the tables have a base to build on and the chain
	 * is not at its length yet */
	if (!full && s->cfg->ntables && s->cfg->checkpoint.incremental > 0 && s->ckpt_have_base &&
	    s->ckpt_seq < (uint32_t)s->cfg->checkpoint.incremental && ps__rows_delta_possible(s))
		j->seq = s->ckpt_seq + 1;
	j->retire = s->ckpt_seq + 1; /* one past the chain: a write that failed after its rename */
	if (j->seq)
		ps_checkpoint_delta_path(s->ckpt_path, j->seq, j->path, sizeof(j->path));
	else
		snprintf(j->path, sizeof(j->path), "%s", s->ckpt_path);
	if (s->cfg->checkpoint.fork_bytes && ps_checkpoint_size(s) >= s->cfg->checkpoint.fork_bytes) {
		/* a big state: the child copies and writes it (full or incremental) */
		pid_t self = getpid();
		j->child = fork();
		if (j->child == 0)
			ckpt_child(s, j->path, j->seq, j->retire, self);
		rc = j->child < 0 ? -errno : 0;
		if (rc)
			snprintf(err, errlen, "fork: %s", strerror(-rc));
	} else if (j->seq) {
		rc = ps_checkpoint_snapshot_delta(s, j->seq, &j->img, err, errlen);
	} else {
		rc = ps_checkpoint_snapshot(s, &j->img, err, errlen);
	}
	if (!rc)
		ps__rows_ckpt_taken(s);
	j->img.tables_gen = s->tables_gen;
	j->pause_s = ps_now_s() - j->t0;
	if (!rc && !j->child)
		rc = uv_queue_work(s->loop, &j->req, ckpt_work, ckpt_done);
	if (rc) {
		if (!err[0])
			snprintf(err, errlen, "cannot start the writer: %s", uv_strerror(rc));
		ps_error("checkpoint (%s) failed: %s", why, err);
		ps_checkpoint_image_free(&j->img);
		free(j);
		s->ckpt_have_base = 0; /* the changes it took are not marked any more */
		s->ckpt_failures++;
		return rc < 0 ? rc : -rc;
	}
	j->loud = full;
	s->ckpt_job = j;
	return 0;
}

int ps__srv_ckpt_start_full(struct ps_server *s, const char *why)
{
	char err[512] = "";

	return ckpt_start(s, why, NULL, 0, 1, err, sizeof(err));
}

void ps__srv_precopy(struct ps_server *s)
{
	const char *why = NULL;

	if (!s->ckpt_path[0])
		why = "checkpoints are off (no checkpoint.dir)";
	else if (!s->cfg->ntables)
		why = "the shard has no embedding table (its dense state is written whole at the "
		      "stop anyway)";
	else if (s->cfg->declare || s->cfg->ndecl_tables)
		why = "tensors or tables declared at run time: a staged re-shard is not built for "
		      "them";
	else if (s->cfg->replicas)
		why = "a staged re-shard is not built with cluster.replicas: 1";
	else if (s->stop_committed)
		why = "the re-shard's stop is committed already";
	if (!why && s->ckpt_job) {
		/* a re-sharded shard writes its first checkpoint as it starts to
		 * serve: a re-shard soon after is staged once it is written */
		s->precopy_pending = 1;
		ps_info("re-shard pre-copy (SIGUSR1): a checkpoint is being written now; the "
			"pre-copy's starts once it ends");
		return;
	}
	if (why) {
		ps_warn("re-shard pre-copy (SIGUSR1) not taken: %s", why);
		return;
	}
	/* set before the write ends: a full checkpoint after it is still a
	 * base (a staged shard finds it is another and loads it whole) */
	s->precopy = 1;
	/* the stop's incremental checkpoint carries the ids the cap and the
	 * TTL drop from here on, as with checkpoint.incremental (without it,
	 * a dropped row would come back in the staged shards) */
	for (int t = 0; s->rows && t < s->rows->ntables; t++)
		s->rows->t[t].tb.track_tombs = 1;
	ps__srv_ckpt_start_full(s, "re-shard pre-copy");
}

void ps__srv_on_ckpt_timer(uv_timer_t *t)
{
	struct ps_server *s = t->data;
	char err[512] = "";

	if (ckpt_start(s, "periodic", NULL, 0, 0, err, sizeof(err)) == -EBUSY)
		ps_info("periodic checkpoint skipped: the last one is still being written");
}

void ps__srv_ckpt_forget(struct ps_server *s, struct ps_srv_conn *sc)
{
	if (s->ckpt_job && s->ckpt_job->requester == sc)
		s->ckpt_job->requester = NULL;
}

/* A Stats request with checkpoint set. Answered now when refused, else
 * once the checkpoint is written (ckpt_done). */
static void checkpoint_request(struct ps_server *s, struct ps_srv_conn *sc,
			       const Ps__StatsRequest *m)
{
	const struct ps_checkpoint_cfg *ck = &s->cfg->checkpoint;
	double now = ps_now_s();
	char err[600] = "";
	int rc = PS_ESTATE;

	if (!s->ckpt_path[0])
		snprintf(err, sizeof(err), "checkpoints are off (no checkpoint.dir)");
	else if (!ck->on_request)
		snprintf(err, sizeof(err), "this shard writes checkpoints on request only with "
			 "checkpoint.on_request: true");
	else if (s->ckpt_last_request > 0 && now - s->ckpt_last_request < ck->min_interval_s)
		snprintf(err, sizeof(err), "the last checkpoint on request started %.1f s ago; at "
			 "most one per %d s (checkpoint.min_interval_s)", now - s->ckpt_last_request,
			 ck->min_interval_s);
	else if (!(rc = ckpt_start(s, "on request", sc, m->req_id, 0, err, sizeof(err)))) {
		s->ckpt_last_request = now;
		return; /* answered by ckpt_done */
	}
	if (rc == -EBUSY)
		rc = PS_ESTATE;
	ps_warn("checkpoint asked by %s refused: %s", sc->conn->peer, err);
	send_stats(s, sc, m->req_id, NULL, rc, err, NULL);
}

/* A worker found the other shards resumed at a newer clock than this
 * fresh one (HelloReply.fresh): without this, its pushes would wait at
 * this shard's clock for clocks nobody will push again (a deadlock). Every
 * worker's finished clock moves up to the others' clock, so the slices'
 * versions do too; the updates of the clocks between, which this shard's
 * checkpoint did not hold, are lost, and the log says so once. */
static void bring_forward(struct ps_server *s, struct ps_srv_conn *sc, uint64_t clock)
{
	uint64_t from = ps__srv_resume_clock(s);

	if (clock <= from || clock >= PS_MAX_CLOCK || s->c.pushes)
		return; /* another worker did it already, or the shard has moved on */
	for (int r = 0; r < s->cfg->nworkers; r++)
		if (s->finished[r] < clock) {
			s->finished[r] = clock;
			ps__repl_note_finished(s, r);
		}
	ps_store_advance(&s->store);
	ps__rows_advance(s);
	if (s->waiting)
		ps__srv_answer_pulls(s);
	ps_warn("resumed at clock %" PRIu64 " but the other shards' checkpoints are at clock %"
		PRIu64 " (worker %d found): brought forward to %" PRIu64 "; this shard's updates "
		"of clocks %" PRIu64 "..%" PRIu64 " are lost (they came after its checkpoint)", from,
		clock, sc->rank, ps__srv_resume_clock(s), from, clock - 1);
}

void ps__srv_handle_stats(struct ps_server *s, struct ps_srv_conn *sc, const Ps__StatsRequest *m)
{
	if (m->resume_clock && sc->rank >= 0)
		bring_forward(s, sc, m->resume_clock);
	if (m->stop_at || m->stop_commit || m->stop_cancel) {
		char err[400];
		int rc = ps__srv_stop_request(s, sc, m, err, sizeof(err));
		if (rc) {
			ps_warn("re-shard stop asked by %s refused: %s", sc->conn->peer, err);
			ps_msg_send_error(sc->conn, m->req_id, rc, "%s", err);
			return;
		}
	}
	if (m->checkpoint)
		checkpoint_request(s, sc, m);
	else
		send_stats(s, sc, m->req_id, NULL, 0, NULL, m);
}

/* The counters; with ck_err set, also a checkpoint's outcome (ck the
 * written one, or NULL when it was refused with ck_status); with q, the
 * answer to its membership request (members.h). */
static void send_stats(struct ps_server *s, struct ps_srv_conn *sc, uint64_t req_id,
		       const struct ps_ckpt_job *ck, int ck_status, const char *ck_err,
		       const Ps__StatsRequest *q)
{
	Ps__Stats st = PS__STATS__INIT;
	char member_err[300];
	int nw = s->cfg->nworkers;
	Ps__WorkerClock *wc = calloc((size_t)nw, sizeof(*wc));
	Ps__WorkerClock **wp = calloc((size_t)nw, sizeof(*wp));

	if (!wc || !wp) {
		ps_msg_send_error(sc->conn, req_id, -ENOMEM, "out of memory");
		goto out_free;
	}
	for (int r = 0; r < nw; r++) {
		ps__worker_clock__init(&wc[r]);
		wc[r].rank = r;
		wc[r].clock = s->finished[r];
		wc[r].connected = s->connected[r] > 0;
		wc[r].dedup_seq = s->dedup[r].max;
		wc[r].dedup_digest = ps_dedup_digest(&s->dedup[r]);
		wp[r] = &wc[r];
	}
	if (ck_err) {
		st.checkpoint_status = ck_status;
		st.checkpoint_path = ck ? (char *)ck->path : s->ckpt_path;
		st.checkpoint_error = (char *)(ck_status ? ck_err : "");
		if (ck) {
			st.checkpoint_bytes = ck->bytes;
			st.checkpoint_seconds = ck->secs;
		}
	}
	st.req_id = req_id;
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
	st.reader_refused = s->c.reader_refused;
	if (s->ckpt_path[0]) {
		st.checkpoint_on = 1;
		st.checkpoint_age_s = ps_now_s() - (s->ckpt_last_ok ? s->ckpt_last_ok : s->started);
		st.checkpoint_failures = s->ckpt_failures;
		st.checkpoint_every_s = (uint32_t)s->cfg->checkpoint.every_s;
	}
	st.connections = (uint32_t)s->nconns;
	if (s->transport->ops->queue_stats) {
		struct ps_queue_stats q;
		s->transport->ops->queue_stats(s->transport, &q);
		st.reply_queue_bytes = q.bytes;
		st.reply_queue_peak = q.peak_conn;
		st.reply_queue_total_peak = q.peak_total;
		st.paused_connections = (uint32_t)q.paused;
	}
	st.stop_at = s->stop_at;
	st.stop_committed = s->stop_committed;
	st.top_clock = s->top_clock;
	st.decl_digest = ps__srv_decl_digest(s);
	st.decl_tensors = s->cfg->declare ? (uint32_t)s->cfg->ntensors : 0;
	st.decl_tables = (uint32_t)s->cfg->ndecl_tables;
	st.map_epoch = s->map_epoch;
	st.reshard_in_bytes = s->reshard_in_bytes;
	st.reshard_in_slices = s->reshard_in_slices;
	st.reshard_in_rows = s->reshard_in_rows;
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
	/* the answer to a stop or a join is read for its clocks only */
	if (ps__members_stats(s, sc, q, &st, member_err, sizeof(member_err)) ||
	    ps__rows_stats(s, &st, !(q && (q->member_op != PS__MEMBER_OP__MEMBER_NONE || q->stop_at ||
					 q->stop_commit || q->stop_cancel || q->no_checksums)))) {
		ps_msg_send_error(sc->conn, req_id, -ENOMEM, "out of memory");
		goto out_free;
	}
	char partner[320];
	ps__repl_stats(s, &st, partner, sizeof(partner));
	if (q && (q->member_op != PS__MEMBER_OP__MEMBER_NONE || q->stop_at || q->stop_commit ||
		  q->stop_cancel) && s->repl && ps__repl_serving(s)) {
		/* a join step's answer, or a re-shard stop's: once the backup
		 * has the membership or the stop it tells of (as a push's ack
		 * waits for its batch) */
		if (ps__repl_reply_later(s, sc, PS_MSG_STATS, &st.base))
			ps_msg_send_error(sc->conn, req_id, -ENOMEM, "out of memory");
	} else {
		ps_msg_send(sc->conn, PS_MSG_STATS, &st.base, NULL, 0, PS_SEND_VOLATILE, NULL,
			    NULL);
	}
	ps__rows_stats_free(&st);
out_free:
	free(st.members);
	free(wc);
	free(wp);
}

/* it_reshard_order.c - a worker's pushes keep their order across a
 * re-shard's stop that is raised (server/stop.c, "Order"): a real shard,
 * two workers spoken frame by frame (test_raw.h), a libps monitor.
 *
 * The monitor asks the shard to stop at clock 1; worker 0's first push of
 * clock 1 (slice a) is refused with PS_ERESHARD. The monitor raises the
 * stop to 2 (as ps-stat does when another shard took a push for 1). Worker
 * 0's next push, the one ending clock 1 (slice b), was on its way: it must
 * be refused too, naming the push that comes first. Taken, it would close
 * clock 1 on slice a without worker 0's gradient, and the refused push,
 * sent again, would be refused for a clock passed: the worker failed (seen
 * under load in it_reshard_live_pairs.sh). Then worker 1 pushes clock 1,
 * worker 0 sends its two pushes again in order, both are taken, and the
 * weights are the exact sums of both workers' gradients.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "config.h"
#include "msg.h"
#include "ps_client.h"
#include "ps_err.h"
#include "shardmap.h"
#include "test_raw.h"
#include "test_util.h"

#define N 4

static struct ps_config cfg;
static struct ps_shardmap map;

/* A push of clock (ending it when end) of slice sl (N floats), numbered
 * seq. */
static void push_msg(Ps__Push *m, Ps__SliceRef *ref, Ps__SliceRef **ptr, uint64_t seq,
		     uint64_t clock, int end, uint32_t sl)
{
	ps__push__init(m);
	ps__slice_ref__init(ref);
	ref->slice = sl;
	ref->length = N * sizeof(float);
	*ptr = ref;
	m->req_id = seq;
	m->seq = seq;
	m->clock = clock;
	m->end_clock = end;
	m->n_slices = 1;
	m->slices = ptr;
}

/* Sends push m with payload g (len bytes) and expects its PushAck. */
static void push_acked(int fd, Ps__Push *m, const float *g, size_t len, const char *what)
{
	unsigned t = 0;
	ProtobufCMessage *r;

	ck_assert_int_eq(tu_raw_send(fd, PS_MSG_PUSH, &m->base, g, len), 0);
	r = tu_raw_recv(fd, &t);
	ck_assert_msg(r != NULL, "%s: no answer", what);
	ck_assert_msg(t == PS_MSG_PUSH_ACK, "%s: got %s (%s), not an ack", what,
		      ps_wire_type_name(t),
		      t == PS_MSG_ERROR ? ((Ps__Error *)r)->message : "");
	protobuf_c_message_free_unpacked(r, NULL);
}

/* A push of both slices (g2: a's N floats, then b's) ending clock, numbered
 * seq, acknowledged. */
static void push_both(int fd, uint64_t seq, uint64_t clock, const float *g2, const char *what)
{
	Ps__Push m;
	Ps__SliceRef ref[2], *ptr[2];

	push_msg(&m, &ref[0], &ptr[0], seq, clock, 1, 0);
	ps__slice_ref__init(&ref[1]);
	ref[1].slice = 1;
	ref[1].offset = N * sizeof(float);
	ref[1].length = N * sizeof(float);
	ptr[1] = &ref[1];
	m.n_slices = 2;
	push_acked(fd, &m, g2, 2 * N * sizeof(float), what);
}

START_TEST(test_raised_stop_keeps_order)
{
	char path[64], yaml[1024], err[512], ckd[64] = "/tmp/ps-order-ck.XXXXXX";
	struct ps_shard_stats st;
	struct ps_client *mon = NULL;
	Ps__Push m;
	Ps__SliceRef ref, *ptr;
	const float g0a[N] = { 1, 2, 3, 4 }, g0b[N] = { 10, 20, 30, 40 };
	const float g1[2 * N] = { 100, 200, 300, 400, 1000, 2000, 3000, 4000 };
	const float c0[2 * N] = { 0 };
	int port = tu_free_port(), fd[2];

	ck_assert_ptr_nonnull(mkdtemp(ckd));
	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [127.0.0.1:%d]\n  workers: 2\n"
		 "consistency:\n  mode: sync\n"
		 "security:\n  auth: false\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n"
		 "slice_bytes: 1024\n"
		 "model:\n  tensors:\n    - {name: a, shape: [%d], init: zeros}\n"
		 "    - {name: b, shape: [%d], init: zeros}\n"
		 "checkpoint:\n  dir: %s\n  every_s: 0\n"
		 "limits:\n  request_timeout_ms: 10000\n"
		 "log:\n  level: warn\n", port, N, N, ckd);
	ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	ck_assert_msg(ps_config_load(&cfg, path, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(ps_shardmap_init(&map, &cfg), 0);
	ck_assert_int_eq(map.nslices, 2);
	pid_t srv = tu_start_server(path, 0);
	fd[0] = tu_raw_join(port, &cfg, &map, 0, 0);
	fd[1] = tu_raw_join(port, &cfg, &map, 0, 1);
	ck_assert_msg(ps_client_init(&mon, &cfg, -1, err, sizeof(err)) == 0, "%s", err);
	/* both workers' clock 0 (to have a clock to stop at) */
	push_both(fd[0], 1, 0, c0, "worker 0's clock 0");
	push_both(fd[1], 1, 0, c0, "worker 1's clock 0");

	/* stop at 1: worker 0's first push of clock 1 refused */
	ck_assert_msg(ps_client_stop_at(mon, 0, 1, 0, &st) == 0, "%s", ps_client_error(mon));
	push_msg(&m, &ref, &ptr, 2, 1, 0, 0);
	tu_raw_expect_error(fd[0], PS_MSG_PUSH, &m.base, g0a, sizeof(g0a), PS_ERESHARD,
			    "the shard stops at clock 1", NULL);
	/* raised to 2; the push behind it (ending clock 1) waits behind it */
	ck_assert_msg(ps_client_stop_at(mon, 0, 2, 0, &st) == 0, "%s", ps_client_error(mon));
	push_msg(&m, &ref, &ptr, 3, 1, 1, 1);
	tu_raw_expect_error(fd[0], PS_MSG_PUSH, &m.base, g0b, sizeof(g0b), PS_ERESHARD,
			    "push 3 for clock 1 refused: push 2 of this worker",
			    "comes first");
	push_both(fd[1], 2, 1, g1, "worker 1's clock 1");
	/* worker 0 sends both again, in order: both taken */
	push_msg(&m, &ref, &ptr, 2, 1, 0, 0);
	push_acked(fd[0], &m, g0a, sizeof(g0a), "worker 0's refused push sent again");
	push_msg(&m, &ref, &ptr, 3, 1, 1, 1);
	push_acked(fd[0], &m, g0b, sizeof(g0b), "worker 0's push behind it sent again");
	/* a push of clock 2 is the stop's again (not held: it has its own) */
	push_msg(&m, &ref, &ptr, 4, 2, 1, 0);
	tu_raw_expect_error(fd[0], PS_MSG_PUSH, &m.base, g0a, sizeof(g0a), PS_ERESHARD,
			    "the shard stops at clock 2", NULL);

	/* clock 1 closed with every gradient: w = -(g0 + g1) (sgd, lr 1) */
	{
		Ps__Pull pl = PS__PULL__INIT;
		uint32_t ids[2] = { 0, 1 };
		uint8_t *pay = NULL;
		size_t plen = 0;
		unsigned t = 0;

		pl.req_id = 9;
		pl.min_version = 2;
		pl.clock = 2;
		pl.n_slices = 2;
		pl.slices = ids;
		ck_assert_int_eq(tu_raw_send(fd[1], PS_MSG_PULL, &pl.base, NULL, 0), 0);
		ProtobufCMessage *r = tu_raw_recv_pay(fd[1], &t, &pay, &plen);
		ck_assert_msg(r && t == PS_MSG_PULL_REPLY, "the pull of clock 2 not answered (%s)",
			      t == PS_MSG_ERROR ? ((Ps__Error *)r)->message : "");
		Ps__PullReply *pr = (Ps__PullReply *)r;
		ck_assert_int_eq(pr->n_slices, 2);
		for (size_t k = 0; k < 2; k++) {
			const Ps__SliceRef *s = pr->slices[k];
			const float *w = (const float *)(pay + s->offset);
			const float *g = s->slice == 0 ? g0a : g0b;
			ck_assert_int_eq(s->version, 2);
			for (int i = 0; i < N; i++)
				ck_assert_msg(w[i] == -(g[i] + g1[s->slice * N + i]),
					      "slice %u [%d] = %g, expected %g", s->slice, i,
					      (double)w[i], (double)-(g[i] + g1[s->slice * N + i]));
		}
		protobuf_c_message_free_unpacked(r, NULL);
		free(pay);
	}
	ck_assert_msg(ps_client_stop_at(mon, 0, 0, PS_STOP_CANCEL, &st) == 0, "%s",
		      ps_client_error(mon));
	ps_client_free(mon);
	close(fd[0]);
	close(fd[1]);
	ck_assert_int_eq(tu_stop_server(srv), 0);
	ps_shardmap_free(&map);
	unlink(path);
	tu_rmtree(ckd);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("reshard_order");
	TCase *tc = tcase_create("order");

	tcase_set_timeout(tc, 60);
	TU_ADD(tc, test_raised_stop_keeps_order);
	suite_add_tcase(s, tc);
	return tu_run_suite(s);
}

/* it_rows_errors.c - the rarely taken error replies of the row path
 * (server/rows.c), with a real shard and a worker connection spoken frame
 * by frame (test_raw.h): each bad request is answered with its code and a
 * message naming what was wrong, and afterwards the connection still
 * serves and the table is as it was (its checksum, version and rows), the
 * refusals counted in the shard's errors.
 *
 * Pulls: a reply codec that does not exist, a reply too large for
 * limits.max_frame_bytes. Pushes: an unknown table (its name's control
 * bytes shown as '?'), another dim, an unknown codec, an fp16 payload of
 * the wrong size, a clock past limits.max_clock_ahead, a second push of
 * one table and clock, a refused push sent again (the same answer, not
 * applied), a push number below the dedup window. Then the good pushes of
 * both workers make the clock, and the rows are their exact sum.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "config.h"
#include "msg.h"
#include "ps_client.h"
#include "ps_err.h"
#include "rows_wire.h"
#include "shardmap.h"
#include "test_raw.h"
#include "test_util.h"

#define DIM 4

static char path[64];
static struct ps_config cfg;
static pid_t srv;
static int port;

static struct ps_client *connect_retry(int rank)
{
	struct ps_client *c = NULL;
	char err[512];
	int rc = -1;

	for (int i = 0; i < 100; i++) {
		rc = ps_client_init(&c, &cfg, rank, err, sizeof(err));
		if (rc != -ECONNREFUSED)
			break;
		tu_sleep_ms(100);
	}
	ck_assert_msg(rc == 0, "rank %d: %s", rank, err);
	return c;
}

static uint64_t dups;

/* Table e's figures, the shard's errors (and its duplicate pushes in dups). */
static struct ps_table_stats table_e(struct ps_client *c, uint64_t *errors)
{
	struct ps_shard_stats st;

	ck_assert_int_eq(ps_client_stats(c, 0, &st), 0);
	ck_assert_str_eq(st.tables[0].name, "e");
	*errors = st.errors;
	dups = st.duplicate_pushes;
	return st.tables[0];
}

START_TEST(test_row_error_replies)
{
	char yaml[1024], err[512];
	struct ps_shardmap map;
	uint64_t ids[2] = { 5, 9 }, e0, e1;
	uint8_t enc[32], pay[8 + 2 * DIM * 4];
	float g0[2 * DIM] = { 1, 2, 3, 4, -1, -2, -3, -4 };
	unsigned t;
	int refused = 0;

	port = tu_free_port();
	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [127.0.0.1:%d]\n  workers: 2\n"
		 "consistency:\n  mode: sync\n"
		 "security:\n  auth: false\n"
		 "limits:\n  max_clock_ahead: 8\n  request_timeout_ms: 10000\n"
		 "model:\n  tensors:\n    - {name: w, shape: [8], init: zeros}\n"
		 "  embeddings:\n    - {name: e, dim: %d, init: zeros, optimizer: sgd, lr: 1}\n"
		 "    - {name: f, dim: 4096, init: zeros}\n"
		 "log:\n  level: warn\n", port, DIM);
	ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	ck_assert_msg(ps_config_load(&cfg, path, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(ps_shardmap_init(&map, &cfg), 0);
	srv = tu_start_server(path, 0);
	int fd = tu_raw_join(port, &cfg, &map, 0, 0);
	struct ps_client *c1 = connect_retry(1);
	struct ps_table_stats before = table_e(c1, &e0);
	uint64_t d0 = dups;
	size_t il = ps_rows_ids_encode(ids, 2, enc);

	/* ---- pulls ---- */
	Ps__PullRows p = PS__PULL_ROWS__INIT;
	p.req_id = 1;
	p.table = "e";
	p.dim = DIM;
	p.n_ids = 2;
	p.codec = 7;
	tu_raw_expect_error(fd, PS_MSG_PULL_ROWS, &p.base, enc, il, PS_EPROTO,
			    "raw (0) or fp16 (1), not codec 7", NULL);
	refused++;
	/* 5000 rows of dim 4096: 80 MB, past the 64 MiB frame limit */
	p.codec = 0;
	p.table = "f";
	p.dim = 4096;
	p.n_ids = 5000;
	tu_raw_expect_error(fd, PS_MSG_PULL_ROWS, &p.base, enc, il, PS_ETOOBIG,
			    "a reply of 5000 rows of dim 4096", "limits.max_frame_bytes");
	refused++;

	/* ---- pushes: nothing of any of them applied ---- */
	Ps__PushRows q = PS__PUSH_ROWS__INIT;
	memset(pay, 0, sizeof(pay));
	memcpy(pay, enc, il);
	memcpy(pay + 4, g0, sizeof(g0)); /* ids padded to 4 bytes */
	q.table = "e";
	q.dim = DIM;
	q.n_ids = 2;
	q.ids_bytes = il;
	q.clock = 0;

	q.req_id = 10;
	q.seq = 100;
	q.table = "no\x01such";
	tu_raw_expect_error(fd, PS_MSG_PUSH_ROWS, &q.base, pay, 4 + sizeof(g0), PS_ENOTENSOR,
			    "no embedding table 'no?such'", NULL);
	refused++;
	q.table = "e";
	q.req_id = 11;
	q.seq = 101;
	q.dim = DIM + 1;
	tu_raw_expect_error(fd, PS_MSG_PUSH_ROWS, &q.base, pay, 4 + sizeof(g0), PS_ESHAPE,
			    "table 'e' has dim 4, the request says 5", NULL);
	refused++;
	q.dim = DIM;
	q.req_id = 12;
	q.seq = 102;
	q.codec = 9;
	tu_raw_expect_error(fd, PS_MSG_PUSH_ROWS, &q.base, pay, 4 + sizeof(g0), PS_EPROTO,
			    "row push to table 'e': row gradients can be raw (0) or fp16 (1), not "
			    "codec 9", "nothing of it was applied");
	refused++;
	/* fp16: 2 bytes a value, so this payload has twice the bytes */
	q.req_id = 13;
	q.seq = 103;
	q.codec = 1;
	tu_raw_expect_error(fd, PS_MSG_PUSH_ROWS, &q.base, pay, 4 + sizeof(g0), PS_ESHAPE,
			    "does not hold", "2 rows of dim 4");
	refused++;
	q.codec = 0;
	q.req_id = 14;
	q.seq = 104;
	q.clock = 8;
	tu_raw_expect_error(fd, PS_MSG_PUSH_ROWS, &q.base, pay, 4 + sizeof(g0), PS_ECLOCK,
			    "row push for clock 8 but table 'e' is at version 0",
			    "accepting clocks 0..7");
	refused++;
	/* push 102 again: the answer it got, and still not applied */
	q.req_id = 15;
	q.seq = 102;
	q.codec = 9;
	q.clock = 0;
	tu_raw_expect_error(fd, PS_MSG_PUSH_ROWS, &q.base, pay, 4 + sizeof(g0), PS_EPROTO,
			    "row push 102 was refused when it first came", NULL);
	q.codec = 0;

	/* the connection serves, the table is as it was */
	p.req_id = 2;
	p.table = "e";
	p.dim = DIM;
	p.n_ids = 2;
	ck_assert_int_eq(tu_raw_send(fd, PS_MSG_PULL_ROWS, &p.base, enc, il), 0);
	uint8_t *rp = NULL;
	size_t rl = 0;
	ProtobufCMessage *r = tu_raw_recv_pay(fd, &t, &rp, &rl);
	ck_assert_ptr_nonnull(r);
	ck_assert_int_eq(t, PS_MSG_PULL_ROWS_REPLY);
	ck_assert_uint_eq(((Ps__PullRowsReply *)r)->n_rows, 2);
	ck_assert_uint_eq(rl, 2 * DIM * 4);
	for (size_t i = 0; i < 2 * DIM; i++) {
		float v;
		memcpy(&v, rp + 4 * i, 4);
		ck_assert_msg(v == 0.0f, "row value %zu is %g after refused pushes", i, (double)v);
	}
	free(rp);
	protobuf_c_message_free_unpacked(r, NULL);
	struct ps_table_stats mid = table_e(c1, &e1);
	ck_assert_uint_eq(mid.checksum, before.checksum);
	ck_assert_uint_eq(mid.version, 0);
	ck_assert_uint_eq(mid.rows, 0);
	ck_assert_uint_eq(mid.pushed_rows, 0);
	/* every refusal counted; the resent push as a duplicate */
	ck_assert_uint_eq(e1 - e0, (uint64_t)refused);
	ck_assert_uint_eq(dups - d0, 1);

	/* a good push of clock 0 (kept until worker 1's), then a second push
	 * of the same table and clock, and a number below the window */
	q.req_id = 20;
	q.seq = 5000;
	ck_assert_int_eq(tu_raw_send(fd, PS_MSG_PUSH_ROWS, &q.base, pay, 4 + sizeof(g0)), 0);
	r = tu_raw_recv(fd, &t);
	ck_assert_ptr_nonnull(r);
	ck_assert_msg(t == PS_MSG_PUSH_ACK, "a %s frame: %s", ps_wire_type_name(t),
		      t == PS_MSG_ERROR ? ((Ps__Error *)r)->message : "");
	protobuf_c_message_free_unpacked(r, NULL);
	q.req_id = 21;
	q.seq = 5001;
	tu_raw_expect_error(fd, PS_MSG_PUSH_ROWS, &q.base, pay, 4 + sizeof(g0), PS_EDUP,
			    "worker 0 already pushed rows of table 'e' for clock 0",
			    "one push per table, shard and clock");
	q.req_id = 22;
	q.seq = 5000 - 4096;
	tu_raw_expect_error(fd, PS_MSG_PUSH_ROWS, &q.base, pay, 4 + sizeof(g0), PS_EDUP,
			    "row push 904 is older than the pushes this shard remembers", NULL);
	/* worker 1's rows end the clock: each row is minus the sum, once */
	float g1[2 * DIM] = { 10, 20, 30, 40, 50, 60, 70, 80 }, out[2 * DIM];
	int64_t id = ps_client_push_rows_async(c1, "e", 0, ids, 2, g1, 0);
	ck_assert_msg(id > 0 && ps_client_wait(c1, id) == 0, "%s", ps_client_error(c1));
	ck_assert_msg(ps_client_pull_rows(c1, "e", 1, ids, 2, out) == 0, "%s", ps_client_error(c1));
	for (int i = 0; i < 2 * DIM; i++)
		ck_assert_msg(out[i] == -(g0[i] + g1[i]), "row value %d: %g, %g due", i,
			      (double)out[i], (double)-(g0[i] + g1[i]));
	struct ps_table_stats after = table_e(c1, &e1);
	ck_assert_uint_eq(after.version, 1);
	ck_assert_uint_eq(after.rows, 2);
	ck_assert_uint_eq(after.pushed_rows, 2);
	ck_assert_uint_eq(e1 - e0, (uint64_t)refused + 2);
	close(fd);
	ps_client_free(c1);
	ps_shardmap_free(&map);
	ck_assert_int_eq(tu_stop_server(srv), 0);
	unlink(path);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("rows_errors");
	TCase *tc = tcase_create("shard");
	int rc;

	tcase_set_timeout(tc, 60);
	TU_ADD(tc, test_row_error_replies);
	suite_add_tcase(s, tc);
	rc = tu_run_suite(s);
	return rc;
}

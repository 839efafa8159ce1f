/* it_fault_repl.c - the failure paths of replication: system calls and
 * allocations made to fail by libpsfault.so (tests/fault_inject.c,
 * tests/test_fault.h) in the two ps-server processes of one replicated
 * shard (a dense tensor and an embedding table, SGD lr 1, integer
 * gradients: every weight and row is its exact sum), over real sockets.
 *
 * A rejoining backup whose write of the snapshot's tables into a memory
 * file is interrupted or cut short (retried: one state transfer, no
 * error) or fails, or that gets no memory file (it says so, the link
 * closes, the next transfer brings it in sync: equal checksums); a backup
 * out of memory creating the rows a batch brings (it says so and gets the
 * state again); a backup out of memory at its Nth allocation of a join
 * (never a crash, always in sync); the primary out of memory copying a
 * declaration (no crash, the error said, the declaration served). After
 * each, the primary killed -9: the backup serves exact sums.
 *
 * Skipped (exit 77, the reason printed) in the sanitizer build and under
 * valgrind.
 */
#include "test_fault.h"

/* A pair holding the dense tensor a and the table e (SGD, lr 1), both
 * processes started with the fault spec armed after the log line after
 * (NULL, NULL: none); m zeroed. The primary's replica number. */
static int start_model_pair(struct model *m, pid_t *p, const char *spec, const char *after)
{
	int pr;

	write_pair_cfg("model:\n  tensors:\n    - {name: a, shape: [3000], init: zeros}\n"
		       "  embeddings:\n    - {name: e, dim: 4, init: zeros, optimizer: sgd, lr: 1}\n",
		       60000);
	memset(m, 0, sizeof(*m));
	p[0] = start_faulted(0, spec, after);
	p[1] = start_faulted(1, spec, after);
	pr = tu_wait_pair(&cfg, 0, 30);
	ck_assert_msg(pr >= 0, "the pair never formed (logs in %s)", dir);
	return pr;
}

/* A backup joining a primary with rows; its write of the snapshot's
 * tables to a memory file: _i 0 interrupted, 1 cut short (both retried: one
 * transfer, no error), 2 failed, 3 no memory file (both said, the link
 * closed, the next transfer in sync). Then the primary killed: the backup
 * serves exact sums. */
START_TEST(test_snapshot_faults)
{
	static const char *spec[] = { "write:1:EINTR:file", "write:1:short:file",
				      "write:1:EIO:file", "memfd_create:1:EMFILE" };
	static struct model m;
	struct ps_client *c;
	pid_t p[2];
	int pr, b;

	pr = start_model_pair(&m, p, NULL, NULL);
	b = 1 - pr;
	c = connect_retry(&cfg, 0);
	for (int k = 0; k < 2; k++)
		train_clock(c, &m);
	/* the backup leaves; rows change without it; it comes back faulted */
	kill(p[b], SIGKILL);
	tu_wait_child(p[b]);
	train_clock(c, &m);
	unlink(rlog(b));
	p[b] = start_faulted(b, spec[_i], NULL);
	ck_assert_msg(tu_wait_pair(&cfg, 0, 30) == pr, "%s: the backup never got in sync (logs in "
		      "%s)", spec[_i], dir);
	ck_assert_msg(faults_made() == 1, "%s: the fault did not land (%s)", spec[_i],
		      slurp(flog));
	assert_in_sync(m.clock, spec[_i]);
	ck_assert_int_eq(tu_file_count(rlog(b), "state received"), 1);
	if (_i < 2) {
		ck_assert_msg(!tu_file_count(rlog(b), "the snapshot's embedding tables"), "%s: retried, "
			      "yet: %s", spec[_i], slurp(rlog(b)));
	} else {
		ck_assert_msg(tu_file_count(rlog(b), _i == 2 ? "the snapshot's embedding tables: cannot "
					"write them to a memory file (0 of " :
					"the snapshot's embedding tables: cannot make a memory file: "
					"Too many open files"), "%s: the backup does not say why its "
			      "first transfer failed: %s", spec[_i], slurp(rlog(b)));
	}
	train_clock(c, &m);
	check_exact(c, &m, spec[_i]);
	assert_in_sync(m.clock, spec[_i]);
	/* the backup takes over: the same sums */
	kill(p[pr], SIGKILL);
	tu_wait_child(p[pr]);
	check_exact(c, &m, "after the takeover");
	train_clock(c, &m);
	check_exact(c, &m, "a clock after the takeover");
	ps_client_free(c);
	ck_assert_int_eq(tu_stop_server(p[b]), 0);
	unlink(cfg_path);
	tu_rmtree(dir);
}
END_TEST

/* The backup out of memory creating rows a batch brings (the first
 * chunk of the table's rows, 1 MiB, not allocated once it holds the
 * state): it says so, the state is transferred again, and the two
 * processes end with equal checksums; exact after the primary's kill. */
START_TEST(test_backup_rows_oom)
{
	static struct model m;
	struct ps_client *c;
	const char *spec = "malloc:1:ENOMEM:=1048576"; /* PS_TABLE_CHUNK rows of 4 floats */
	pid_t p[2];
	int pr, b;

	/* both faulted, armed by the line only a backup writes */
	pr = start_model_pair(&m, p, spec, "state received");
	b = 1 - pr;
	c = connect_retry(&cfg, 0);
	for (int k = 0; k < 3; k++)
		train_clock(c, &m);
	ck_assert_msg(faults_made() == 1, "the fault did not land (%s)", slurp(flog));
	ck_assert_msg(tu_file_count(rlog(b), "out of memory creating row"), "the backup does not say it "
		      "could not create a row: %s", slurp(rlog(b)));
	assert_in_sync(m.clock, spec);
	check_exact(c, &m, spec);
	kill(p[pr], SIGKILL);
	tu_wait_child(p[pr]);
	check_exact(c, &m, "after the takeover");
	ps_client_free(c);
	ck_assert_int_eq(tu_stop_server(p[b]), 0);
	unlink(cfg_path);
	tu_rmtree(dir);
}
END_TEST

/* The primary out of memory for the rows of a push (the first chunk of
 * rows, 1 MiB, not allocated once the worker connected; _i 0 sync, 1
 * async): room for a push's new rows is made before it is acknowledged,
 * so the primary refuses that push and takes it sent again; nothing
 * acknowledged is lost, the two processes hold the same tables (equal
 * checksums: the backup is not sent rows the primary does not have) and
 * every row is at its exact sum. */
START_TEST(test_primary_rows_oom)
{
	static struct model m;
	struct ps_client *c;
	const char *spec = "malloc:1:ENOMEM:=1048576"; /* PS_TABLE_CHUNK rows of 4 floats */
	pid_t p[2];
	int pr, b;

	pair_mode = _i ? "async" : "sync";
	/* both faulted, armed by the line only the primary writes */
	pr = start_model_pair(&m, p, spec, "worker 0 connected");
	pair_mode = "sync";
	b = 1 - pr;
	c = connect_retry(&cfg, 0);
	int refused = 0;
	for (int k = 0; k < 3; k++)
		train_clock_retry(c, &m, &refused, spec);
	ck_assert_msg(faults_made() == 1, "the fault did not land (%s)", slurp(flog));
	ck_assert_msg(refused >= 1, "the primary took the push it had no room for");
	ck_assert_msg(!tu_file_count(rlog(pr), "is lost") && !tu_file_count(rlog(pr), "are lost"),
		      "the primary lost an acknowledged gradient: %s", slurp(rlog(pr)));
	{
		struct ps_shard_stats st[2];
		double t0 = ps_now_s();
		int ok = 0;
		while (!ok && ps_now_s() - t0 < 10 * tu_time_scale()) {
			ok = tu_replica_stats(&cfg, 0, 0, -1, &st[0]) == 0 &&
			     tu_replica_stats(&cfg, 0, 1, -1, &st[1]) == 0 &&
			     st[0].repl_lsn == st[1].repl_lsn && st[0].worker_clock[0] == m.clock &&
			     st[1].worker_clock[0] == m.clock;
			if (!ok)
				tu_sleep_ms(20);
		}
		ck_assert_msg(ok, "the two processes never stood at the same batch");
		ck_assert_msg(st[0].tables[0].checksum == st[1].tables[0].checksum &&
			      st[0].tables[0].rows == st[1].tables[0].rows, "the primary's table "
			      "(%llu rows, checksum %llx) and the backup's (%llu rows, %llx) differ",
			      (unsigned long long)st[pr].tables[0].rows,
			      (unsigned long long)st[pr].tables[0].checksum,
			      (unsigned long long)st[b].tables[0].rows,
			      (unsigned long long)st[b].tables[0].checksum);
	}
	check_exact(c, &m, _i ? "async" : "sync");
	ps_client_free(c);
	for (int r = 0; r < 2; r++)
		ck_assert_int_eq(tu_stop_server(p[r]), 0);
	unlink(cfg_path);
	tu_rmtree(dir);
}
END_TEST

/* A backup joining a primary with rows, out of memory at its Nth
 * allocation after its partner answered (N over 1..89, spread, until
 * the join makes fewer allocations): it never
 * crashes; it gets in sync, or ends saying why (then started again
 * without the fault, it does); equal checksums, exact sums. */
START_TEST(test_backup_join_oom)
{
	static const int nth[] = { 1, 2, 3, 4, 5, 6, 8, 10, 13, 17, 21, 27, 34, 44, 55, 70, 89 };
	static struct model m;
	struct ps_client *c;
	char spec[64];
	pid_t p[2];
	int pr, b, ended = 0, landed = 0;

	pr = start_model_pair(&m, p, NULL, NULL);
	b = 1 - pr;
	c = connect_retry(&cfg, 0);
	train_clock(c, &m);
	for (size_t i = 0; i < sizeof(nth) / sizeof(nth[0]); i++) {
		int ws = 0;
		kill(p[b], SIGKILL);
		tu_wait_child(p[b]);
		train_clock(c, &m);
		unlink(rlog(b));
		snprintf(spec, sizeof(spec), "alloc:%d", nth[i]);
		/* armed once the backup's dial is answered: OpenSSL's first
		 * EVP_MAC_fetch (at the process's first connection) crashes
		 * inside libcrypto when one of its allocations fails */
		p[b] = start_faulted(b, spec, "replication: joining primary");
		if (tu_wait_pair(&cfg, 0, 20) != pr) {
			ck_assert_msg(waitpid(p[b], &ws, WNOHANG) == p[b], "%s: the backup neither "
				      "joined nor ended (log %s)", spec, rlog(b));
			ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 1, "%s: the backup ended "
				      "with %s %d (log %s)", spec, WIFSIGNALED(ws) ? "signal" : "exit",
				      WIFSIGNALED(ws) ? WTERMSIG(ws) : WEXITSTATUS(ws), rlog(b));
			ended++;
			p[b] = start_faulted(b, NULL, NULL);
			ck_assert_msg(tu_wait_pair(&cfg, 0, 20) == pr, "%s: restarted, the backup "
				      "never joined (log %s)", spec, rlog(b));
		}
		ck_assert_msg(waitpid(p[pr], &ws, WNOHANG) == 0, "%s: the primary ended", spec);
		assert_in_sync(m.clock, spec);
		if (!faults_made())
			break; /* past the join's last allocation */
		landed++;
	}
	ck_assert_msg(landed >= 10, "only %d of the joins' faults landed", landed);
	check_exact(c, &m, "after the joins");
	kill(p[pr], SIGKILL);
	tu_wait_child(p[pr]);
	check_exact(c, &m, "after the takeover");
	printf("test_backup_join_oom: %d joins with a failed allocation, %d of them ended by it\n",
	       landed, ended);
	ps_client_free(c);
	ck_assert_int_eq(tu_stop_server(p[b]), 0);
	unlink(cfg_path);
	tu_rmtree(dir);
}
END_TEST

/* The primary's batches out of memory: its Nth reallocation from "worker 0
 * connected" on failed (N 1..12: the batch's records, payloads and rows
 * grow by realloc), while the worker trains 3 clocks of rows and a dense
 * tensor. A primary that cannot gather a batch says so and steps down; no
 * process crashes, no line of either log says nothing, every call goes
 * through (tried again when refused), and the sums are exact. */
START_TEST(test_primary_batch_oom)
{
	static struct model m;
	char spec[32];
	pid_t p[2];
	int refused = 0, landed = 0, said = 0, n;

	for (n = 1; n <= 12; n++) {
		struct ps_client *c;
		int ws;

		snprintf(spec, sizeof(spec), "realloc:%d", n);
		start_model_pair(&m, p, spec, "worker 0 connected");
		c = connect_retry(&cfg, 0);
		for (int k = 0; k < 3; k++)
			train_clock_retry(c, &m, &refused, spec);
		for (int r = 0; r < 2; r++) {
			ck_assert_msg(waitpid(p[r], &ws, WNOHANG) == 0, "%s: process %d ended (%s %d; "
				      "log %s)", spec, r, WIFSIGNALED(ws) ? "signal" : "exit",
				      WIFSIGNALED(ws) ? WTERMSIG(ws) : WEXITSTATUS(ws), rlog(r));
			ck_assert_msg(!empty_log_lines(rlog(r)), "%s: a line of process %d's log "
				      "says nothing (%s)", spec, r, rlog(r));
		}
		said += tu_file_count(rlog(0), "out of memory gathering a batch") +
			tu_file_count(rlog(1), "out of memory gathering a batch") > 0;
		check_exact(c, &m, spec);
		ps_client_free(c);
		int made = faults_made();
		for (int r = 0; r < 2; r++) {
			kill(p[r], SIGKILL);
			tu_wait_child(p[r]);
		}
		unlink(cfg_path);
		tu_rmtree(dir);
		if (!made)
			break;
		landed++;
	}
	printf("test_primary_batch_oom: %d reallocations failed in turn, %d said the batch, "
	       "%d calls refused\n", landed, said, refused);
	ck_assert_msg(landed >= 4, "only %d faults landed", landed);
	ck_assert_msg(said >= 1, "no fault was a batch's");
}
END_TEST

/* A worker joining an elastic cluster (2 workers, 1 at the start) through
 * a replicated shard out of memory from its "worker 1 joining" line on:
 * each allocation after it failed in turn, the one that keeps the hold's
 * answer until the backup has the hold (ps__repl_reply_later) among them.
 * The join is refused with "out of memory" named, or done; no process
 * crashes; and rank 1 then joins the pair started without a fault. */
START_TEST(test_join_hold_oom)
{
	static struct model m;
	char spec[32], err[512];
	pid_t p[2];
	int n, refused = 0;

	pair_workers = "workers: 2\n  initial_workers: 1";
	for (n = 1; n <= 16; n++) {
		struct ps_client *c = NULL;
		int ws, rc;

		snprintf(spec, sizeof(spec), "alloc:%d", n);
		start_model_pair(&m, p, spec, "worker 1 joining");
		rc = ps_client_init(&c, &cfg, 1, err, sizeof(err));
		ck_assert_msg(rc == 0 || strstr(err, "out of memory"), "%s: the join failed with "
			      "%s: '%s' (logs in %s)", spec, ps_strerror(rc), err, dir);
		refused += rc != 0;
		if (c)
			ps_client_free(c);
		for (int r = 0; r < 2; r++)
			ck_assert_msg(waitpid(p[r], &ws, WNOHANG) == 0, "%s: process %d ended "
				      "(log %s)", spec, r, rlog(r));
		for (int r = 0; r < 2; r++) {
			kill(p[r], SIGKILL);
			tu_wait_child(p[r]);
		}
		unlink(cfg_path);
		tu_rmtree(dir);
		if (rc == 0)
			break; /* past the hold's answer */
	}
	printf("test_join_hold_oom: %d faults, %d joins refused\n", n, refused);
	ck_assert_msg(refused >= 1, "no fault made a join fail (%d tried)", n);
	ck_assert_msg(n <= 16, "16 faults and the join still fails");
	/* and without a fault: rank 1 joins */
	struct ps_client *c = NULL;
	start_model_pair(&m, p, NULL, NULL);
	ck_assert_msg(ps_client_init(&c, &cfg, 1, err, sizeof(err)) == 0, "%s", err);
	ps_client_free(c);
	for (int r = 0; r < 2; r++)
		ck_assert_int_eq(tu_stop_server(p[r]), 0);
	pair_workers = "workers: 1";
	unlink(cfg_path);
	tu_rmtree(dir);
}
END_TEST

/* The primary out of memory gathering a declaration for its backup:
 * every allocation (malloc, calloc, realloc) from the declaration's log
 * line on failed in turn. No process crashes, the primary says it and
 * steps down, and the worker's declaration is served (by whichever
 * process is the primary after), with rank 0's values; a declaration or
 * pull refused for want of memory (the record its ack waits in, the
 * reply) is sent again and taken. */
START_TEST(test_declare_oom)
{
	static float w[NA];
	const int64_t shape[] = { NA };
	struct ps_param prm = { "w", 1, shape, w };
	char spec[64];
	int n, said = 0, refused = 0;

	/* a takeover takes 2 s: a request unanswered in 15 s is lost */
	write_pair_cfg("", 15000);
	for (n = 1; n <= 40; n++) {
		struct ps_client *c;
		struct ps_tensor t = { .name = "w", .data = w, .count = NA };
		static float back[NA];
		pid_t p[2];
		int64_t q;
		int rc;

		snprintf(spec, sizeof(spec), "alloc:%d", n);
		/* both faulted: the primary is whichever the election makes */
		p[0] = start_faulted(0, spec, "rank 0 declared");
		p[1] = start_faulted(1, spec, "rank 0 declared");
		ck_assert_msg(tu_wait_pair(&cfg, 0, 30) >= 0, "the pair never formed (%s)", dir);
		for (int i = 0; i < NA; i++)
			w[i] = (float)(i % 11 - 5);
		c = connect_retry(&cfg, 0);
		rc = ps_client_declare(c, &prm, 1);
		if (rc && strstr(ps_client_error(c), "out of memory")) {
			/* its ack's record not made: refused, and the same again taken */
			refused++;
			rc = ps_client_declare(c, &prm, 1);
		}
		ck_assert_msg(rc == 0, "%s: the declaration: %s (logs in %s)", spec,
			      ps_client_error(c), dir);
		t.data = back;
		for (int k = 0; k < 3; k++) { /* a pull refused for want of memory: again */
			q = ps_client_pull(c, 0, &t, 1);
			rc = q > 0 ? ps_client_wait(c, q) : (int)q;
			if (!rc || !strstr(ps_client_error(c), "out of memory"))
				break;
			refused++;
		}
		ck_assert_msg(rc == 0, "%s: pull: %s", spec, ps_client_error(c));
		ck_assert_msg(memcmp(back, w, sizeof(w)) == 0, "%s: the declared values differ", spec);
		ps_client_free(c);
		for (int r = 0; r < 2; r++) {
			int ws = 0;
			ck_assert_msg(waitpid(p[r], &ws, WNOHANG) == 0, "%s: process %d ended (%s %d; "
				      "log %s)", spec, r, WIFSIGNALED(ws) ? "signal" : "exit",
				      WIFSIGNALED(ws) ? WTERMSIG(ws) : WEXITSTATUS(ws), rlog(r));
		}
		said += tu_file_count(rlog(0), "out of memory gathering a declaration") +
			tu_file_count(rlog(1), "out of memory gathering a declaration") > 0;
		int landed = faults_made() > 0;
		for (int r = 0; r < 2; r++)
			ck_assert_int_eq(tu_stop_server(p[r]), 0);
		unlink(rlog(0));
		unlink(rlog(1));
		if (!landed)
			break;
	}
	printf("test_declare_oom: %d allocations failed in turn, %d of them while gathering the "
	       "declaration, %d refused\n", n - 1, said, refused);
	ck_assert_msg(said > 0, "no failed allocation was the declaration's copy");
	unlink(cfg_path);
	tu_rmtree(dir);
}
END_TEST

int main(void)
{
	int rc;

	if ((rc = tu_fault_setup("it_fault_repl")))
		return rc;

	Suite *s = suite_create("fault_repl");
	TCase *tc = tcase_create("fault_repl");
	tcase_set_timeout(tc, 300);
	TU_ADD_LOOP(tc, test_snapshot_faults, 0, 4);
	TU_ADD(tc, test_backup_rows_oom);
	TU_ADD_LOOP(tc, test_primary_rows_oom, 0, 2);
	TU_ADD(tc, test_backup_join_oom);
	TU_ADD(tc, test_declare_oom);
	TU_ADD(tc, test_join_hold_oom);
	TU_ADD(tc, test_primary_batch_oom);
	suite_add_tcase(s, tc);
	tu_secret_setup(); /* the cluster secret and replication key, unless set */
	rc = tu_run_suite(s);
	tu_secret_cleanup();
	return rc;
}

/* it_checkpoint.c - shard checkpoints with real processes: SIGTERM writes
 * them, a restarted shard resumes with bit-identical weights, optimizer
 * state (momentum) and versions, and workers continue at the restored
 * clock; `ps-stat --checkpoint` writes on request; every_s writes
 * periodically; a damaged checkpoint or one from another configuration
 * stops the shard with the reason, and leaves the file alone. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <zlib.h>
#include "config.h"
#include "ps_time.h"
#include "ps_client.h"
#include "ps_err.h"
#include "shardmap.h"
#include "test_client.h"
#include "test_util.h"

#define N 3000

static char dir[64], path[64];
static struct ps_config cfg;
static pid_t srv[2];

/* What write_cfg writes besides its arguments; test_checkpoint_resume
 * changes each for a start that must refuse the checkpoint. */
#define CFG_OPTIM "name: momentum\n  lr: 0.5\n  momentum: 0.9"
static const char *cfg_optim = CFG_OPTIM, *cfg_mode = "sync";
static int cfg_workers = 1;

static void write_cfg(int p0, int p1, int n, int every_s)
{
	char yaml[1024], err[512];

	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [127.0.0.1:%d, 127.0.0.1:%d]\n  workers: %d\n"
		 "slice_bytes: 4096\n"
		 "consistency:\n  mode: %s\n"
		 "optimizer:\n  %s\n"
		 "model:\n  tensors:\n    - {name: a, shape: [%d], init: arange}\n"
		 "checkpoint:\n  dir: %s\n  every_s: %d\n  on_request: true\n  min_interval_s: 0\n"
		 "log:\n  level: warn\n", p0, p1, cfg_workers, cfg_mode, cfg_optim, n, dir,
		 every_s);
	if (!path[0])
		ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	FILE *f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs(yaml, f);
	fclose(f);
	ck_assert_msg(ps_config_load(&cfg, path, err, sizeof(err)) == 0, "%s", err);
}

/* Worker rank of cfg, connected: retries while the shards start (10 s). */
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
	ck_assert_msg(rc == 0, "connect: %s", err);
	return c;
}

/* clocks [from, to) of a known gradient; returns the weights after them */
static void train(struct ps_client *c, uint64_t from, uint64_t to, float *w)
{
	static float g[N];
	struct ps_tensor tg = { .name = "a", .data = g, .count = N };
	struct ps_tensor tw = { .name = "a", .data = w, .count = N };

	for (uint64_t k = from; k < to; k++) {
		for (int i = 0; i < N; i++)
			g[i] = (float)((int)((i + k) % 7) - 3) * 0.01f;
		int64_t p = ps_client_push(c, k, &tg, 1, PS_PUSH_END_CLOCK);
		ck_assert_msg(p > 0 && ps_client_wait(c, p) == 0, "push %" PRIu64 ": %s", k,
			      ps_client_error(c));
	}
	int64_t q = ps_client_pull(c, to, &tw, 1);
	ck_assert_msg(q > 0 && ps_client_wait(c, q) == 0, "pull: %s", ps_client_error(c));
}

static int run_cmd(const char *cmd, char *out, size_t n)
{
	FILE *p = popen(cmd, "r");
	size_t len = 0;
	int st;

	ck_assert_ptr_nonnull(p);
	while (len + 1 < n && !feof(p))
		len += fread(out + len, 1, n - 1 - len, p);
	out[len] = 0;
	st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* A refused start takes milliseconds; a shard still running after this
 * long has accepted what it should have refused. */
#define REFUSE_DEADLINE_MS 10000

/* Starts shard k, which must refuse to start: waits (at most
 * REFUSE_DEADLINE_MS, else the test fails saying so, with what the shard
 * wrote) for it to exit; its stdout and stderr go to out. Returns its exit
 * status. */
static int refused_start(int k, char *out, size_t n)
{
	char shard[16];
	size_t len = 0;
	int fds[2], open = 1;
	double deadline = ps_now_s() + REFUSE_DEADLINE_MS / 1000.0;

	snprintf(shard, sizeof(shard), "%d", k);
	ck_assert_int_eq(pipe(fds), 0);
	pid_t pid = tu_fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		dup2(fds[1], 1);
		dup2(fds[1], 2);
		close(fds[0]);
		close(fds[1]);
		execl("bin/ps-server", "ps-server", "--config", path, "--shard", shard, (char *)NULL);
		_exit(127);
	}
	close(fds[1]);
	while (open) { /* until the shard's end of the pipe closes: it exited */
		struct pollfd pfd = { fds[0], POLLIN, 0 };
		int left = (int)((deadline - ps_now_s()) * 1000);
		if (left <= 0 || poll(&pfd, 1, left) == 0)
			break;
		char b[512];
		ssize_t r = read(fds[0], b, sizeof(b));
		if (r < 0 && errno == EINTR)
			continue;
		open = r > 0;
		for (ssize_t i = 0; i < r && len + 1 < n; i++)
			out[len++] = b[i];
	}
	out[len] = 0;
	close(fds[0]);
	if (open) {
		kill(pid, SIGKILL);
		tu_wait_child(pid);
		ck_abort_msg("shard %d still running %d ms after its start: it should have refused "
			     "to start; it wrote: %s", k, REFUSE_DEADLINE_MS, out);
	}
	return tu_wait_child(pid);
}

/* A checkpoint folder that is missing stops the shard at start, not at the
 * SIGTERM that would have written the trained model: shard 0 of a config
 * naming dir/missing refuses to start and says why (out, n bytes); so
 * does one naming a file (dir/afile), "not a folder". */
static void expect_missing_dir_refused(int p0, int p1, char *out, size_t n)
{
	char have[sizeof(dir)], want[sizeof(dir) + 64];

	strcpy(have, dir);
	strcat(dir, "/missing");
	write_cfg(p0, p1, N, 0);
	ck_assert_int_ne(refused_start(0, out, n), 0);
	ck_assert_msg(strstr(out, "refusing to start: checkpoint.dir") && strstr(out, dir) &&
		      strstr(out, "does not exist"), "%s", out);
	strcpy(dir, have);
	strcat(dir, "/afile");
	FILE *f = fopen(dir, "w");
	ck_assert_ptr_nonnull(f);
	fclose(f);
	write_cfg(p0, p1, N, 0);
	ck_assert_int_ne(refused_start(0, out, n), 0);
	snprintf(want, sizeof(want), "refusing to start: checkpoint.dir %s: not a folder", dir);
	ck_assert_msg(strstr(out, want), "%s; '%s' expected", out, want);
	unlink(dir);
	strcpy(dir, have);
}

/* How many of process pid's open files lie in folder d. */
static int fds_in(pid_t pid, const char *d)
{
	char fdir[64], p[320], target[512];
	struct dirent *e;
	DIR *dd;
	int n = 0;

	snprintf(fdir, sizeof(fdir), "/proc/%d/fd", (int)pid);
	dd = opendir(fdir);
	ck_assert_ptr_nonnull(dd);
	while ((e = readdir(dd))) {
		ssize_t k;
		if (e->d_name[0] == '.')
			continue;
		snprintf(p, sizeof(p), "%s/%s", fdir, e->d_name);
		k = readlink(p, target, sizeof(target) - 1);
		if (k > 0) {
			target[k] = 0;
			n += strncmp(target, d, strlen(d)) == 0;
		}
	}
	closedir(dd);
	return n;
}

START_TEST(test_checkpoint_resume)
{
	static float w_before[N], w_after[N], w_ref[N], w_cont[N];
	static char out[8192];
	char ck0[200], ck1[200], cmd[512];
	int p0 = tu_free_port(), p1 = tu_free_port();
	struct stat st;

	strcpy(dir, "/tmp/ps-ckpt-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	path[0] = 0;
	expect_missing_dir_refused(p0, p1, out, sizeof(out));
	write_cfg(p0, p1, N, 0);
	snprintf(ck0, sizeof(ck0), "%s/shard-0.ckpt", dir);
	snprintf(ck1, sizeof(ck1), "%s/shard-1.ckpt", dir);

	/* reference: 8 clocks without a restart */
	srv[0] = tu_start_server(path, 0);
	srv[1] = tu_start_server(path, 1);
	struct ps_client *c = connect_retry(0);
	ck_assert_uint_eq(ps_client_clock(c), 0);
	train(c, 0, 8, w_ref);
	ps_client_free(c);
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	ck_assert_int_eq(tu_stop_server(srv[1]), 0);
	unlink(ck0);
	unlink(ck1);

	/* 5 clocks, SIGTERM (checkpoint), restart, 3 more: same weights, since
	 * the momentum buffers and versions came back too */
	srv[0] = tu_start_server(path, 0);
	srv[1] = tu_start_server(path, 1);
	c = connect_retry(0);
	train(c, 0, 5, w_before);
	ps_client_free(c);
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	ck_assert_int_eq(tu_stop_server(srv[1]), 0);
	ck_assert_int_eq(stat(ck0, &st), 0);
	ck_assert_int_gt(st.st_size, N / 2 * 4);
	ck_assert_int_eq(stat(ck1, &st), 0);
	snprintf(cmd, sizeof(cmd), "ls %s | grep -c tmp", dir);
	ck_assert_int_eq(run_cmd(cmd, out, sizeof(out)), 1); /* grep found no temp file */

	srv[0] = tu_start_server(path, 0);
	srv[1] = tu_start_server(path, 1);
	c = connect_retry(0);
	ck_assert_uint_eq(ps_client_clock(c), 5);   /* workers continue at clock 5 */
	/* the checkpoints were read and closed: no file of the folder stays open */
	for (int k = 0; k < 2; k++)
		ck_assert_msg(fds_in(srv[k], dir) == 0, "shard %d keeps %d file(s) of %s open", k,
			      fds_in(srv[k], dir), dir);
	/* nor does writing one (the folder, opened to sync the rename) */
	struct ps_shard_stats cs;
	ck_assert_int_eq(ps_client_checkpoint(c, 0, 1, &cs), 0);
	ck_assert_msg(fds_in(srv[0], dir) == 0, "after a checkpoint shard 0 keeps %d file(s) of "
		      "%s open", fds_in(srv[0], dir), dir);
	struct ps_tensor tw = { .name = "a", .data = w_after, .count = N };
	int64_t q = ps_client_pull(c, 5, &tw, 1);
	ck_assert_int_eq(ps_client_wait(c, q), 0);
	ck_assert_msg(memcmp(w_after, w_before, sizeof(w_before)) == 0, "weights differ after restart");
	train(c, 5, 8, w_cont);
	ck_assert_msg(memcmp(w_cont, w_ref, sizeof(w_ref)) == 0,
		      "training across a restart differs from training without one");

	/* on request */
	ck_assert_int_eq(stat(ck0, &st), 0);
	time_t before = st.st_mtime;
	unlink(ck0);
	snprintf(cmd, sizeof(cmd), "bin/ps-stat --config %s --checkpoint", path);
	ck_assert_int_eq(run_cmd(cmd, out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "shard 0: checkpoint written: ") && strstr(out, ck0) &&
		      strstr(out, "shard 1: checkpoint written: "), "%s", out);
	ck_assert_int_eq(stat(ck0, &st), 0);
	ck_assert(st.st_mtime >= before);
	ps_client_free(c);
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	ck_assert_int_eq(tu_stop_server(srv[1]), 0);

	/* damaged: one flipped byte in the middle; the shard refuses, the
	 * file stays for inspection */
	int fd = open(ck1, O_RDWR);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fstat(fd, &st), 0);
	uint8_t byte;
	ck_assert_int_eq(pread(fd, &byte, 1, st.st_size / 2), 1);
	byte ^= 0x10;
	ck_assert_int_eq(pwrite(fd, &byte, 1, st.st_size / 2), 1);
	close(fd);
	ck_assert_int_ne(refused_start(1, out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "checksum mismatch") && strstr(out, ck1), "%s", out);
	ck_assert_int_eq(stat(ck1, &st), 0);
	/* truncated */
	ck_assert_int_eq(truncate(ck1, 20), 0);
	ck_assert_int_ne(refused_start(1, out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "too short"), "%s", out);
	/* shard 0's file where shard 1 looks for its own */
	snprintf(cmd, sizeof(cmd), "cp %s %s", ck0, ck1);
	ck_assert_int_eq(run_cmd(cmd, out, sizeof(out)), 0);
	ck_assert_int_ne(refused_start(1, out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, ck1) && strstr(out, "belongs to shard 0, this is shard 1"), "%s",
		      out);
	/* its first bytes not a checkpoint's */
	fd = open(ck1, O_WRONLY);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pwrite(fd, "PSCKPTX", 7, 0), 7);
	close(fd);
	ck_assert_int_ne(refused_start(1, out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, ck1) && strstr(out, "not a ps-server checkpoint (bad magic)"),
		      "%s", out);
	unlink(ck1);
	/* the config changed in what the shard map does not cover: shard 0's
	 * checkpoint (momentum, 1 worker, sync) refused, naming the file and
	 * both sides; its bytes left as they were */
	ck_assert_int_eq(stat(ck0, &st), 0);
	off_t ck0_size = st.st_size;
	cfg_optim = "name: adam\n  lr: 0.01";
	write_cfg(p0, p1, N, 0);
	ck_assert_int_ne(refused_start(0, out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, ck0) && strstr(out, "made with optimizer momentum, the config "
		      "says adam"), "%s", out);
	cfg_optim = CFG_OPTIM;
	cfg_workers = 3;
	write_cfg(p0, p1, N, 0);
	ck_assert_int_ne(refused_start(0, out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, ck0) && strstr(out, "made for 1 workers, the config says 3"),
		      "%s", out);
	cfg_workers = 1;
	cfg_mode = "async";
	write_cfg(p0, p1, N, 0);
	ck_assert_int_ne(refused_start(0, out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, ck0) && strstr(out, "made in sync mode, the config says async"),
		      "%s", out);
	cfg_mode = "sync";
	ck_assert_int_eq(stat(ck0, &st), 0);
	ck_assert_int_eq(st.st_size, ck0_size);

	/* another configuration: a different tensor shape */
	write_cfg(p0, p1, N + 1, 0);
	ck_assert_int_ne(refused_start(0, out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "made with another configuration: shard map"), "%s", out);

	/* every_s: written without a signal */
	write_cfg(p0, p1, N + 1, 1);
	unlink(ck0);
	srv[0] = tu_start_server(path, 0);
	for (int i = 0; i < 40 && stat(ck0, &st); i++)
		tu_sleep_ms(100);
	ck_assert_int_eq(stat(ck0, &st), 0);
	kill(srv[0], SIGKILL);
	tu_wait_child(srv[0]);

	ck_assert_int_eq(tu_rmtree(dir), 0);
	unlink(path);
}
END_TEST

/* Removes the folder and config. */
static void stop_files(void)
{
	ck_assert_int_eq(tu_rmtree(dir), 0);
	unlink(path);
	path[0] = 0;
}

/* Stops both shards (each must exit 0) and removes the folder and config. */
static void stop_and_clean(void)
{
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	ck_assert_int_eq(tu_stop_server(srv[1]), 0);
	stop_files();
}

/* Integer gradient of worker r at clock k for element i (exact in float). */
static float kgrad(int r, uint64_t k, int i)
{
	return (float)((r + 1) * ((int)((i + k) % 5) - 2));
}

/* kill -9 of a shard mid-training (2 shards, 2 workers, sync, SGD lr 1),
 * restarted from the checkpoint it wrote at clock 5, three clocks later:
 * the workers reconnect and training completes; on the restarted shard's
 * slices exactly the updates of clocks 5..7 (acknowledged after its
 * checkpoint) are missing, on the other shard's none
 * (docs/reliability.md). */
START_TEST(test_shard_killed_and_restarted)
{
	static float g[2][N], w[N];
	char yaml[1024], err[512];
	struct ps_client *c[2];
	struct ps_shardmap map;

	strcpy(dir, "/tmp/ps-ckpt-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(yaml, sizeof(yaml),
		 "%scluster:\n  servers: [%s:%d, %s:%d]\n  workers: 2\n"
		 "slice_bytes: 4096\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n"
		 "model:\n  tensors:\n    - {name: a, shape: [%d], init: arange}\n"
		 "checkpoint:\n  dir: %s\n  on_request: true\n  min_interval_s: 0\n"
		 "limits:\n  reconnect_timeout_ms: 20000\n"
		 "log:\n  level: warn\n", tu_transport_yaml(), tu_host(), tu_free_port(), tu_host(),
		 tu_free_port(), N, dir);
	ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	ck_assert_msg(ps_config_load(&cfg, path, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(ps_shardmap_init(&map, &cfg), 0);
	srv[0] = tu_start_server(path, 0);
	srv[1] = tu_start_server(path, 1);
	for (int r = 0; r < 2; r++)
		c[r] = connect_retry(r);
	struct ps_tensor tw = { .name = "a", .data = w, .count = N };
	for (uint64_t k = 0; k < 12; k++) {
		if (k == 5) { /* shard 0 checkpoints at clock 5 */
			struct ps_shard_stats st;
			ck_assert_int_eq(ps_client_checkpoint(c[0], 0, 1, &st), 0);
			ck_assert_int_eq(st.checkpoint_status, 0);
		}
		if (k == 8) { /* and dies three clocks later; back 0.3 s after */
			kill(srv[0], SIGKILL);
			ck_assert_int_eq(tu_wait_child(srv[0]), 128 + SIGKILL);
			tu_sleep_ms(300);
			srv[0] = tu_start_server(path, 0);
		}
		int64_t id[2];
		double t0 = ps_now_s();
		for (int r = 0; r < 2; r++) {
			struct ps_tensor tg = { .name = "a", .data = g[r], .count = N };
			for (int i = 0; i < N; i++)
				g[r][i] = kgrad(r, k, i);
			id[r] = ps_client_push(c[r], k, &tg, 1, PS_PUSH_END_CLOCK);
			ck_assert_int_gt(id[r], 0);
		}
		for (int r = 0; r < 2; r++)
			ck_assert_msg(ps_client_wait(c[r], id[r]) == 0, "push %" PRIu64 ": %s", k,
				      ps_client_error(c[r]));
		for (int r = 0; r < 2; r++) {
			int64_t q = ps_client_pull(c[r], k + 1, &tw, 1);
			ck_assert_msg(q > 0 && ps_client_wait(c[r], q) == 0, "pull %" PRIu64 ": %s", k,
				      ps_client_error(c[r]));
		}
		if (k == 8)
			printf("measured: shard killed and restarted 0.3 s later: clock 8 done "
			       "%.0f ms after the restart\n", (ps_now_s() - t0) * 1e3);
	}
	/* which elements live on shard 0 */
	static uint8_t on0[N];
	for (uint32_t s = 0; s < map.nslices; s++)
		if (map.slices[s].shard == 0)
			memset(on0 + map.slices[s].offset, 1, (size_t)map.slices[s].count);
	int n0 = 0;
	for (int i = 0; i < N; i++) {
		double want = (double)(i % 1024);
		for (uint64_t k = 0; k < 12; k++)
			if (!(on0[i] && k >= 5 && k < 8))
				want -= kgrad(0, k, i) + kgrad(1, k, i);
		n0 += on0[i];
		ck_assert_msg((double)w[i] == want, "a[%d] (shard %d) = %g, want %g", i,
			      on0[i] ? 0 : 1, (double)w[i], want);
	}
	ck_assert_int_gt(n0, 0);
	ck_assert_int_lt(n0, N);
	for (int r = 0; r < 2; r++)
		ps_client_free(c[r]);
	ps_shardmap_free(&map);
	stop_and_clean();
}
END_TEST

/* The text of a file (malloc'ed), "" when missing. */
static char *file_text(const char *f)
{
	size_t len = 0;
	FILE *fp = fopen(f, "rb");
	char *b = malloc(1 << 20);

	ck_assert_ptr_nonnull(b);
	if (fp) {
		len = fread(b, 1, (1 << 20) - 1, fp);
		fclose(fp);
	}
	b[len] = 0;
	return b;
}

/* Async (SSP): the slowest-clock rule and the clock a connecting worker
 * continues at come from the workers' finished clocks (sync takes the
 * latter from the slice versions, which is why the resume test above
 * cannot tell whether they were restored). Both shards restarted from the
 * checkpoints written on SIGTERM after 5 clocks: a fresh client (a
 * restarted worker process, which brings no clock of its own) continues at
 * clock 5 and both shards report worker 0 at clock 5; the client that ran
 * before reconnects without either shard warning that updates it had
 * acknowledged are lost (it would if the shard had forgotten them); and
 * training goes on with exact weights. */
START_TEST(test_async_resume_clocks)
{
	static float g[N], w[N];
	char yaml[1024], err[512], log[2][300];
	struct ps_tensor tg = { .name = "a", .data = g, .count = N };
	struct ps_tensor tw = { .name = "a", .data = w, .count = N };
	struct ps_shard_stats st;
	int64_t id;

	strcpy(dir, "/tmp/ps-ckpt-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [127.0.0.1:%d, 127.0.0.1:%d]\n  workers: 1\n"
		 "consistency:\n  mode: async\n  staleness: 1\n"
		 "slice_bytes: 4096\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n"
		 "model:\n  tensors:\n    - {name: a, shape: [%d], init: arange}\n"
		 "checkpoint:\n  dir: %s\n  on_request: true\n  min_interval_s: 0\n"
		 "limits:\n  reconnect_timeout_ms: 20000\n"
		 "log:\n  level: warn\n", tu_free_port(), tu_free_port(), N, dir);
	ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	ck_assert_msg(ps_config_load(&cfg, path, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(cfg.consistency, PS_ASYNC);
	for (int k = 0; k < 2; k++)
		snprintf(log[k], sizeof(log[k]), "%s/shard-%d.log", dir, k);
	srv[0] = tu_start_server(path, 0);
	srv[1] = tu_start_server(path, 1);
	struct ps_client *old = connect_retry(0);
	for (uint64_t k = 0; k < 5; k++) {
		for (int i = 0; i < N; i++)
			g[i] = kgrad(0, k, i);
		id = ps_client_push(old, k, &tg, 1, PS_PUSH_END_CLOCK);
		ck_assert_msg(id > 0 && ps_client_wait(old, id) == 0, "push %" PRIu64 ": %s", k,
			      ps_client_error(old));
	}
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(ps_client_stats(old, k, &st), 0);
		ck_assert_uint_eq(st.worker_clock[0], 5);
	}
	/* SIGTERM: both write their checkpoints; then both come back */
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	ck_assert_int_eq(tu_stop_server(srv[1]), 0);
	for (int k = 0; k < 2; k++)
		srv[k] = tu_start_server_log(path, k, log[k]);

	/* the worker that ended clocks 0..4 reconnects (its pull resends),
	 * then stops (a second live process of rank 0 would be refused) */
	id = ps_client_pull(old, 0, &tw, 1);
	ck_assert_msg(id > 0 && ps_client_wait(old, id) == 0, "pull: %s", ps_client_error(old));
	ps_client_free(old);
	/* a fresh client starts at clock 5 (retried while the shards see the
	 * old one's connections close) */
	struct ps_client *c = NULL;
	for (int i = 0; i < 100; i++) {
		if (ps_client_init(&c, &cfg, 0, err, sizeof(err)) == 0)
			break;
		tu_sleep_ms(20);
	}
	ck_assert_msg(c != NULL, "%s", err);
	ck_assert_uint_eq(ps_client_clock(c), 5);
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(ps_client_stats(c, k, &st), 0);
		ck_assert_uint_eq(st.nworkers, 1);
		ck_assert_msg(st.worker_clock[0] == 5, "shard %d: worker 0 at clock %" PRIu64
			      " after the restart, 5 before", k, st.worker_clock[0]);
	}
	/* training goes on from clock 5 with the restored weights */
	for (uint64_t k = 5; k < 8; k++) {
		for (int i = 0; i < N; i++)
			g[i] = kgrad(0, k, i);
		id = ps_client_push(c, k, &tg, 1, PS_PUSH_END_CLOCK);
		ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "push %" PRIu64 ": %s", k,
			      ps_client_error(c));
	}
	id = ps_client_pull(c, 0, &tw, 1);
	ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "pull: %s", ps_client_error(c));
	for (int i = 0; i < N; i++) {
		double want = (double)(i % 1024);
		for (uint64_t k = 0; k < 8; k++)
			want -= kgrad(0, k, i);
		ck_assert_msg((double)w[i] == want, "a[%d] = %g, want %g", i, (double)w[i], want);
	}
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(ps_client_stats(c, k, &st), 0);
		ck_assert_uint_eq(st.worker_clock[0], 8);
	}
	ps_client_free(c);
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	ck_assert_int_eq(tu_stop_server(srv[1]), 0);
	/* (stopped: the logs are complete) */
	for (int k = 0; k < 2; k++) {
		char *text = file_text(log[k]);
		ck_assert_msg(!strstr(text, "are lost"), "shard %d warned of lost updates:\n%s", k,
			      text);
		free(text);
	}
	stop_files();
}
END_TEST

static uint64_t shard0_checksum(struct ps_client *c)
{
	struct ps_shard_stats st;

	ck_assert_int_eq(ps_client_stats(c, 0, &st), 0);
	return st.param_checksum;
}

struct asker {
	struct ps_client *c;
	struct ps_shard_stats st;
	int rc;
	int busy_retry; /* asked again while a checkpoint before it is written */
};

static void *ask_checkpoint(void *p)
{
	struct asker *a = p;
	double deadline = ps_now_s() + 30 * tu_time_scale();

	for (;;) {
		a->rc = ps_client_checkpoint(a->c, 0, 1, &a->st);
		if (!a->busy_retry || a->rc || a->st.checkpoint_status != PS_ESTATE ||
		    !strstr(a->st.checkpoint_error, "a checkpoint is being written now") ||
		    ps_now_s() >= deadline)
			return NULL;
		tu_sleep_ms(5);
	}
}

/* A shard killed while it writes its checkpoint (half way through the
 * data, after the fsync, after the rename): the file on disk is the old
 * checkpoint or the new one, whole, never a mix; the restarted shard loads
 * it (the old weights, or those of the moment it died) and the worker,
 * which reconnects and resends its checkpoint request, goes on. */
START_TEST(test_crash_while_checkpointing)
{
	static float w[N];
	static const char *const steps[] = { "write", "fsync", "rename" };
	char ck0[200];
	uint64_t clock = 2;

	strcpy(dir, "/tmp/ps-ckpt-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	path[0] = 0;
	write_cfg(tu_free_port(), tu_free_port(), N, 0);
	snprintf(ck0, sizeof(ck0), "%s/shard-0.ckpt", dir);
	srv[0] = tu_start_server(path, 0);
	srv[1] = tu_start_server(path, 1);
	struct ps_client *c = connect_retry(0);
	train(c, 0, clock, w);
	struct ps_shard_stats st;
	ck_assert_int_eq(ps_client_checkpoint(c, 0, 1, &st), 0);
	ck_assert_int_eq(st.checkpoint_status, 0);
	uint64_t sum_ck = shard0_checksum(c);
	for (int i = 0; i < 3; i++) {
		/* shard 0 again with the fault armed; it loads the checkpoint,
		 * which holds everything so far, and the worker reconnects */
		kill(srv[0], SIGKILL);
		tu_wait_child(srv[0]);
		setenv("PS_FAULT_CHECKPOINT", steps[i], 1);
		srv[0] = tu_start_server(path, 0);
		unsetenv("PS_FAULT_CHECKPOINT");
		train(c, clock, clock + 2, w);
		clock += 2;
		uint64_t sum_now = shard0_checksum(c);
		ck_assert_uint_ne(sum_now, sum_ck);
		size_t old_len = 0, len = 0;
		uint8_t *old = tu_slurp(ck0, &old_len), *now;
		ck_assert_ptr_nonnull(old);

		struct asker a = { .c = c };
		pthread_t th;
		ck_assert_int_eq(pthread_create(&th, NULL, ask_checkpoint, &a), 0);
		ck_assert_int_eq(tu_wait_child(srv[0]), 128 + SIGKILL); /* it died at the step */
		now = tu_slurp(ck0, &len);
		ck_assert_ptr_nonnull(now);
		if (i < 2)
			ck_assert_msg(len == old_len && memcmp(now, old, len) == 0,
				      "%s: the checkpoint changed before its rename", steps[i]);
		else
			ck_assert_msg(len != old_len || memcmp(now, old, len) != 0,
				      "rename: the new checkpoint is not in place");
		free(old);
		free(now);
		srv[0] = tu_start_server(path, 0);
		pthread_join(th, NULL);
		ck_assert_msg(a.rc == 0, "checkpoint request after the restart: %s",
			      ps_client_error(c));
		ck_assert_int_eq(a.st.checkpoint_status, 0);
		/* the old state, or the state of the moment it died: never a mix */
		uint64_t sum_loaded = shard0_checksum(c);
		ck_assert_msg(sum_loaded == (i < 2 ? sum_ck : sum_now),
			      "%s: shard 0 came back with checksum %016" PRIx64 " (old %016" PRIx64
			      ", at the crash %016" PRIx64 ")", steps[i], sum_loaded, sum_ck, sum_now);
		train(c, clock, clock + 1, w); /* and training goes on */
		clock++;
		sum_ck = shard0_checksum(c);
		ck_assert_int_eq(ps_client_checkpoint(c, 0, 1, &st), 0);
	}
	ps_client_free(c);
	stop_and_clean();
}
END_TEST

/* Checkpoints on request (docs/security.md, docs/reliability.md): refused
 * unless checkpoint.on_request is on, at most one per
 * checkpoint.min_interval_s, and written from a copy by a helper thread:
 * while a 200 MB checkpoint is written and fsynced, pulls go on, the
 * longest of them waiting far less than the write takes (it used to wait
 * for all of it). */
struct puller {
	struct ps_client *c;
	volatile int stop;
	int n;
	double max_ms;
};

static void *pull_loop(void *p)
{
	struct puller *pl = p;
	static float w[16];
	struct ps_tensor t = { .name = "small", .data = w, .count = 16 };

	while (!pl->stop) {
		double t0 = ps_now_s();
		int64_t q = ps_client_pull(pl->c, 0, &t, 1);
		if (q < 0 || ps_client_wait(pl->c, q))
			break;
		double ms = (ps_now_s() - t0) * 1e3;
		pl->max_ms = ms > pl->max_ms ? ms : pl->max_ms;
		pl->n++;
	}
	return NULL;
}

static void big_cfg(int port, const char *extra)
{
	char yaml[1024], err[512];

	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [127.0.0.1:%d]\n  workers: 1\n"
		 "consistency:\n  mode: async\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n"
		 "model:\n  tensors:\n    - {name: big, shape: [50000000], init: arange}\n"
		 "    - {name: small, shape: [16], init: arange}\n"
		 "checkpoint:\n  dir: %s\n%s"
		 "log:\n  level: warn\n", port, dir, extra);
	if (!path[0])
		ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	FILE *f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs(yaml, f);
	fclose(f);
	ck_assert_msg(ps_config_load(&cfg, path, err, sizeof(err)) == 0, "%s", err);
}

/* Rewrites the CRC at the end of a checkpoint after a test edited it, so
 * the edit reaches the checks behind the checksum. */
static void fix_crc(const char *f)
{
	size_t len;
	uint8_t *b = tu_slurp(f, &len);
	uint32_t crc = (uint32_t)crc32(crc32(0L, Z_NULL, 0), b, (uInt)(len - 4));

	memcpy(b + len - 4, &crc, 4);
	FILE *o = fopen(f, "wb");
	ck_assert_ptr_nonnull(o);
	ck_assert_uint_eq(fwrite(b, 1, len, o), len);
	fclose(o);
	free(b);
}

/* Puts v at byte offset off of f (off < 0: from the end) and fixes the CRC. */
static void poke_u64(const char *f, long off, uint64_t v)
{
	int fd = open(f, O_RDWR);
	struct stat st;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fstat(fd, &st), 0);
	ck_assert_int_eq(pwrite(fd, &v, 8, off >= 0 ? off : st.st_size + off), 8);
	close(fd);
	fix_crc(f);
}

/* Puts v at byte offset off of f and fixes the CRC. */
static void poke_u32(const char *f, long off, uint32_t v)
{
	int fd = open(f, O_RDWR);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pwrite(fd, &v, 4, off), 4);
	close(fd);
	fix_crc(f);
}

/* The 4 bytes at offset off of f. */
static uint32_t peek_u32(const char *f, long off)
{
	uint32_t v = 0;
	int fd = open(f, O_RDONLY);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, &v, 4, off), 4);
	close(fd);
	return v;
}

static void copy_file(const char *from, const char *to)
{
	size_t len;
	uint8_t *b = tu_slurp(from, &len);
	FILE *o = fopen(to, "wb");

	ck_assert_ptr_nonnull(o);
	ck_assert_uint_eq(fwrite(b, 1, len, o), len);
	fclose(o);
	free(b);
}

/* Checkpoint files (docs/security.md): created mode 0600 under a fresh
 * name, so symlinks planted in the folder, at the checkpoint's name and at
 * the name a temporary file used to have, redirect nothing; on load the
 * size is checked against the configuration before anything is read,
 * versions, step counts and finished clocks must be in range, and the
 * byte order, the number of slices and each slot's slice id and count the
 * shard's own (each edit
 * below carries a valid checksum, so only these checks can refuse it); a
 * FIFO or a symbolic link at the checkpoint's name is refused at start. */
START_TEST(test_checkpoint_files)
{
	static float w[N], w2[N];
	static char out[8192];
	char ck0[200], saved[220], victim[220], tmpname[260];
	int p0 = tu_free_port(), p1 = tu_free_port();
	struct stat st;

	strcpy(dir, "/tmp/ps-ckpt-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	path[0] = 0;
	expect_missing_dir_refused(p0, p1, out, sizeof(out));
	write_cfg(p0, p1, N, 0);
	snprintf(ck0, sizeof(ck0), "%s/shard-0.ckpt", dir);
	snprintf(saved, sizeof(saved), "%s/saved", dir);
	snprintf(victim, sizeof(victim), "%s/victim", dir);
	srv[0] = tu_start_server(path, 0);
	srv[1] = tu_start_server(path, 1);
	struct ps_client *c = connect_retry(0);
	train(c, 0, 3, w);
	ps_client_free(c);
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	ck_assert_int_eq(tu_stop_server(srv[1]), 0);
	ck_assert_int_eq(stat(ck0, &st), 0);
	ck_assert_msg((st.st_mode & 0777) == 0600, "checkpoint mode %04o", st.st_mode & 0777);
	copy_file(ck0, saved);

	/* in range: a slot's version (header 48 bytes, then slice, reserved,
	 * count, version), a worker's finished clock (the 8 bytes before the
	 * CRC), and in sync mode a version no worker finished */
	poke_u64(ck0, 48 + 16, UINT64_C(1) << 60);
	ck_assert_int_ne(refused_start(0, out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "more than any run makes") && strstr(out, ck0), "%s", out);
	copy_file(saved, ck0);
	/* ... and its step count (after the version) */
	poke_u64(ck0, 48 + 24, UINT64_C(1) << 60);
	ck_assert_int_ne(refused_start(0, out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "1152921504606846976 steps, more than any run makes"), "%s",
		      out);
	copy_file(saved, ck0);
	/* the slot's slice id and its count must be the shard's own */
	uint32_t id = peek_u32(ck0, 48), nslots = peek_u32(ck0, 40);
	char want[200];
	poke_u32(ck0, 48, id + 1);
	ck_assert_int_ne(refused_start(0, out, sizeof(out)), 0);
	snprintf(want, sizeof(want), "slice 0 is id %u of ", id + 1);
	ck_assert_msg(strstr(out, want) && strstr(out, "expected id"), "%s", out);
	copy_file(saved, ck0);
	poke_u64(ck0, 48 + 8, 1);
	ck_assert_int_ne(refused_start(0, out, sizeof(out)), 0);
	snprintf(want, sizeof(want), "slice 0 is id %u of 1 values, expected id %u", id, id);
	ck_assert_msg(strstr(out, want), "%s", out);
	copy_file(saved, ck0);
	/* the header: the other byte order, and another number of slices */
	poke_u32(ck0, 8, 0x04030201u);
	ck_assert_int_ne(refused_start(0, out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "written on a machine of the other byte order") &&
		      strstr(out, ck0), "%s", out);
	copy_file(saved, ck0);
	poke_u32(ck0, 40, nslots + 1);
	ck_assert_int_ne(refused_start(0, out, sizeof(out)), 0);
	snprintf(want, sizeof(want), "holds %u slices, this shard owns %u", nslots + 1, nslots);
	ck_assert_msg(strstr(out, want), "%s", out);
	copy_file(saved, ck0);
	poke_u64(ck0, -12, UINT64_C(1) << 60);
	ck_assert_int_ne(refused_start(0, out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "worker 0 finished clock"), "%s", out);
	copy_file(saved, ck0);
	poke_u64(ck0, -12, 1);
	ck_assert_int_ne(refused_start(0, out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "no worker finished more than 1 clocks"), "%s", out);
	/* one clock past the finished ones (2, the versions 3): what a
	 * checkpoint written while the workers train can hold (a clock
	 * applies before the push that ends it); taken */
	copy_file(saved, ck0);
	poke_u64(ck0, -12, 2);
	srv[0] = tu_start_server(path, 0);
	ck_assert_msg(tu_wait_listen(p0), "shard 0 did not start from finished clocks 2");
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	/* the size first: longer than this configuration's checkpoint */
	copy_file(saved, ck0);
	FILE *f = fopen(ck0, "ab");
	ck_assert_ptr_nonnull(f);
	fputs("trailing bytes", f);
	fclose(f);
	ck_assert_int_ne(refused_start(0, out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "a checkpoint of this shard has"), "%s", out);

	/* planted symlinks: at the checkpoint's name, and at the temporary
	 * name older versions used (<file>.tmp.<pid>) */
	copy_file(saved, ck0);
	f = fopen(victim, "w");
	ck_assert_ptr_nonnull(f);
	fputs("precious\n", f);
	fclose(f);
	srv[0] = tu_start_server(path, 0);
	srv[1] = tu_start_server(path, 1);
	c = connect_retry(0);
	ck_assert_uint_eq(ps_client_clock(c), 3);
	unlink(ck0);
	ck_assert_int_eq(symlink(victim, ck0), 0);
	snprintf(tmpname, sizeof(tmpname), "%s.tmp.%ld", ck0, (long)srv[0]);
	ck_assert_int_eq(symlink(victim, tmpname), 0);
	struct ps_shard_stats sst;
	ck_assert_int_eq(ps_client_checkpoint(c, 0, 1, &sst), 0);
	ck_assert_msg(sst.checkpoint_status == 0, "%s", sst.checkpoint_error);
	char *text = file_text(victim);
	ck_assert_str_eq(text, "precious\n");
	free(text);
	ck_assert_int_eq(lstat(ck0, &st), 0);
	ck_assert_msg(S_ISREG(st.st_mode) && (st.st_mode & 0777) == 0600,
		      "the checkpoint is not a regular file of mode 0600 (mode %o)", st.st_mode);
	ps_client_free(c);
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	ck_assert_int_eq(tu_stop_server(srv[1]), 0);
	/* and it loads: the same weights */
	srv[0] = tu_start_server(path, 0);
	srv[1] = tu_start_server(path, 1);
	c = connect_retry(0);
	struct ps_tensor tw = { .name = "a", .data = w2, .count = N };
	int64_t q = ps_client_pull(c, 3, &tw, 1);
	ck_assert_int_eq(ps_client_wait(c, q), 0);
	ck_assert(memcmp(w, w2, sizeof(w)) == 0);
	ps_client_free(c);
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	ck_assert_int_eq(tu_stop_server(srv[1]), 0);

	/* loading reads only a regular file: a FIFO at the checkpoint's name
	 * is refused at once (opening it used to wait forever), a symbolic
	 * link is not followed (it used to load the file it names: a roll
	 * back to another checkpoint) */
	copy_file(ck0, saved);
	unlink(ck0);
	ck_assert_int_eq(mkfifo(ck0, 0600), 0);
	ck_assert_int_ne(refused_start(0, out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "not a regular file (a FIFO)") && strstr(out, ck0), "%s", out);
	unlink(ck0);
	ck_assert_int_eq(symlink(saved, ck0), 0);
	ck_assert_int_ne(refused_start(0, out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "a symbolic link") && strstr(out, ck0), "%s", out);
	ck_assert_int_eq(lstat(ck0, &st), 0);
	ck_assert(S_ISLNK(st.st_mode)); /* refused, left alone */
	stop_files();
}
END_TEST

START_TEST(test_checkpoint_on_request)
{
	struct ps_shard_stats st;
	int port = tu_free_port();

	strcpy(dir, "/tmp/ps-ckpt-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	path[0] = 0;
	/* off by default: the request is answered, with the reason */
	big_cfg(port, "");
	srv[0] = tu_start_server(path, 0);
	struct ps_client *c = tu_connect_while_up(&cfg, 0, srv[0], 180);
	ck_assert_int_eq(ps_client_checkpoint(c, 0, 1, &st), 0);
	ck_assert_int_ne(st.checkpoint_status, 0);
	ck_assert_msg(strstr(st.checkpoint_error, "checkpoint.on_request: true"), "%s",
		      st.checkpoint_error);
	ps_client_free(c);
	kill(srv[0], SIGKILL);
	tu_wait_child(srv[0]);

	big_cfg(port, "  on_request: true\n  min_interval_s: 60\n");
	setenv("PS_TEST_LOG", "info", 1); /* its log line is checked below */
	tu_capture_begin();
	srv[0] = tu_start_server(path, 0);
	c = tu_connect_while_up(&cfg, 0, srv[0], 180);
	struct puller pl = { .c = c };
	pthread_t th;
	ck_assert_int_eq(pthread_create(&th, NULL, pull_loop, &pl), 0);
	tu_sleep_ms(200);
	int before = pl.n;
	double max_before = pl.max_ms;
	pl.max_ms = 0;
	ck_assert_int_eq(ps_client_checkpoint(c, 0, 1, &st), 0);
	int during = pl.n - before;
	double max_during = pl.max_ms;
	pl.stop = 1;
	pthread_join(th, NULL);
	ck_assert_msg(st.checkpoint_status == 0, "%s", st.checkpoint_error);
	ck_assert_uint_gt(st.checkpoint_bytes, 200000000);
	uint64_t bytes_done = st.checkpoint_bytes;
	double secs_done = st.checkpoint_seconds;
	ck_assert_msg(secs_done > 0 && secs_done < 60 * tu_time_scale(), "%.3f s", secs_done);
	printf("measured: a %.0f MiB checkpoint took %.2f s; %d pulls meanwhile, the longest "
	       "%.0f ms (%.1f ms before it)\n", (double)st.checkpoint_bytes / 1048576.0,
	       st.checkpoint_seconds, during, max_during, max_before);
	ck_assert_int_ge(before, 1);
	ck_assert_msg(during >= 3, "%d pulls during a %.2f s checkpoint", during,
		      st.checkpoint_seconds);
	/* at most one per min_interval_s */
	ck_assert_int_eq(ps_client_checkpoint(c, 0, 1, &st), 0);
	ck_assert_int_ne(st.checkpoint_status, 0);
	ck_assert_msg(strstr(st.checkpoint_error, "checkpoint.min_interval_s"), "%s",
		      st.checkpoint_error);
	ps_client_free(c);
	/* the shard's log line says the same size and time as the reply */
	tu_sleep_ms(100);
	char *log = tu_capture_end(), *l = strstr(log, "checkpoint (on request): ");
	double mib = -1, secs = -1;
	ck_assert_msg(l && sscanf(strchr(l, ',') + 1, " %lf MiB in %lf s", &mib, &secs) == 2,
		      "%s", log);
	ck_assert_msg(fabs(mib - (double)bytes_done / 1048576.0) < 0.1 &&
		      fabs(secs - secs_done) < 0.05, "logged %.1f MiB in %.3f s, the reply said "
		      "%" PRIu64 " bytes in %.3f s", mib, secs, bytes_done, secs_done);
	/* the shard's only pause was the copy: no pull waited much longer
	 * than it, and the whole checkpoint took longer than the copy (before,
	 * a pull waited for the whole write and fsync) */
	double paused = -1;
	const char *pp = strstr(l, "(the shard paused ");
	ck_assert_msg(pp && sscanf(pp, "(the shard paused %lf s", &paused) == 1, "%s", l);
	printf("measured: the copy paused the shard %.0f ms of the %.0f ms checkpoint\n",
	       paused * 1e3, secs_done * 1e3);
	/* the bound leaves half of the write's own time as slack for a busy
	 * machine (a pull queued behind other processes); a pull that waited
	 * for the write and fsync, as before, waits nearly all of it */
	double bound = paused * 1e3 + 150 + 0.5 * (secs_done - paused) * 1e3;
	ck_assert_msg(max_during <= bound * tu_time_scale(), "a pull waited %.0f ms, the copy "
		      "took %.0f ms of the %.0f ms checkpoint (bound %.0f ms)", max_during,
		      paused * 1e3, secs_done * 1e3, bound);
	ck_assert_msg(paused < secs_done, "copy %.3f s, checkpoint %.3f s", paused, secs_done);
	free(log);
	/* SIGTERM still writes the last checkpoint, and it loads */
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	srv[0] = tu_start_server(path, 0);
	c = tu_connect_while_up(&cfg, 0, srv[0], 180);
	ps_client_free(c);
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	stop_files();
}
END_TEST

/* 1 when folder d holds a checkpoint being written (a *.tmp.* file). */
static int tmp_file_in(const char *d)
{
	DIR *dd = opendir(d);
	struct dirent *e;
	int found = 0;

	ck_assert_ptr_nonnull(dd);
	while ((e = readdir(dd)))
		found |= strstr(e->d_name, ".tmp.") != NULL;
	closedir(dd);
	return found;
}

/* Checkpoints asked of a shard on request (the 191 MiB model of big_cfg):
 * one asked by a monitor that leaves before it is written (its request
 * timed out) is written, and the shard forgets the monitor and goes on
 * (it would answer a freed connection); one asked while another is being
 * written is refused at once with PS_ESTATE, "a checkpoint is being
 * written now" (a write can end before the second request arrives on a
 * fast disk: then it is tried again, five times at most). */
START_TEST(test_checkpoint_requests_overlap)
{
	static struct ps_config quick;
	struct ps_client *c, *mon = NULL, *left = NULL;
	struct ps_shard_stats st, ms;
	char err[512];
	int port = tu_free_port(), rc, refused = 0;

	strcpy(dir, "/tmp/ps-ckpt-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	path[0] = 0;
	big_cfg(port, "  on_request: true\n  min_interval_s: 0\n");
	srv[0] = tu_start_server(path, 0);
	c = tu_connect_while_up(&cfg, 0, srv[0], 180);
	memcpy(&quick, &cfg, sizeof(quick));
	quick.limits.request_timeout_ms = 50;
	ck_assert_msg(ps_client_init(&left, &quick, -1, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(ps_client_init(&mon, &cfg, -1, err, sizeof(err)) == 0, "%s", err);

	double asked = ps_now_s();
	ck_assert_int_eq(ps_client_checkpoint(left, 0, 1, &st), PS_ETIMEDOUT);
	ps_client_free(left);
	/* done when the shard's last good checkpoint is younger than the
	 * request (it says so once the job is over, not at the rename) */
	double deadline = ps_now_s() + 30 * tu_time_scale();
	while ((rc = ps_client_stats(c, 0, &st)) == 0 && ps_now_s() < deadline &&
	       st.checkpoint_age_s >= ps_now_s() - asked)
		tu_sleep_ms(10);
	ck_assert_msg(rc == 0 && waitpid(srv[0], NULL, WNOHANG) == 0, "the shard died after "
		      "the monitor that asked for a checkpoint left: %s", ps_client_error(c));
	ck_assert_msg(st.checkpoint_age_s < ps_now_s() - asked && st.checkpoint_failures == 0,
		      "the checkpoint of the monitor that left was not written within 30 s");

	for (int i = 0; i < 5 && !refused; i++) {
		/* the first asked again while the checkpoint before it ends: the
		 * age test above compares the shard's clock when it answered with
		 * the client's when it read the answer, and with no checkpoint
		 * before the monitor's (the age counts from the shard's start) an
		 * answer held up by the copy of that checkpoint passes it early
		 * (seen once under load: "a checkpoint is being written now") */
		struct asker a = { .c = c, .busy_retry = 1 };
		pthread_t th;
		ck_assert_int_eq(pthread_create(&th, NULL, ask_checkpoint, &a), 0);
		deadline = ps_now_s() + 30 * tu_time_scale();
		while (!tmp_file_in(dir) && ps_now_s() < deadline)
			tu_sleep_ms(1);
		ck_assert_msg(tmp_file_in(dir), "no checkpoint being written within 30 s");
		ck_assert_int_eq(ps_client_checkpoint(mon, 0, 1, &ms), 0);
		pthread_join(th, NULL);
		ck_assert_msg(a.rc == 0 && a.st.checkpoint_status == 0, "the first: %s",
			      a.st.checkpoint_error);
		/* written already when the second came: not refused, written too */
		ck_assert_msg(ms.checkpoint_status == 0 ||
			      (ms.checkpoint_status == PS_ESTATE &&
			       strstr(ms.checkpoint_error, "a checkpoint is being written now")),
			      "a second checkpoint during the first: status %d, '%s'",
			      ms.checkpoint_status, ms.checkpoint_error);
		refused = ms.checkpoint_status != 0;
	}
	ck_assert_msg(refused, "five checkpoints asked while another was being written were "
		      "all taken");
	ps_client_free(mon);
	ps_client_free(c);
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	stop_files();
}
END_TEST

/* SIGTERM while a checkpoint on request is being written (its temporary
 * file is there): the shard says it waits for it, then writes the last
 * checkpoint, named for the signal, exits 0, and the file loads with the
 * last update in it; when the folder vanished meanwhile, both fail and the
 * shard exits 1. */
START_TEST(test_sigterm_during_checkpoint)
{
	static float w[16];
	int port = tu_free_port();

	strcpy(dir, "/tmp/ps-ckpt-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	path[0] = 0;
	big_cfg(port, "  on_request: true\n  min_interval_s: 0\n");
	setenv("PS_TEST_LOG", "info", 1); /* its log lines are checked below */
	tu_capture_begin();
	srv[0] = tu_start_server(path, 0);
	struct ps_client *c = tu_connect_while_up(&cfg, 0, srv[0], 180);
	float g[16];
	for (int i = 0; i < 16; i++)
		g[i] = 2.0f;
	struct ps_tensor tg = { "small", g, 16, 0 }, tw = { "small", w, 16, 0 };
	int64_t id = ps_client_push(c, 0, &tg, 1, PS_PUSH_END_CLOCK);
	ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "push: %s", ps_client_error(c));
	struct asker a = { .c = c };
	pthread_t th;
	ck_assert_int_eq(pthread_create(&th, NULL, ask_checkpoint, &a), 0);
	double deadline = ps_now_s() + 30 * tu_time_scale();
	while (!tmp_file_in(dir) && ps_now_s() < deadline)
		tu_sleep_ms(1);
	ck_assert_msg(tmp_file_in(dir), "no checkpoint being written within 30 s");
	kill(srv[0], SIGTERM);
	int st = tu_wait_child(srv[0]);
	pthread_join(th, NULL);
	ps_client_free(c);
	unsetenv("PS_TEST_LOG");
	char *log = tu_capture_end();
	ck_assert_msg(st == 0, "the shard exited with %d", st);
	ck_assert_msg(strstr(log, "waiting for the checkpoint being written"), "%s", log);
	ck_assert_msg(strstr(log, "checkpoint (SIGTERM): "), "%s", log);
	free(log);
	ck_assert(!tmp_file_in(dir));
	srv[0] = tu_start_server(path, 0);
	c = tu_connect_while_up(&cfg, 0, srv[0], 180);
	id = ps_client_pull(c, 0, &tw, 1);
	ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "pull: %s", ps_client_error(c));
	for (int i = 0; i < 16; i++)
		ck_assert_msg(w[i] == (float)i - 2.0f, "small[%d] = %g", i, (double)w[i]);
	ps_client_free(c);
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);

	/* again, and the folder disappears meanwhile: the checkpoint being
	 * written and the last one both fail, and the shard says so and exits
	 * with status 1, so a supervisor sees the lost checkpoint */
	char gone[220];
	snprintf(gone, sizeof(gone), "%s.gone", dir);
	setenv("PS_TEST_LOG", "info", 1);
	tu_capture_begin();
	srv[0] = tu_start_server(path, 0);
	c = tu_connect_while_up(&cfg, 0, srv[0], 180);
	a = (struct asker){ .c = c };
	ck_assert_int_eq(pthread_create(&th, NULL, ask_checkpoint, &a), 0);
	deadline = ps_now_s() + 30 * tu_time_scale();
	while (!tmp_file_in(dir) && ps_now_s() < deadline)
		tu_sleep_ms(1);
	ck_assert_msg(tmp_file_in(dir), "no checkpoint being written within 30 s");
	ck_assert_int_eq(rename(dir, gone), 0);
	kill(srv[0], SIGTERM);
	st = tu_wait_child(srv[0]);
	pthread_join(th, NULL);
	ps_client_free(c);
	unsetenv("PS_TEST_LOG");
	log = tu_capture_end();
	ck_assert_int_eq(rename(gone, dir), 0);
	ck_assert_msg(st == 1, "the shard exited with %d", st);
	ck_assert_msg(strstr(log, "waiting for the checkpoint being written"), "%s", log);
	ck_assert_msg(strstr(log, "checkpoint (SIGTERM) failed: "), "%s", log);
	free(log);
	stop_files();
}
END_TEST

/* A config of two shards (sync, 1 worker) on p0, p1 with extra YAML at
 * the end (checkpoint and limits). */
static void write_cfg_extra(int p0, int p1, const char *extra)
{
	char yaml[2048], err[512];

	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [127.0.0.1:%d, 127.0.0.1:%d]\n  workers: 1\n"
		 "slice_bytes: 4096\n"
		 "optimizer:\n  name: sgd\n  lr: 0.5\n"
		 "model:\n  tensors:\n    - {name: a, shape: [%d], init: arange}\n"
		 "log:\n  level: warn\n%s", p0, p1, N, extra);
	if (!path[0])
		ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	FILE *f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs(yaml, f);
	fclose(f);
	ck_assert_msg(ps_config_load(&cfg, path, err, sizeof(err)) == 0, "%s", err);
}

/* The shards checkpoint on their own (here: on request, shard 0 at clock
 * 5, shard 1 at clock 10); both are killed with -9 and started again. A
 * new run of the workers resumes (at clock 10: shard 0 is brought forward,
 * losing its updates of clocks 5..9) instead of waiting at shard 0's clock
 * for pushes nobody sends, and the log says so in one line. */
START_TEST(test_resume_different_clocks)
{
	static float w[N];
	struct ps_shard_stats st;
	int p0 = tu_free_port(), p1 = tu_free_port();
	char extra[512];

	strcpy(dir, "/tmp/ps-ckpt-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	path[0] = 0;
	snprintf(extra, sizeof(extra), "checkpoint:\n  dir: %s\n  on_request: true\n"
		 "  min_interval_s: 0\nlimits:\n  request_timeout_ms: 5000\n", dir);
	write_cfg_extra(p0, p1, extra);
	srv[0] = tu_start_server(path, 0);
	srv[1] = tu_start_server(path, 1);
	struct ps_client *c = connect_retry(0);
	train(c, 0, 5, w);
	ck_assert_int_eq(ps_client_checkpoint(c, 0, 1, &st), 0);
	ck_assert_msg(st.checkpoint_status == 0, "%s", st.checkpoint_error);
	train(c, 5, 10, w);
	ck_assert_int_eq(ps_client_checkpoint(c, 1, 1, &st), 0);
	ck_assert_msg(st.checkpoint_status == 0, "%s", st.checkpoint_error);
	train(c, 10, 12, w);
	ps_client_free(c);
	for (int k = 0; k < 2; k++) {
		kill(srv[k], SIGKILL);
		tu_wait_child(srv[k]);
	}
	tu_capture_begin();
	srv[0] = tu_start_server(path, 0);
	srv[1] = tu_start_server(path, 1);
	c = connect_retry(0);
	uint64_t at = ps_client_clock(c);
	ck_assert(ps_client_from_checkpoint(c));
	/* the run goes on from the newest clock */
	static float g[N];
	struct ps_tensor tg = { .name = "a", .data = g, .count = N };
	struct ps_tensor tw = { .name = "a", .data = w, .count = N };
	/* as ps-worker does: the weights at the clock it continues from
	 * first, then the pushes */
	int64_t q = ps_client_pull(c, at, &tw, 1);
	int ok = q > 0 && ps_client_wait(c, q) == 0;
	for (uint64_t k = at; k < at + 3 && ok; k++) {
		int64_t p = ps_client_push(c, k, &tg, 1, PS_PUSH_END_CLOCK);
		ok = p > 0 && ps_client_wait(c, p) == 0;
	}
	q = ok ? ps_client_pull(c, at + 3, &tw, 1) : -1;
	ok = ok && q > 0 && ps_client_wait(c, q) == 0;
	char why[600];
	snprintf(why, sizeof(why), "%s", ps_client_error(c));
	ps_client_free(c);
	tu_sleep_ms(100); /* the shards' lines are written before the stop below */
	char *log = tu_capture_end();
	ck_assert_msg(at == 10, "the worker continues at clock %" PRIu64 ", expected 10", at);
	ck_assert_msg(ok, "a restarted cluster whose shards checkpointed at clocks 5 and 10 did "
		      "not resume: %s", why);
	ck_assert_msg(strstr(log, "shard 0 at 5") && strstr(log, "clocks 5..9 are lost"),
		      "the worker says what happened in one line: %s", log);
	ck_assert_msg(strstr(log, "brought forward to 10"), "the shard says so too: %s", log);
	free(log);
	stop_and_clean();
}
END_TEST

/* GET /metrics from 127.0.0.1:port (HTTP/1.0): the whole answer into out. */
static void get_metrics(int port, char *out, size_t n)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	const char *req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	size_t got = 0;
	ssize_t k;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	ck_assert_int_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
	while (got + 1 < n && (k = read(fd, out + got, n - 1 - got)) > 0)
		got += (size_t)k;
	out[got] = 0;
	close(fd);
}

/* The value of the sample `name ` in a /metrics page; -1 when absent. */
static double sample(const char *text, const char *name)
{
	char pat[100];
	const char *p;

	snprintf(pat, sizeof(pat), "\n%s ", name);
	p = strstr(text, pat);
	return p ? strtod(p + strlen(pat), NULL) : -1;
}

/* Checkpoints that stop (the folder gone: a full disk fails alike) are
 * seen in the stats, /metrics and ps-stat: the age of the last good one
 * grows, failures are counted, ps-stat flags the shard once the age passes
 * twice checkpoint.every_s. */
START_TEST(test_checkpoint_health)
{
	struct ps_shard_stats st;
	int p0 = tu_free_port(), p1 = tu_free_port();
	char extra[512], moved[80], out[8192], cmd[300];

	strcpy(dir, "/tmp/ps-ckpt-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	path[0] = 0;
	int hp = tu_free_port();
	snprintf(extra, sizeof(extra), "checkpoint:\n  dir: %s\n  every_s: 1\nstats:\n  http: "
		 "127.0.0.1:%d\n", dir, hp);
	write_cfg_extra(p0, p1, extra);
	srv[0] = tu_start_server(path, 0);
	srv[1] = tu_start_server(path, 1);
	struct ps_client *c = connect_retry(0);
	/* a periodic checkpoint is written: its age stays near the period */
	double t0 = ps_now_s();
	do {
		ck_assert_int_eq(ps_client_stats(c, 0, &st), 0);
		ck_assert_msg(st.checkpoint_on, "the stats say whether checkpoints are on");
		ck_assert_msg(ps_now_s() - t0 < 10 * tu_time_scale(), "no checkpoint written");
		tu_sleep_ms(100);
	} while (st.uptime_s < 1.5);
	/* under twice the period, where ps-stat calls it stale: the period
	 * plus one write, which a loaded machine (make test's second lane)
	 * can stretch past half a second */
	ck_assert_msg(st.checkpoint_age_s < 2.0 && st.checkpoint_failures == 0,
		      "age %.2f s, %" PRIu64 " failures", st.checkpoint_age_s,
		      st.checkpoint_failures);
	ck_assert_uint_eq(st.checkpoint_every_s, 1);
	snprintf(cmd, sizeof(cmd), "bin/ps-stat --config %s 2>&1", path);
	ck_assert_int_eq(run_cmd(cmd, out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "checkpoint age") && !strstr(out, "STALE"), "%s", out);
	/* the folder goes: every checkpoint fails from now on */
	snprintf(moved, sizeof(moved), "%s.moved", dir);
	ck_assert_int_eq(rename(dir, moved), 0);
	FILE *f = fopen(dir, "w"); /* a file where the folder was */
	ck_assert_ptr_nonnull(f);
	fclose(f);
	t0 = ps_now_s();
	do {
		ck_assert_int_eq(ps_client_stats(c, 0, &st), 0);
		ck_assert_msg(ps_now_s() - t0 < 15 * tu_time_scale(), "age %.2f s, %" PRIu64
			      " failures", st.checkpoint_age_s, st.checkpoint_failures);
		tu_sleep_ms(100);
	} while (st.checkpoint_failures < 2 || st.checkpoint_age_s <= 2.0);
	ck_assert_int_eq(run_cmd(cmd, out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "STALE"), "ps-stat flags the stale checkpoints: %s", out);
	snprintf(cmd, sizeof(cmd), "bin/ps-stat --config %s --json 2>&1", path);
	ck_assert_int_eq(run_cmd(cmd, out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "\"checkpoint_stale\":true"), "%s", out);
	static char page[65536];
	get_metrics(hp, page, sizeof(page));
	ck_assert_msg(sample(page, "ps_checkpoint_age_seconds") > 2.0 &&
		      sample(page, "ps_checkpoint_failures_total") >= 2 &&
		      sample(page, "ps_checkpoint_every_seconds") == 1, "%s", page);
	ps_client_free(c);
	/* the stop's checkpoint fails too: the shards exit 1, saying why */
	ck_assert_int_eq(tu_stop_server(srv[0]), 1);
	ck_assert_int_eq(tu_stop_server(srv[1]), 1);
	unlink(dir);
	ck_assert_int_eq(rename(moved, dir), 0);
	stop_files();
}
END_TEST

int main(void)
{
	Suite *s = suite_create("checkpoint");
	TCase *tc = tcase_create("checkpoint");
	int failed;

	tu_secret_setup();
	signal(SIGPIPE, SIG_IGN);
	tcase_set_timeout(tc, 300);
	TU_ADD(tc, test_checkpoint_resume);
	TU_ADD(tc, test_shard_killed_and_restarted);
	TU_ADD(tc, test_async_resume_clocks);
	TU_ADD(tc, test_crash_while_checkpointing);
	TU_ADD(tc, test_checkpoint_files);
	TU_ADD(tc, test_checkpoint_on_request);
	TU_ADD(tc, test_checkpoint_requests_overlap);
	TU_ADD(tc, test_sigterm_during_checkpoint);
	TU_ADD(tc, test_resume_different_clocks);
	TU_ADD(tc, test_checkpoint_health);
	suite_add_tcase(s, tc);
	failed = tu_run_suite(s);
	tu_secret_cleanup();
	return failed ? 1 : 0;
}

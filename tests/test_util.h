/* test_util.h - helpers shared by the tests: free ports, temporary config
 * files, starting and stopping real ps-server processes. Header-only so each
 * test stays one .c file. */
#ifndef PS_TEST_UTIL_H
#define PS_TEST_UTIL_H

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "config_agree.h"

/* A TCP port on 127.0.0.1 that was free a moment ago, below the kernel's
 * ephemeral range (32768 on): a port picked there can be taken as the
 * source port of any connection made before the shard binds it (make
 * test runs two lanes of tests at once: run-tests.sh --beside). Random,
 * checked by a bind, and not one of this process's last 64 picks. */
static inline int tu_free_port(void)
{
	static unsigned seed;
	static int recent[64], nrecent;

	if (!seed)
		seed = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL) ^ 1u;
	for (int i = 0; i < 4000; i++) {
		int p = 10000 + (int)(rand_r(&seed) % 22700), dup = 0, ok = 0;
		struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)p),
					  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		int fd;

		for (int j = 0; j < nrecent && j < 64; j++)
			dup |= recent[j] == p;
		if (dup || (fd = socket(AF_INET, SOCK_STREAM, 0)) < 0)
			continue;
		ok = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
		close(fd);
		if (ok) {
			recent[nrecent++ % 64] = p;
			return p;
		}
	}
	return -1;
}

/* Where the integration tests' shards listen and what carries their
 * frames: PS_TEST_HOST (default 127.0.0.1) and PS_TEST_TRANSPORT (default
 * tcp). tests/rdma-vm.sh sets them to the VM's RoCE address and rdma. */
static inline const char *tu_host(void)
{
	const char *h = getenv("PS_TEST_HOST");

	return h && *h ? h : "127.0.0.1";
}

/* The config line that names the transport ("" for tcp, the default). */
static inline const char *tu_transport_yaml(void)
{
	const char *t = getenv("PS_TEST_TRANSPORT");

	return t && strcmp(t, "rdma") == 0 ? "transport: rdma\n" : "";
}

/* Whether the case named name runs: PS_TEST_ONLY, when set, lists the
 * cases to run (names separated by commas or spaces); the VM runs a few. */
static inline int tu_selected(const char *name)
{
	const char *only = getenv("PS_TEST_ONLY"), *p;
	size_t n = strlen(name);

	if (!only || !*only)
		return 1;
	for (p = only; (p = strstr(p, name)); p += n)
		if ((p == only || p[-1] == ',' || p[-1] == ' ') && (p[n] == 0 || p[n] == ',' ||
								     p[n] == ' '))
			return 1;
	return 0;
}

/* tcase_add_test / tcase_add_loop_test for the cases tu_selected lets run. */
#define TU_ADD(tc, fn)                                                          \
	do {                                                                    \
		if (tu_selected(#fn))                                           \
			tcase_add_test(tc, fn);                                 \
	} while (0)
#define TU_ADD_LOOP(tc, fn, a, b)                                               \
	do {                                                                    \
		if (tu_selected(#fn))                                           \
			tcase_add_loop_test(tc, fn, a, b);                      \
	} while (0)

/* Writes text to a new temporary file; returns its path in path (64 bytes). */
static inline int tu_write_temp(char *path, const char *text)
{
	int fd;
	FILE *f;

	strcpy(path, "/tmp/ps-test-XXXXXX.yaml");
	fd = mkstemps(path, 5);
	if (fd < 0 || !(f = fdopen(fd, "w")))
		return -1;
	fputs(text, f);
	fclose(f);
	return 0;
}

/* The whole of file f, malloc'ed with a 0 byte after it (not counted in
 * *len); NULL (and *len 0) when it cannot be read. */
static inline uint8_t *tu_slurp(const char *f, size_t *len)
{
	FILE *fp = fopen(f, "rb");
	uint8_t *b = NULL;
	long n;

	*len = 0;
	if (!fp)
		return NULL;
	if (fseek(fp, 0, SEEK_END) == 0 && (n = ftell(fp)) >= 0 && fseek(fp, 0, SEEK_SET) == 0 &&
	    (b = malloc((size_t)n + 1)) && fread(b, 1, (size_t)n, fp) == (size_t)n) {
		b[n] = 0;
		*len = (size_t)n;
	} else {
		free(b);
		b = NULL;
	}
	fclose(fp);
	return b;
}

/* How many times text occurs in the file at path (not overlapping); 0
 * when it cannot be read, 1 for an empty text in a file that can. */
static inline int tu_file_count(const char *path, const char *text)
{
	size_t len;
	char *b = (char *)tu_slurp(path, &len);
	int n = 0;

	if (b && !*text)
		n = 1;
	for (const char *q = b; b && *text && (q = strstr(q, text)); q += strlen(text))
		n++;
	free(b);
	return n;
}

/* The settings a raw Hello carries (config_agree.h): a worker's lines, or
 * with partner those of the shard's other process, as sent with key (the
 * hashed cluster secret under security.auth; NULL: plain). A static
 * buffer, the same for every call. */
static inline char *tu_hello_settings(const struct ps_config *cfg, int partner,
				      const uint8_t *key)
{
	static char plain[PS_AGREE_MAX], wire[PS_AGREE_MAX];

	if (partner)
		ps_config_agreement_partner(cfg, plain, sizeof(plain));
	else
		ps_config_agreement(cfg, plain, sizeof(plain));
	ps_config_agreement_wire(plain, key, wire, sizeof(wire));
	return wire;
}

/* Whether the file at log has a line holding what. */
static inline int tu_log_says(const char *log, const char *what)
{
	FILE *f = fopen(log, "r");
	char line[2048];
	int said = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		said |= strstr(line, what) != NULL;
	fclose(f);
	return said;
}

/* fork() for a child that execs a program: in the child, SIGTERM and
 * SIGINT as the program would have them. Until the exec the child runs the
 * handlers of its test process, Check's, which on SIGTERM or SIGINT kill
 * the test's whole process group: a test that stopped a shard it had just
 * started, before the exec, died of its own SIGTERM ("Received signal
 * 15"). The two are blocked across the fork, so one sent at once waits
 * for the default action. */
static inline pid_t tu_fork(void)
{
	sigset_t set, old;
	pid_t pid;

	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigprocmask(SIG_BLOCK, &set, &old);
	pid = fork();
	if (pid == 0) {
		signal(SIGTERM, SIG_DFL);
		signal(SIGINT, SIG_DFL);
	}
	sigprocmask(SIG_SETMASK, &old, NULL);
	return pid;
}

/* Starts bin/ps-server for shard; its stderr goes to the file log (created
 * or truncated), or with log NULL (tu_start_server) to the test's stderr.
 * With PS_TEST_VALGRIND set the shard runs under valgrind (memcheck),
 * which makes it exit 99 on any error or definite leak, so
 * tu_stop_server's check of a clean exit catches them. */
static inline pid_t tu_start_server_log(const char *cfgpath, int shard, const char *log)
{
	char s[16];
	pid_t pid;

	snprintf(s, sizeof(s), "%d", shard);
	pid = tu_fork();
	if (pid == 0) {
		const char *lvl = getenv("PS_TEST_LOG") ? getenv("PS_TEST_LOG") : "warn";
		/* as a shell or a service manager starts it: an ignored SIGPIPE
		 * (the tests ignore it) would be inherited, and hide a shard
		 * that dies of one */
		signal(SIGPIPE, SIG_DFL);
		if (log) {
			int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
			if (fd < 0 || dup2(fd, 2) < 0) {
				perror(log);
				_exit(127);
			}
			close(fd);
		}
		/* nouserintercepts: valgrind replaces glibc's allocator only,
		 * so that libpsfault.so's malloc (LD_PRELOADed by it_fault) is
		 * still called, and its calls to glibc's are tracked */
		if (getenv("PS_TEST_VALGRIND"))
			execlp("valgrind", "valgrind", "-q", "--error-exitcode=99",
			       "--leak-check=full", "--errors-for-leak-kinds=definite",
			       "--soname-synonyms=somalloc=nouserintercepts", "bin/ps-server", "--config", cfgpath, "--shard", s, "--log-level", lvl,
			       (char *)NULL);
		execl("bin/ps-server", "ps-server", "--config", cfgpath, "--shard", s, "--log-level",
		      lvl, (char *)NULL);
		perror("exec bin/ps-server");
		_exit(127);
	}
	return pid;
}

static inline pid_t tu_start_server(const char *cfgpath, int shard)
{
	return tu_start_server_log(cfgpath, shard, NULL);
}

/* SIGTERM and wait; returns the exit status (or 128 + signal). */
static inline int tu_stop_server(pid_t pid)
{
	int st = 0;

	if (pid <= 0)
		return -1;
	kill(pid, SIGTERM);
	if (waitpid(pid, &st, 0) != pid)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Waits for a child; returns its exit status (or 128 + signal). */
static inline int tu_wait_child(pid_t pid)
{
	int st = 0;

	if (waitpid(pid, &st, 0) != pid)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Starts argv[0] (a path) with argv, its stdout and stderr into the file
 * out (created or truncated); its pid. The child only redirects and execs,
 * so a test with threads may call it. */
static inline pid_t tu_spawn(const char *const *argv, const char *out)
{
	pid_t pid = tu_fork();

	if (pid == 0) {
		int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		signal(SIGPIPE, SIG_DFL); /* as tu_start_server_log */
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	return pid;
}

/* Removes folder dir and what is in it (a test's scratch folder): 0, or
 * -1 having said so on stderr. */
static inline int tu_rmtree(const char *dir)
{
	char cmd[256];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) == 0)
		return 0;
	fprintf(stderr, "could not remove %s\n", dir);
	return -1;
}

/* Writes a fresh secret (64 hex digits from /dev/urandom, mode 0600) to a
 * new file; its name goes to path (64 bytes). 0 or -1. */
static inline int tu_write_secret(char *path)
{
	unsigned char r[32];
	FILE *u = fopen("/dev/urandom", "rb");
	int fd, ok;

	strcpy(path, "/tmp/ps-test-secret-XXXXXX");
	fd = mkstemp(path); /* mode 0600 */
	if (fd < 0 || !u || fread(r, 1, sizeof(r), u) != sizeof(r)) {
		if (u)
			fclose(u);
		return -1;
	}
	fclose(u);
	ok = 1;
	for (size_t i = 0; i < sizeof(r); i++) {
		char hx[3];
		snprintf(hx, sizeof(hx), "%02x", r[i]);
		ok &= write(fd, hx, 2) == 2;
	}
	close(fd);
	return ok ? 0 : -1;
}

/* Tests run with authentication on, like a real cluster: unless the
 * caller set PS_SECRET_FILE, points it (inherited by the ps-server
 * processes started) at a fresh secret that tu_secret_cleanup removes.
 * Call both from main(), not from a test (Check forks tests). */
static char tu_secret_path[64], tu_repl_key_path[64];

static inline void tu_secret_setup(void)
{
	/* the replicated shards' own key (security.repl_key_file) likewise */
	if (!getenv("PS_REPL_KEY_FILE") && tu_write_secret(tu_repl_key_path) == 0)
		setenv("PS_REPL_KEY_FILE", tu_repl_key_path, 1);
	if (getenv("PS_SECRET_FILE"))
		return;
	if (tu_write_secret(tu_secret_path) == 0)
		setenv("PS_SECRET_FILE", tu_secret_path, 1);
}

static inline void tu_secret_cleanup(void)
{
	if (tu_secret_path[0])
		unlink(tu_secret_path);
	if (tu_repl_key_path[0])
		unlink(tu_repl_key_path);
}

/* Skipped cases. A case that cannot run here (no GPU, no such transport
 * feature, a missing data set) calls tu_skip once, which prints
 * "SKIP <what>: <reason>", and returns; cases never registered because
 * main() knows they cannot run are announced with tu_skip_cases(n, ...).
 * tu_run_suite then ends with "tu: N cases, S skipped" (N counts the
 * unregistered ones too), which scripts/run-tests.sh reads: a test whose
 * every case skipped is reported as SKIP, not PASS. Check forks each case,
 * so the counts live in a shared mapping made before the cases run. A SKIP
 * line printed without these helpers (part of a case that still ran, or a
 * program without tu_run_suite) is shown but counts no case. */
struct tu_skips {
	int skipped;        /* tu_skip calls, from every case */
	int unregistered;   /* tu_skip_cases totals */
};

static struct tu_skips *tu_skips_shared;

static inline struct tu_skips *tu_skips(void)
{
	if (!tu_skips_shared) {
		void *p = mmap(NULL, sizeof(struct tu_skips), PROT_READ | PROT_WRITE,
			       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		static struct tu_skips local; /* no mapping: counts stay in this process */

		tu_skips_shared = p == MAP_FAILED ? &local : p;
	}
	return tu_skips_shared;
}

static inline void tu_vskip(int ncases, const char *fmt, va_list ap)
{
	fputs("SKIP ", stdout);
	vprintf(fmt, ap);
	fputc('\n', stdout);
	fflush(stdout);
	if (ncases < 0)
		__atomic_add_fetch(&tu_skips()->skipped, 1, __ATOMIC_RELAXED);
	else
		__atomic_add_fetch(&tu_skips()->unregistered, ncases, __ATOMIC_RELAXED);
}

/* The running case skips: prints "SKIP " and the message. Once per case,
 * then return. */
static inline __attribute__((format(printf, 1, 2))) void tu_skip(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	tu_vskip(-1, fmt, ap);
	va_end(ap);
}

/* n cases that main() does not register: prints "SKIP " and the message. */
static inline __attribute__((format(printf, 2, 3))) void tu_skip_cases(int n, const char *fmt,
									  ...)
{
	va_list ap;

	va_start(ap, fmt);
	tu_vskip(n, fmt, ap);
	va_end(ap);
}

#ifdef CHECK_H
/* Runs every test of s (Check's forking runner, or in this process with
 * nofork) and prints the "tu:" line of cases and skips; the number that
 * failed. */
static inline int tu_run_suite_as(Suite *s, int nofork)
{
	SRunner *sr = srunner_create(s);
	struct tu_skips *k = tu_skips();
	int failed, run;

	if (nofork)
		srunner_set_fork_status(sr, CK_NOFORK);
	fflush(stdout);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	run = srunner_ntests_run(sr);
	srunner_free(sr);
	printf("tu: %d cases, %d skipped\n", run + k->unregistered, k->skipped + k->unregistered);
	fflush(stdout);
	return failed;
}

static inline int tu_run_suite(Suite *s)
{
	return tu_run_suite_as(s, 0);
}
#endif

/* Factor for the slack of time bounds and the deadlines of waits: 1
 * natively; under valgrind (PS_TEST_VALGRIND, set by `make valgrind`) the
 * shards and the tests run many times slower: 10; PS_TEST_TIME_SCALE, when
 * set, overrides both. */
static inline double tu_time_scale(void)
{
	const char *e = getenv("PS_TEST_TIME_SCALE");

	if (e && atof(e) >= 1)
		return atof(e);
	return getenv("PS_TEST_VALGRIND") ? 10 : 1;
}

/* CPU time (user + system) process pid has used so far, in ms; -1 if
 * unknown. Unlike wall-clock time it does not grow while the process
 * waits for a busy machine. */
static inline double tu_cpu_ms(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long ut, st;
	size_t n;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (!(f = fopen(path, "r")))
		return -1;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	/* after "pid (comm) ": state, then fields 4..13, then utime, stime */
	if (!(p = strrchr(buf, ')')) ||
	    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
		return -1;
	return (double)(ut + st) * 1000.0 / (double)sysconf(_SC_CLK_TCK);
}

static inline void tu_sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

/* n shard addresses on fresh loopback ports, "127.0.0.1:P, ..." */
static inline void tu_servers_list(int n, char *buf, size_t len)
{
	buf[0] = '\0';
	for (int k = 0, o = 0; k < n; k++)
		o += snprintf(buf + o, len - (size_t)o, "%s127.0.0.1:%d", k ? ", " : "",
			      tu_free_port());
}

/* yaml written to DIR/NAME.yaml, its path in out. */
static inline void tu_write_named(const char *dir, const char *name, const char *yaml, char *out,
				  size_t len)
{
	snprintf(out, len, "%s/%s.yaml", dir, name);
	FILE *f = fopen(out, "w");

	if (!f) { /* the case's folder is its own: this does not happen */
		perror(out);
		abort();
	}
	fputs(yaml, f);
	fclose(f);
}

/* Waits (secs at most) for child pid to exit: its status (128 + signal
 * when killed), or -1 (not a child, or still running: then killed). */
static inline int tu_wait_exit_s(pid_t pid, int secs)
{
	int st = 0;

	for (int i = 0; i < secs * 10; i++) {
		pid_t r = waitpid(pid, &st, WNOHANG);
		if (r == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		if (r < 0)
			return -1;
		tu_sleep_ms(100);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	return -1;
}

/* tu_wait_exit_s for 60 s */
static inline int tu_wait_exit(pid_t pid)
{
	return tu_wait_exit_s(pid, 60);
}

/* Whether something listens on 127.0.0.1:port within 60 s. */
static inline int tu_wait_listen(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	for (int i = 0; i < 600; i++) {
		int fd = socket(AF_INET, SOCK_STREAM, 0), ok;
		if (fd < 0)
			return 0;
		ok = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
		close(fd);
		if (ok)
			return 1;
		tu_sleep_ms(100);
	}
	return 0;
}

/* Whether the kernel holds no TCP socket from 127.0.0.1:port to
 * 127.0.0.1:peer_port (IPv4, /proc/net/tcp): a socket reset by its peer
 * leaves the table at once, even while its owner has not closed it. */
static inline int tu_tcp_gone(int port, int peer_port)
{
	char line[512];
	unsigned lp, rp;
	int found = 0;
	FILE *f = fopen("/proc/net/tcp", "r");

	if (!f)
		return 0;
	while (!found && fgets(line, sizeof(line), f))
		if (sscanf(line, " %*d: %*x:%x %*x:%x", &lp, &rp) == 2)
			found = (int)lp == port && (int)rp == peer_port;
	fclose(f);
	return !found;
}

/* A peer that goes away while the process pid (a child of this one) is
 * about to write to it: with pid stopped (SIGSTOP), writes the n bytes b
 * on fd, closes it with a FIN and then a reset, waits until the kernel has
 * taken the reset (pid's end of the connection, port to fd's local port,
 * is gone; at most 5 s), and lets pid go on (SIGCONT). The first thing pid
 * does is read b and answer it, into a connection reset after a FIN: that
 * write fails with EPIPE and raises SIGPIPE, which ends pid unless it
 * ignores or blocks the signal. Returns fd's local port, or -1 when the
 * reset did not arrive. */
static inline int tu_reset_while_stopped(pid_t pid, int port, int fd, const void *b, size_t n)
{
	struct sockaddr_in sa;
	socklen_t sl = sizeof(sa);
	struct linger l = { 1, 0 };
	int st, me, gone = 0;

	if (getsockname(fd, (struct sockaddr *)&sa, &sl))
		return -1;
	me = ntohs(sa.sin_port);
	kill(pid, SIGSTOP);
	waitpid(pid, &st, WUNTRACED);
	for (size_t off = 0; off < n;) {
		ssize_t k = write(fd, (const char *)b + off, n - off);
		if (k <= 0)
			break;
		off += (size_t)k;
	}
	shutdown(fd, SHUT_WR);
	setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
	close(fd);
	for (int i = 0; i < 500 && !(gone = tu_tcp_gone(port, me)); i++) {
		struct timespec ts = { 0, 10000000L };
		nanosleep(&ts, NULL);
	}
	kill(pid, SIGCONT);
	return gone ? me : -1;
}

/* SANITIZED: 1 in a build with AddressSanitizer, whose quarantine keeps
 * freed memory (so resident memory says nothing about leaks; its own leak
 * check reports them) and which slows allocation-heavy cases. */
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

/* Log lines as a user reads them: from tu_capture_begin on, this
 * process's stderr (and that of every ps-server it starts afterwards
 * without a log file) goes to a temporary file as well as nowhere else;
 * tu_capture_end restores stderr and returns what was written (malloc'ed,
 * NUL-terminated). One capture at a time. */
static int tu_capture_fd = -1, tu_capture_saved = -1;
static char tu_capture_path[64];

static inline void tu_capture_begin(void)
{
	strcpy(tu_capture_path, "/tmp/ps-test-log-XXXXXX");
	tu_capture_fd = mkstemp(tu_capture_path);
	fflush(stderr);
	tu_capture_saved = dup(2);
	dup2(tu_capture_fd, 2);
}

static inline char *tu_capture_end(void)
{
	char *text;
	long n;
	FILE *f;

	fflush(stderr);
	dup2(tu_capture_saved, 2);
	close(tu_capture_saved);
	close(tu_capture_fd);
	f = fopen(tu_capture_path, "rb");
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	rewind(f);
	text = malloc((size_t)n + 1);
	n = (long)fread(text, 1, (size_t)n, f);
	text[n] = 0;
	fclose(f);
	unlink(tu_capture_path);
	/* shown too, so a failing test still has its log */
	fputs(text, stderr);
	return text;
}

/* Waits until f(arg) holds under mu, woken by cv, secs at most (the
 * worker threads of the live re-shard tests and their gates); 0, or -1
 * when it still does not hold at the deadline. */
static inline int tu_wait_cond(pthread_mutex_t *mu, pthread_cond_t *cv, int (*f)(void *),
			       void *arg, int secs)
{
	struct timespec ts;
	int rc = 0;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += secs;
	pthread_mutex_lock(mu);
	while (!f(arg) && rc == 0)
		rc = pthread_cond_timedwait(cv, mu, &ts);
	rc = f(arg) ? 0 : -1;
	pthread_mutex_unlock(mu);
	return rc;
}

#endif

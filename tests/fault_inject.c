/* fault_inject.c - libpsfault.so: makes the Nth call of a chosen libc
 * function fail, for the tests of the failure paths (an allocation that
 * fails, a write or read that fails or comes up short, EINTR). LD_PRELOADed
 * into a ps-server (or any program); the shipped binaries are unchanged.
 * Set by the environment:
 *
 *   PS_FAULT=RULE[,RULE...]   RULE = FUNC:N[+][:HOW[:KIND]]
 *     FUNC  malloc calloc realloc posix_memalign aligned_alloc, or "alloc"
 *           (any of these five, counted together); write writev pwrite read
 *           readv pread recv sendmsg fsync fdatasync open openat rename
 *           memfd_create pthread_create; ibv_reg_mr (verbs: in a program
 *           linked with libibverbs, as the soft-RoCE VM's tests are)
 *     N     the call to fail, counted from 1 over the calls of FUNC made
 *           after the marker (below) that match KIND; "N+": that call and
 *           every later one
 *     HOW   an errno name (EIO ENOSPC EINTR EAGAIN ENOMEM EPIPE ECONNRESET
 *           EBADF EACCES EMFILE) or "short": a read or write of half the
 *           bytes asked (at least 1; a call of one byte is failed with EIO
 *           instead); default ENOMEM for the allocations, EAGAIN for
 *           pthread_create (its error returned, not set in errno), EIO
 *           otherwise
 *     KIND  for the calls on a descriptor: "file" (regular files and memory
 *           files, but not descriptors 0-2: a log file), "sock" (sockets),
 *           "any" (the default); for the allocations, "=BYTES" or ">=BYTES":
 *           only allocations of that size are counted (one buffer picked
 *           out among the many small ones); for ibv_reg_mr the same, of
 *           the length registered
 *   PS_FAULT_AFTER=TEXT   count nothing until a write to stderr contains
 *           TEXT (a log line such as "listening"), so startup is not where
 *           every fault lands; "" or unset: count from the start
 *   PS_FAULT_BACKTRACE=1  also the call stack of each fault into the log
 *   PS_FAULT_LOG=PATH     append one line per fault made:
 *           "psfault: pid P: write call 3 (fd 7, 4096 bytes): EIO", and
 *           "psfault: pid P: armed by ..." when the marker is seen; a test
 *           reads it to check that its fault landed
 *
 * An EINTR, EAGAIN or short fault fails that one call: the caller's retry
 * (call N+1) goes through. The allocations go to glibc's __libc_malloc &
 * co. (not dlsym, which allocates itself); the rest to dlsym(RTLD_NEXT).
 * Calls glibc makes internally (stdio's writes, fopen's open) bypass the
 * symbols and are not seen. Not for the sanitizer build (its runtime must
 * come first): the tests skip there. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

enum { K_ANY, K_FILE, K_SOCK };
enum { HOW_SHORT = -1 };

#define MAX_RULES 8
struct rule {
	char func[16];
	long n;        /* the call to fail, from 1 */
	int every;     /* "N+": every call from n on */
	int how;       /* errno, or HOW_SHORT */
	int kind;
	size_t size;   /* allocations: only those of size bytes (or more: at_least) */
	int at_least;
	long calls;    /* the calls of func counted so far */
};

static struct rule rules[MAX_RULES];
static int nrules;
static pthread_once_t parsed = PTHREAD_ONCE_INIT;
static int armed;       /* counting: no marker, or the marker was seen */
static char marker[128];
static char logpath[256];
static int want_stack;
static __thread int in_stack; /* backtrace() allocates the first time */
static __thread int held;     /* psfault_hold: this thread's calls pass, uncounted */

static const struct { const char *name; int e; } errnos[] = {
	{ "EIO", EIO }, { "ENOSPC", ENOSPC }, { "EINTR", EINTR }, { "EAGAIN", EAGAIN },
	{ "ENOMEM", ENOMEM }, { "EPIPE", EPIPE }, { "ECONNRESET", ECONNRESET },
	{ "EBADF", EBADF }, { "EACCES", EACCES }, { "EMFILE", EMFILE },
};

static const char *how_name(int how)
{
	if (how == HOW_SHORT)
		return "short";
	for (size_t i = 0; i < sizeof(errnos) / sizeof(errnos[0]); i++)
		if (errnos[i].e == how)
			return errnos[i].name;
	return "?";
}

/* One line to PS_FAULT_LOG (raw syscalls: no recursion into the wrappers). */
static void log_line(const char *fmt, ...)
{
	char b[512];
	int n, fd;
	va_list ap;

	if (!logpath[0])
		return;
	n = snprintf(b, sizeof(b), "psfault: pid %d: ", (int)getpid());
	va_start(ap, fmt);
	n += vsnprintf(b + n, sizeof(b) - (size_t)n, fmt, ap);
	va_end(ap);
	if (n >= (int)sizeof(b) - 1)
		n = (int)sizeof(b) - 2;
	b[n++] = '\n';
	fd = (int)syscall(SYS_openat, AT_FDCWD, logpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC,
			  0644);
	if (fd >= 0) {
		(void)!syscall(SYS_write, fd, b, (size_t)n);
		syscall(SYS_close, fd);
	}
}

/* The caller's stack into the log (PS_FAULT_BACKTRACE=1). */
static void log_stack(void)
{
	void *pc[32];
	int n, fd;

	if (!want_stack || !logpath[0])
		return;
	in_stack = 1;
	n = backtrace(pc, 32);
	fd = (int)syscall(SYS_openat, AT_FDCWD, logpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC,
			  0644);
	if (fd >= 0) {
		backtrace_symbols_fd(pc, n, fd);
		syscall(SYS_close, fd);
	}
	in_stack = 0;
}

static void parse(void)
{
	const char *s = getenv("PS_FAULT"), *a = getenv("PS_FAULT_AFTER");
	const char *l = getenv("PS_FAULT_LOG");
	char spec[512], *save = NULL;

	if (l)
		snprintf(logpath, sizeof(logpath), "%s", l);
	want_stack = getenv("PS_FAULT_BACKTRACE") && *getenv("PS_FAULT_BACKTRACE") == '1';
	if (a && *a)
		snprintf(marker, sizeof(marker), "%s", a);
	else
		armed = 1;
	if (!s)
		return;
	snprintf(spec, sizeof(spec), "%s", s);
	for (char *r = strtok_r(spec, ",", &save); r && nrules < MAX_RULES;
	     r = strtok_r(NULL, ",", &save)) {
		struct rule *u = &rules[nrules];
		char *f[4] = { 0 }, *p = r, *end;
		int nf = 0;

		while (nf < 4 && (f[nf++] = strsep(&p, ":")))
			;
		if (!f[0] || !f[1]) {
			log_line("cannot read the rule '%s' (FUNC:N[:HOW[:KIND]])", r);
			continue;
		}
		snprintf(u->func, sizeof(u->func), "%s", f[0]);
		u->n = strtol(f[1], &end, 10);
		u->every = *end == '+';
		if (u->n < 1 || (*end && *end != '+')) {
			log_line("cannot read the count of the rule for %s: '%s'", f[0], f[1]);
			continue;
		}
		u->how = !strcmp(u->func, "alloc") || !strcmp(u->func, "ibv_reg_mr") ||
				 strstr("malloc calloc realloc posix_memalign aligned_alloc", u->func)
			 ? ENOMEM
			 : !strcmp(u->func, "pthread_create") ? EAGAIN : EIO;
		if (f[2] && *f[2]) {
			u->how = 0;
			if (!strcmp(f[2], "short"))
				u->how = HOW_SHORT;
			for (size_t i = 0; i < sizeof(errnos) / sizeof(errnos[0]); i++)
				if (!strcmp(f[2], errnos[i].name))
					u->how = errnos[i].e;
			if (!u->how) {
				log_line("unknown HOW '%s' for %s", f[2], f[0]);
				continue;
			}
		}
		u->kind = f[3] && !strcmp(f[3], "file") ? K_FILE
			: f[3] && !strcmp(f[3], "sock") ? K_SOCK : K_ANY;
		if (f[3] && (f[3][0] == '=' || !strncmp(f[3], ">=", 2))) {
			u->at_least = f[3][0] == '>';
			u->size = strtoul(f[3] + 1 + u->at_least, NULL, 10);
		}
		nrules++;
	}
}

static int fd_kind_ok(int kind, int fd)
{
	struct stat st;

	if (kind == K_ANY)
		return 1;
	if (fd <= 2)
		return 0; /* stdin, stdout, stderr: a log file is not what is tested */
	if (syscall(SYS_fstat, fd, &st))
		return 0;
	return kind == K_FILE ? S_ISREG(st.st_mode) : S_ISSOCK(st.st_mode);
}

/* From now on the calling thread's calls are neither failed nor counted:
 * for the coverage build's counter dumps (scripts/coverage.sh), which
 * allocate at exit and in a thread of their own, and would otherwise crash
 * on a fault meant for the program, or move which call the Nth is. */
void psfault_hold(void);
void psfault_hold(void)
{
	held = 1;
}

/* The rule that fails this call of func (on fd, or -1; an allocation of
 * size bytes), or NULL. Also names the call in *nth for the log. */
static struct rule *hit_sized(const char *func, int fd, size_t size, long *nth)
{
	pthread_once(&parsed, parse);
	if (!__atomic_load_n(&armed, __ATOMIC_ACQUIRE) || in_stack || held)
		return NULL;
	for (int i = 0; i < nrules; i++) {
		struct rule *u = &rules[i];
		int alloc = !strcmp(u->func, "alloc") &&
			    strstr("malloc calloc realloc posix_memalign aligned_alloc", func);
		long c;

		if (!alloc && strcmp(u->func, func))
			continue;
		if (fd >= 0 && !fd_kind_ok(u->kind, fd))
			continue;
		if (u->size && (u->at_least ? size < u->size : size != u->size))
			continue;
		c = __atomic_add_fetch(&u->calls, 1, __ATOMIC_RELAXED);
		if (c == u->n || (u->every && c > u->n)) {
			*nth = c;
			return u;
		}
	}
	return NULL;
}

static struct rule *hit(const char *func, int fd, long *nth)
{
	return hit_sized(func, fd, 0, nth);
}

/* The write to stderr that carries the marker arms the counting. */
static void see_stderr(int fd, const void *b, size_t n)
{
	if (fd != 2 || !marker[0] || __atomic_load_n(&armed, __ATOMIC_ACQUIRE))
		return;
	if (memmem(b, n, marker, strlen(marker))) {
		__atomic_store_n(&armed, 1, __ATOMIC_RELEASE);
		log_line("armed by '%s'", marker);
	}
}

#define REAL(ret, name, ...)                                                   \
	static ret (*real_##name)(__VA_ARGS__);                                \
	if (!real_##name)                                                      \
		real_##name = (ret(*)(__VA_ARGS__))dlsym(RTLD_NEXT, #name)

/* ---- allocations ---- */

/* 1 when this allocation is failed (errno set), 0 to make it. */
static int alloc_fault(const char *func, size_t n)
{
	long nth;
	struct rule *u = hit_sized(func, -1, n, &nth);

	if (!u)
		return 0;
	log_line("%s call %ld (%zu bytes): %s", func, nth, n, how_name(u->how));
	log_stack();
	errno = u->how == HOW_SHORT ? ENOMEM : u->how;
	return 1;
}

void *malloc(size_t n)
{
	return alloc_fault("malloc", n) ? NULL : __libc_malloc(n);
}

void *calloc(size_t k, size_t n)
{
	return alloc_fault("calloc", k * n) ? NULL : __libc_calloc(k, n);
}

void *realloc(void *p, size_t n)
{
	return alloc_fault("realloc", n) ? NULL : __libc_realloc(p, n);
}

int posix_memalign(void **p, size_t align, size_t n)
{
	if (alloc_fault("posix_memalign", n))
		return ENOMEM;
	*p = __libc_memalign(align, n);
	return *p ? 0 : ENOMEM;
}

void *aligned_alloc(size_t align, size_t n)
{
	return alloc_fault("aligned_alloc", n) ? NULL : __libc_memalign(align, n);
}

/* ---- calls on descriptors ---- */

/* 1 when the call is failed (errno set), 0 to make it (with *len halved
 * for a short fault). */
static int io_fault(const char *func, int fd, size_t *len)
{
	long nth;
	struct rule *u = hit(func, fd, &nth);

	if (!u)
		return 0;
	if (u->how == HOW_SHORT && len && *len > 1) {
		log_line("%s call %ld (fd %d, %zu bytes): short, %zu bytes", func, nth, fd, *len,
			 *len / 2);
		*len /= 2;
		return 0;
	}
	log_line("%s call %ld (fd %d, %zu bytes): %s", func, nth, fd, len ? *len : 0,
		 u->how == HOW_SHORT ? "EIO" : how_name(u->how));
	log_stack();
	errno = u->how == HOW_SHORT ? EIO : u->how;
	return 1;
}

/* Cuts an iovec array to len bytes in total (a copy in out). */
static int cut_iov(const struct iovec *iov, int n, size_t len, struct iovec *out)
{
	int k = 0;

	for (int i = 0; i < n && len > 0 && k < 1024; i++, k++) {
		out[k] = iov[i];
		if (out[k].iov_len > len)
			out[k].iov_len = len;
		len -= out[k].iov_len;
	}
	return k;
}

static size_t iov_len(const struct iovec *iov, int n)
{
	size_t t = 0;

	for (int i = 0; i < n; i++)
		t += iov[i].iov_len;
	return t;
}

ssize_t write(int fd, const void *b, size_t n)
{
	REAL(ssize_t, write, int, const void *, size_t);
	see_stderr(fd, b, n);
	if (io_fault("write", fd, &n))
		return -1;
	return real_write(fd, b, n);
}

ssize_t writev(int fd, const struct iovec *iov, int n)
{
	REAL(ssize_t, writev, int, const struct iovec *, int);
	size_t len = iov_len(iov, n), want = len;
	struct iovec cut[1024];

	if (io_fault("writev", fd, &len))
		return -1;
	if (len < want && n <= 1024)
		return real_writev(fd, cut, cut_iov(iov, n, len, cut));
	return real_writev(fd, iov, n);
}

ssize_t pwrite(int fd, const void *b, size_t n, off_t off)
{
	REAL(ssize_t, pwrite, int, const void *, size_t, off_t);
	if (io_fault("pwrite", fd, &n))
		return -1;
	return real_pwrite(fd, b, n, off);
}

ssize_t read(int fd, void *b, size_t n)
{
	REAL(ssize_t, read, int, void *, size_t);
	if (io_fault("read", fd, &n))
		return -1;
	return real_read(fd, b, n);
}

ssize_t readv(int fd, const struct iovec *iov, int n)
{
	REAL(ssize_t, readv, int, const struct iovec *, int);
	size_t len = iov_len(iov, n), want = len;
	struct iovec cut[1024];

	if (io_fault("readv", fd, &len))
		return -1;
	if (len < want && n <= 1024)
		return real_readv(fd, cut, cut_iov(iov, n, len, cut));
	return real_readv(fd, iov, n);
}

ssize_t pread(int fd, void *b, size_t n, off_t off)
{
	REAL(ssize_t, pread, int, void *, size_t, off_t);
	if (io_fault("pread", fd, &n))
		return -1;
	return real_pread(fd, b, n, off);
}

ssize_t recv(int fd, void *b, size_t n, int flags)
{
	REAL(ssize_t, recv, int, void *, size_t, int);
	if (io_fault("recv", fd, &n))
		return -1;
	return real_recv(fd, b, n, flags);
}

ssize_t sendmsg(int fd, const struct msghdr *m, int flags)
{
	REAL(ssize_t, sendmsg, int, const struct msghdr *, int);
	size_t len = iov_len(m->msg_iov, (int)m->msg_iovlen), want = len;
	struct iovec cut[1024];

	if (io_fault("sendmsg", fd, &len))
		return -1;
	if (len < want && m->msg_iovlen <= 1024) {
		struct msghdr c = *m;
		c.msg_iov = cut;
		c.msg_iovlen = (size_t)cut_iov(m->msg_iov, (int)m->msg_iovlen, len, cut);
		return real_sendmsg(fd, &c, flags);
	}
	return real_sendmsg(fd, m, flags);
}

int fsync(int fd)
{
	REAL(int, fsync, int);
	if (io_fault("fsync", fd, NULL))
		return -1;
	return real_fsync(fd);
}

int fdatasync(int fd)
{
	REAL(int, fdatasync, int);
	if (io_fault("fdatasync", fd, NULL))
		return -1;
	return real_fdatasync(fd);
}

int open(const char *path, int flags, ...)
{
	REAL(int, open, const char *, int, ...);
	mode_t mode = 0;
	long nth;
	struct rule *u;

	if (flags & (O_CREAT | __O_TMPFILE)) {
		va_list ap;
		va_start(ap, flags);
		mode = (mode_t)va_arg(ap, int);
		va_end(ap);
	}
	if ((u = hit("open", -1, &nth))) {
		log_line("open call %ld (%s): %s", nth, path, how_name(u->how));
		errno = u->how == HOW_SHORT ? EIO : u->how;
		return -1;
	}
	return real_open(path, flags, mode);
}

int openat(int dfd, const char *path, int flags, ...)
{
	REAL(int, openat, int, const char *, int, ...);
	mode_t mode = 0;
	long nth;
	struct rule *u;

	if (flags & (O_CREAT | __O_TMPFILE)) {
		va_list ap;
		va_start(ap, flags);
		mode = (mode_t)va_arg(ap, int);
		va_end(ap);
	}
	if ((u = hit("openat", -1, &nth))) {
		log_line("openat call %ld (%s): %s", nth, path, how_name(u->how));
		errno = u->how == HOW_SHORT ? EIO : u->how;
		return -1;
	}
	return real_openat(dfd, path, flags, mode);
}

int rename(const char *from, const char *to)
{
	REAL(int, rename, const char *, const char *);
	long nth;
	struct rule *u = hit("rename", -1, &nth);

	if (u) {
		log_line("rename call %ld (%s): %s", nth, to, how_name(u->how));
		errno = u->how == HOW_SHORT ? EIO : u->how;
		return -1;
	}
	return real_rename(from, to);
}

int memfd_create(const char *name, unsigned int flags)
{
	REAL(int, memfd_create, const char *, unsigned int);
	long nth;
	struct rule *u = hit("memfd_create", -1, &nth);

	if (u) {
		log_line("memfd_create call %ld (%s): %s", nth, name, how_name(u->how));
		errno = u->how == HOW_SHORT ? EIO : u->how;
		return -1;
	}
	return real_memfd_create(name, flags);
}

int pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
	REAL(int, pthread_create, pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
	long nth;
	struct rule *u = hit("pthread_create", -1, &nth);

	if (u) {
		log_line("pthread_create call %ld: %s", nth, how_name(u->how));
		return u->how == HOW_SHORT ? EAGAIN : u->how;
	}
	return real_pthread_create(th, attr, fn, arg);
}

/* ---- verbs ---- */

/* rdma-core's verbs.h turns ibv_reg_mr with constant access flags (all of
 * transport_rdma.c's) into a call of this symbol. Declared here without
 * verbs.h: this library links no libibverbs; a program that has it gets
 * the real one through dlsym. A fault returns NULL with errno set, as
 * verbs does. */
void *ibv_reg_mr(void *pd, void *addr, size_t length, int access);
void *ibv_reg_mr(void *pd, void *addr, size_t length, int access)
{
	REAL(void *, ibv_reg_mr, void *, void *, size_t, int);
	long nth;
	struct rule *u = hit_sized("ibv_reg_mr", -1, length, &nth);

	if (u) {
		log_line("ibv_reg_mr call %ld (%zu bytes): %s", nth, length, how_name(u->how));
		log_stack();
		errno = u->how == HOW_SHORT ? ENOMEM : u->how;
		return NULL;
	}
	if (!real_ibv_reg_mr) {
		errno = ENOSYS;
		return NULL;
	}
	return real_ibv_reg_mr(pd, addr, length, access);
}

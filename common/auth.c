/* auth.c - loading the cluster secret and the replication key; proofs and
 * session keys of the handshake (auth.h). BLAKE2b (crypto_generichash) throughout, keyed with
 * the secret's hash, each use under its own label. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <sodium.h>
#include "auth.h"
#include "ps_err.h"

/* sodium_init is idempotent and thread-safe; it fails only when the
 * system has no random source at all. */
static void ensure_init(void)
{
	if (sodium_init() < 0)
		abort();
}

void ps_auth_secret_path(const struct ps_config *cfg, char *out, size_t outlen)
{
	const char *f = cfg->security.secret_file, *env = getenv("PS_SECRET_FILE");

	snprintf(out, outlen, "%s", f[0] ? f : env ? env : "");
}

int ps_auth_set_secret_file(struct ps_config *cfg, const char *path)
{
	char cwd[512];
	int n;

	/* made absolute, so a config dumped elsewhere (ps-bench --local) still
	 * names the same file */
	if (path[0] == '/' || !getcwd(cwd, sizeof(cwd)))
		n = snprintf(cfg->security.secret_file, sizeof(cfg->security.secret_file), "%s",
			     path);
	else
		n = snprintf(cfg->security.secret_file, sizeof(cfg->security.secret_file), "%s/%s",
			     cwd, path);
	return n < (int)sizeof(cfg->security.secret_file) ? 0 : -ENAMETOOLONG;
}

static int all_hex(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f') ||
		      (p[i] >= 'A' && p[i] <= 'F')))
			return 0;
	return 1;
}

/* Whether a secret looks random, as ps-keygen's is: enough distinct
 * symbols (hex digits case-insensitively, else bytes) and few repeated
 * pairs of neighbours. Keygen output passes with overwhelming probability
 * (64 random hex digits show about 16 distinct digits and 56 distinct
 * pairs of 63; the bounds are 10 and 60%); "aaaa...", a repeated short
 * pattern or a word typed twice does not. A heuristic: it refuses the
 * obvious, it cannot prove randomness. */
static int looks_random(const uint8_t *p, size_t n, int hex)
{
	uint64_t seen[256 / 64] = { 0 }, pair[65536 / 64] = { 0 };
	int sym = 0, pairs = 0;
	unsigned prev = 0;

	for (size_t i = 0; i < n; i++) {
		unsigned c = hex && p[i] >= 'A' && p[i] <= 'F' ? p[i] + 32u : p[i], bp = prev << 8 | c;
		sym += !(seen[c / 64] >> (c % 64) & 1);
		seen[c / 64] |= UINT64_C(1) << (c % 64);
		if (i) {
			pairs += !(pair[bp / 64] >> (bp % 64) & 1);
			pair[bp / 64] |= UINT64_C(1) << (bp % 64);
		}
		prev = c;
	}
	return sym >= (hex ? 10 : 16) && (size_t)pairs * 10 >= (n - 1) * 6;
}

/* Reads and checks a key file (what: "secret file" or "replication key
 * file", for the messages) into buf; *len its bytes without a trailing
 * newline. 0 or PS_EAUTH with the reason in err. */
static int read_key_file(const char *path, const char *what, uint8_t buf[PS_SECRET_MAX_BYTES + 1],
			 size_t *lenp, char *err, size_t errlen)
{
	struct stat st;
	ssize_t n;
	size_t len = 0;
	int fd, rc = PS_EAUTH;

	ensure_init();
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		snprintf(err, errlen, "%s %s: %s (create one with scripts/ps-keygen %s)", what,
			 path, strerror(errno), path);
		return PS_EAUTH;
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		snprintf(err, errlen, "%s %s: not a regular file", what, path);
		goto out;
	}
	if (st.st_mode & 077) {
		snprintf(err, errlen, "%s %s has mode %04o: others may read it; it must "
			 "be 0600 or stricter (chmod 600 %s)", what, path,
			 (unsigned)(st.st_mode & 07777), path);
		goto out;
	}
	while (len < PS_SECRET_MAX_BYTES + 1 &&
	       (n = read(fd, buf + len, PS_SECRET_MAX_BYTES + 1 - len)) != 0) {
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			snprintf(err, errlen, "%s %s: %s", what, path, strerror(errno));
			goto out;
		}
		len += (size_t)n;
	}
	if (len > PS_SECRET_MAX_BYTES) {
		snprintf(err, errlen, "%s %s is longer than %d bytes; is it the right file?", what,
			 path, PS_SECRET_MAX_BYTES);
		goto out;
	}
	while (len && (buf[len - 1] == '\n' || buf[len - 1] == '\r' || buf[len - 1] == ' '))
		len--; /* a text editor's newline is not part of the secret */
	if (len < PS_SECRET_MIN_BYTES || (all_hex(buf, len) && len < 2 * PS_SECRET_MIN_BYTES)) {
		snprintf(err, errlen, "%s %s holds %zu %s; it needs at least %d random "
			 "bytes (%d hex digits): scripts/ps-keygen writes one", what, path, len,
			 all_hex(buf, len) && len ? "hex digits" : "bytes", PS_SECRET_MIN_BYTES,
			 2 * PS_SECRET_MIN_BYTES);
		goto out;
	}
	if (!looks_random(buf, len, all_hex(buf, len))) {
		snprintf(err, errlen, "%s %s does not look random (its characters repeat); "
			 "a guessable secret lets anyone who sees one handshake find it offline: "
			 "scripts/ps-keygen writes a random one", what, path);
		goto out;
	}
	*lenp = len;
	rc = 0;
out:
	close(fd);
	return rc;
}

int ps_auth_load_secret_file(const char *path, uint8_t key[PS_AUTH_KEY_LEN], char *err,
			     size_t errlen)
{
	uint8_t buf[PS_SECRET_MAX_BYTES + 1];
	size_t len = 0;
	int rc = read_key_file(path, "secret file", buf, &len, err, errlen);

	if (!rc)
		crypto_generichash(key, PS_AUTH_KEY_LEN, buf, len, (const uint8_t *)"ps-secret-v1", 12);
	sodium_memzero(buf, sizeof(buf));
	return rc;
}

void ps_auth_repl_key_path(const struct ps_config *cfg, char *out, size_t outlen)
{
	const char *f = cfg->security.repl_key_file, *env = getenv("PS_REPL_KEY_FILE");

	snprintf(out, outlen, "%s", f[0] ? f : env ? env : "");
}

int ps_auth_set_repl_key_file(struct ps_config *cfg, const char *path)
{
	char cwd[512];
	int n;

	if (path[0] == '/' || !getcwd(cwd, sizeof(cwd)))
		n = snprintf(cfg->security.repl_key_file, sizeof(cfg->security.repl_key_file), "%s",
			     path);
	else
		n = snprintf(cfg->security.repl_key_file, sizeof(cfg->security.repl_key_file),
			     "%s/%s", cwd, path);
	return n < (int)sizeof(cfg->security.repl_key_file) ? 0 : -ENAMETOOLONG;
}

int ps_auth_load_repl_key_file(const char *path, const uint8_t secret[PS_AUTH_KEY_LEN],
			       uint8_t key[PS_AUTH_KEY_LEN], char *err, size_t errlen)
{
	uint8_t buf[PS_SECRET_MAX_BYTES + 1], same[PS_AUTH_KEY_LEN];
	size_t len = 0;
	int rc = read_key_file(path, "replication key file", buf, &len, err, errlen);

	if (!rc && secret) {
		/* the cluster secret's bytes would give every worker the key */
		crypto_generichash(same, sizeof(same), buf, len, (const uint8_t *)"ps-secret-v1", 12);
		if (crypto_verify_32(same, secret) == 0) {
			snprintf(err, errlen, "replication key file %s holds the cluster secret; "
				 "workers and monitors hold that one: the replication key must be a "
				 "key of its own (scripts/ps-keygen FILE)", path);
			rc = PS_EAUTH;
		}
		sodium_memzero(same, sizeof(same));
	}
	if (!rc)
		crypto_generichash(key, PS_AUTH_KEY_LEN, buf, len, (const uint8_t *)"ps-replkey-v1",
				   13);
	sodium_memzero(buf, sizeof(buf));
	return rc;
}

int ps_auth_load_repl_key(const struct ps_config *cfg, const uint8_t secret[PS_AUTH_KEY_LEN],
			  uint8_t key[PS_AUTH_KEY_LEN], char *err, size_t errlen)
{
	char path[1100];

	ps_auth_repl_key_path(cfg, path, sizeof(path));
	if (!path[0]) {
		snprintf(err, errlen, "%s: cluster.replicas is 1 and security.auth is on, but no "
			 "replication key file is named: set security.repl_key_file (or "
			 "PS_REPL_KEY_FILE, or --repl-key-file) on the shard processes, and create "
			 "the file with scripts/ps-keygen FILE; workers and monitors do not get it",
			 cfg->path[0] ? cfg->path : "config");
		return PS_EAUTH;
	}
	return ps_auth_load_repl_key_file(path, secret, key, err, errlen);
}

void ps_auth_reader_key_path(const struct ps_config *cfg, char *out, size_t outlen)
{
	const char *f = cfg->security.reader_key_file, *env = getenv("PS_READER_KEY_FILE");

	snprintf(out, outlen, "%s", f[0] ? f : env ? env : "");
}

int ps_auth_set_reader_key_file(struct ps_config *cfg, const char *path)
{
	char cwd[512];
	int n;

	if (path[0] == '/' || !getcwd(cwd, sizeof(cwd)))
		n = snprintf(cfg->security.reader_key_file, sizeof(cfg->security.reader_key_file),
			     "%s", path);
	else
		n = snprintf(cfg->security.reader_key_file, sizeof(cfg->security.reader_key_file),
			     "%s/%s", cwd, path);
	return n < (int)sizeof(cfg->security.reader_key_file) ? 0 : -ENAMETOOLONG;
}

int ps_auth_load_reader_key_file(const char *path, const uint8_t secret[PS_AUTH_KEY_LEN],
				 uint8_t key[PS_AUTH_KEY_LEN], char *err, size_t errlen)
{
	uint8_t buf[PS_SECRET_MAX_BYTES + 1], same[PS_AUTH_KEY_LEN];
	size_t len = 0;
	int rc = read_key_file(path, "reader key file", buf, &len, err, errlen);

	if (!rc && secret) {
		/* a reader holding the cluster secret could push: the two differ */
		crypto_generichash(same, sizeof(same), buf, len, (const uint8_t *)"ps-secret-v1", 12);
		if (crypto_verify_32(same, secret) == 0) {
			snprintf(err, errlen, "reader key file %s holds the cluster secret; the reader "
				 "key must be a key of its own (scripts/ps-keygen FILE), so that a "
				 "reader cannot act as a worker", path);
			rc = PS_EAUTH;
		}
		sodium_memzero(same, sizeof(same));
	}
	if (!rc)
		crypto_generichash(key, PS_AUTH_KEY_LEN, buf, len, (const uint8_t *)"ps-readerkey-v1",
				   15);
	sodium_memzero(buf, sizeof(buf));
	return rc;
}

int ps_auth_load_reader_key(const struct ps_config *cfg, const uint8_t secret[PS_AUTH_KEY_LEN],
			    uint8_t key[PS_AUTH_KEY_LEN], char *err, size_t errlen)
{
	char path[1100];

	ps_auth_reader_key_path(cfg, path, sizeof(path));
	if (!path[0]) {
		snprintf(err, errlen, "%s: a reader with security.auth on needs the reader key: set "
			 "security.reader_key_file (or PS_READER_KEY_FILE, or --reader-key-file) "
			 "to the file the shards use (scripts/ps-keygen FILE makes one)",
			 cfg->path[0] ? cfg->path : "config");
		return PS_EAUTH;
	}
	return ps_auth_load_reader_key_file(path, secret, key, err, errlen);
}

int ps_auth_load_secret(const struct ps_config *cfg, uint8_t key[PS_AUTH_KEY_LEN], char *err,
			size_t errlen)
{
	char path[1100];

	ps_auth_secret_path(cfg, path, sizeof(path));
	if (!path[0]) {
		snprintf(err, errlen, "%s: security.auth is on but no secret file is named: set "
			 "security.secret_file (or PS_SECRET_FILE, or --secret-file), create the "
			 "file with scripts/ps-keygen FILE, or set security.auth: false on a "
			 "trusted network", cfg->path[0] ? cfg->path : "config");
		return PS_EAUTH;
	}
	return ps_auth_load_secret_file(path, key, err, errlen);
}

void ps_auth_random(uint8_t *p, size_t n)
{
	ensure_init();
	randombytes_buf(p, n);
}

void ps_auth_transcript(const uint8_t *hello, size_t hello_len,
			const uint8_t snonce[PS_AUTH_NONCE_LEN], uint8_t t[32])
{
	crypto_generichash_state st;

	ensure_init();
	crypto_generichash_init(&st, (const uint8_t *)"ps-transcript-v1", 16, 32);
	crypto_generichash_update(&st, hello, hello_len);
	crypto_generichash_update(&st, snonce, PS_AUTH_NONCE_LEN);
	crypto_generichash_final(&st, t, 32);
}

/* BLAKE2b(key; label || t) */
static void labelled(const uint8_t key[PS_AUTH_KEY_LEN], const char *label, const uint8_t t[32],
		     uint8_t *out, size_t outlen)
{
	crypto_generichash_state st;

	crypto_generichash_init(&st, key, PS_AUTH_KEY_LEN, outlen);
	crypto_generichash_update(&st, (const uint8_t *)label, strlen(label) + 1);
	crypto_generichash_update(&st, t, 32);
	crypto_generichash_final(&st, out, outlen);
}

void ps_auth_proof(const uint8_t key[PS_AUTH_KEY_LEN], const uint8_t t[32], int from_server,
		   uint8_t proof[PS_AUTH_PROOF_LEN])
{
	ensure_init();
	labelled(key, from_server ? "proof server" : "proof client", t, proof, PS_AUTH_PROOF_LEN);
}

void ps_auth_repl_proof(const uint8_t key[PS_AUTH_KEY_LEN], const uint8_t t[32], int from_server,
			uint8_t proof[PS_AUTH_PROOF_LEN])
{
	ensure_init();
	labelled(key, from_server ? "replication proof server" : "replication proof client", t,
		 proof, PS_AUTH_PROOF_LEN);
}

void ps_auth_reader_proof(const uint8_t key[PS_AUTH_KEY_LEN], const uint8_t t[32],
			  int from_server, uint8_t proof[PS_AUTH_PROOF_LEN])
{
	ensure_init();
	labelled(key, from_server ? "reader proof server" : "reader proof client", t, proof,
		 PS_AUTH_PROOF_LEN);
}

/* repl: 0 the cluster secret's proofs, 1 the replication key's, 2 the
 * reader key's */
static int proof_ok(const uint8_t key[PS_AUTH_KEY_LEN], const uint8_t t[32], int from_server,
		    int repl, const uint8_t *proof, size_t len)
{
	uint8_t want[PS_AUTH_PROOF_LEN];
	int ok;

	if (len != PS_AUTH_PROOF_LEN || !proof)
		return 0;
	if (repl == 2)
		ps_auth_reader_proof(key, t, from_server, want);
	else if (repl)
		ps_auth_repl_proof(key, t, from_server, want);
	else
		ps_auth_proof(key, t, from_server, want);
	ok = crypto_verify_32(want, proof) == 0;
	sodium_memzero(want, sizeof(want));
	return ok;
}

int ps_auth_proof_ok(const uint8_t key[PS_AUTH_KEY_LEN], const uint8_t t[32], int from_server,
		     const uint8_t *proof, size_t len)
{
	return proof_ok(key, t, from_server, 0, proof, len);
}

int ps_auth_repl_proof_ok(const uint8_t key[PS_AUTH_KEY_LEN], const uint8_t t[32],
			  int from_server, const uint8_t *proof, size_t len)
{
	return proof_ok(key, t, from_server, 1, proof, len);
}

int ps_auth_reader_proof_ok(const uint8_t key[PS_AUTH_KEY_LEN], const uint8_t t[32],
			    int from_server, const uint8_t *proof, size_t len)
{
	return proof_ok(key, t, from_server, 2, proof, len);
}

int ps_auth_cipher(const struct ps_security_cfg *sec)
{
	return sec->encrypt ? sec->cipher : -1;
}

static void session_keys(const uint8_t key[PS_AUTH_KEY_LEN], const uint8_t t[32], int server,
			 const char *c2s_label, const char *s2c_label, struct ps_frame_keys *out)
{
	uint8_t c2s[PS_MAC_KEY_LEN], s2c[PS_MAC_KEY_LEN];

	ensure_init();
	labelled(key, c2s_label, t, c2s, sizeof(c2s));
	labelled(key, s2c_label, t, s2c, sizeof(s2c));
	memcpy(out->send, server ? s2c : c2s, PS_MAC_KEY_LEN);
	memcpy(out->recv, server ? c2s : s2c, PS_MAC_KEY_LEN);
	out->cipher = -1; /* MACs; the caller sets the cipher of security.encrypt */
	sodium_memzero(c2s, sizeof(c2s));
	sodium_memzero(s2c, sizeof(s2c));
}

void ps_auth_session_keys(const uint8_t key[PS_AUTH_KEY_LEN], const uint8_t t[32], int server,
			  struct ps_frame_keys *out)
{
	session_keys(key, t, server, "frames client to server", "frames server to client", out);
}

void ps_auth_repl_session_keys(const uint8_t key[PS_AUTH_KEY_LEN], const uint8_t t[32],
			       int server, struct ps_frame_keys *out)
{
	session_keys(key, t, server, "replication frames client to server",
		     "replication frames server to client", out);
}

void ps_auth_reader_session_keys(const uint8_t key[PS_AUTH_KEY_LEN], const uint8_t t[32],
				 int server, struct ps_frame_keys *out)
{
	session_keys(key, t, server, "reader frames client to server",
		     "reader frames server to client", out);
}

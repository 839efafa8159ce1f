/* check_auth.c - the cluster secret file rules, the handshake's proofs and
 * session keys, and frame MACs (common/auth.c, common/frame_mac.c). */
#include <check.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sodium.h>
#include "auth.h"
#include "frame_mac.h"
#include "ps_err.h"
#include "test_util.h"

/* Writes n bytes to a new file of the given mode; path gets its name. */
static void put_file(char *path, const void *b, size_t n, mode_t mode)
{
	strcpy(path, "/tmp/ps-check-auth-XXXXXX");
	int fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, b, n), (ssize_t)n);
	close(fd);
	ck_assert_int_eq(chmod(path, mode), 0);
}

/* ps_auth_load_secret_file's verdict on a file; the key when accepted. */
static int load(const void *b, size_t n, mode_t mode, uint8_t key[32], char *err, size_t errlen)
{
	char path[64];
	int rc;

	put_file(path, b, n, mode);
	rc = ps_auth_load_secret_file(path, key, err, errlen);
	unlink(path);
	return rc;
}

static const char hex64[] = "86deb2c054c63db9417be12c60daafa1e06c75b8a509eada163e67aa4fc1e3ee";

START_TEST(test_secret_rules)
{
	uint8_t k1[32], k2[32], bin[40];
	char err[512];

	/* accepted: 64 hex digits, with or without the newline an editor adds */
	ck_assert_int_eq(load(hex64, 64, 0600, k1, err, sizeof(err)), 0);
	ck_assert_int_eq(load("86deb2c054c63db9417be12c60daafa1e06c75b8a509eada163e67aa4fc1e3ee\n",
			      65, 0400, k2, err, sizeof(err)), 0);
	ck_assert_mem_eq(k1, k2, 32);
	/* trailing blanks an editor may leave are not part of it either */
	ck_assert_int_eq(load("86deb2c054c63db9417be12c60daafa1e06c75b8a509eada163e67aa4fc1e3ee \r\n ",
			      68, 0600, k2, err, sizeof(err)), 0);
	ck_assert_mem_eq(k1, k2, 32);
	/* a successful read is not taken for an interrupted one whatever errno
	 * held before (a read error is retried only when it says EINTR) */
	errno = EINTR;
	ck_assert_int_eq(load(hex64, 64, 0600, k2, err, sizeof(err)), 0);
	ck_assert_mem_eq(k1, k2, 32);
	/* another secret, another key */
	ck_assert_int_eq(load("1a9f4c897c606055459ffa22e9c4e55cd862511dd261da8183c0414d5edfad0d",
			      64, 0600, k2, err, sizeof(err)), 0);
	ck_assert(memcmp(k1, k2, 32) != 0);
	/* long enough but not random: one digit, a short pattern repeated, the
	 * same 32 bytes twice (a word typed twice) */
	static const char *weak[] = {
		"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
		"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
		"password-password-password-password-password",
		/* nine distinct digits only (its pairs vary enough: 43 of 63) */
		"4580730215736813036426212722003322453832364056224154051454752772",
		/* nine again, three of them letters, each repeated (all 63 pairs
		 * differ): symbols past 63 are counted as carefully as digits */
		"aa0aca1aea2a3a4a500c010e02030405cc1cec2c3c4c511e12131415ee2e3e4e",
	};
	for (size_t i = 0; i < sizeof(weak) / sizeof(weak[0]); i++) {
		ck_assert_int_eq(load(weak[i], strlen(weak[i]), 0600, k2, err, sizeof(err)), PS_EAUTH);
		ck_assert_msg(strstr(err, "does not look random") && strstr(err, "ps-keygen"), "%s",
			      err);
	}
	/* what ps-keygen writes always passes (1,000 fresh ones) */
	for (int i = 0; i < 1000; i++) {
		uint8_t r[32];
		char hx[65];
		ps_auth_random(r, sizeof(r));
		for (int j = 0; j < 32; j++)
			snprintf(hx + 2 * j, 3, "%02x", r[j]);
		ck_assert_msg(load(hx, 64, 0600, k2, err, sizeof(err)) == 0, "%s: %s", hx, err);
	}
	/* 32 binary bytes are enough; 32 hex digits (16 bytes) are not */
	for (int i = 0; i < 40; i++)
		bin[i] = (uint8_t)(i * 37 + 200);
	ck_assert_int_eq(load(bin, 32, 0600, k2, err, sizeof(err)), 0);
	ck_assert_int_eq(load(bin, 31, 0600, k2, err, sizeof(err)), PS_EAUTH);
	ck_assert_msg(strstr(err, "holds 31 bytes") && strstr(err, "at least 32"), "%s", err);
	ck_assert_int_eq(load(hex64, 32, 0600, k2, err, sizeof(err)), PS_EAUTH);
	ck_assert_msg(strstr(err, "holds 32 hex digits") && strstr(err, "64 hex digits"), "%s", err);
	ck_assert_int_eq(load("", 0, 0600, k2, err, sizeof(err)), PS_EAUTH);
	/* permissions: nobody but the owner */
	ck_assert_int_eq(load(hex64, 64, 0640, k2, err, sizeof(err)), PS_EAUTH);
	ck_assert_msg(strstr(err, "mode 0640") && strstr(err, "chmod 600"), "%s", err);
	ck_assert_int_eq(load(hex64, 64, 0604, k2, err, sizeof(err)), PS_EAUTH);
	ck_assert_int_eq(load(hex64, 64, 0660, k2, err, sizeof(err)), PS_EAUTH);
	/* not there, a folder, too big */
	ck_assert_int_eq(ps_auth_load_secret_file("/nonexistent/ps.secret", k2, err, sizeof(err)),
			 PS_EAUTH);
	ck_assert_msg(strstr(err, "/nonexistent/ps.secret") && strstr(err, "No such file") &&
		      strstr(err, "ps-keygen"), "%s", err);
	char dir[64] = "/tmp/ps-check-auth-dir-XXXXXX";
	ck_assert_ptr_nonnull(mkdtemp(dir));
	chmod(dir, 0700);
	ck_assert_int_eq(ps_auth_load_secret_file(dir, k2, err, sizeof(err)), PS_EAUTH);
	ck_assert_msg(strstr(err, "not a regular file"), "%s", err);
	rmdir(dir);
	static char big[PS_SECRET_MAX_BYTES + 10];
	memset(big, 'x', sizeof(big));
	ck_assert_int_eq(load(big, sizeof(big), 0600, k2, err, sizeof(err)), PS_EAUTH);
	ck_assert_msg(strstr(err, "longer than"), "%s", err);
	/* a read error is reported, not retried: /proc/self/mem is a regular
	 * file of mode 0600 whose first page is unmapped, so read() fails
	 * with EIO (a loop retrying every error, not only EINTR, would hang
	 * here until the test's timeout) */
	if (access("/proc/self/mem", R_OK) == 0) {
		ck_assert_int_eq(ps_auth_load_secret_file("/proc/self/mem", k2, err, sizeof(err)),
				 PS_EAUTH);
		ck_assert_msg(strstr(err, "/proc/self/mem") && strstr(err, "Input/output error"),
			      "%s", err);
	}
}
END_TEST

/* Where the secret comes from: the config's file (relative to the config
 * file's folder), else $PS_SECRET_FILE, and none at all is an error. */
START_TEST(test_secret_path)
{
	struct ps_config cfg;
	char path[1100], err[1024], cfgpath[64];
	uint8_t k[32];

	ck_assert_int_eq(tu_write_temp(cfgpath, "cluster:\n  servers: [127.0.0.1:1]\n  workers: 1\n"
				       "model:\n  tensors:\n    - {name: a, shape: [1]}\n"
				       "security:\n  secret_file: keys/ps.secret\n"), 0);
	ck_assert_int_eq(ps_config_load(&cfg, cfgpath, err, sizeof(err)), 0);
	ps_auth_secret_path(&cfg, path, sizeof(path));
	ck_assert_str_eq(path, "/tmp/keys/ps.secret");
	/* a config loaded by a relative path: made absolute, so a dump of it
	 * written into another folder (ps.sbatch) names the same file */
	char here[1024];
	ck_assert_ptr_nonnull(getcwd(here, sizeof(here)));
	ck_assert_int_eq(chdir("/tmp"), 0);
	ck_assert_int_eq(ps_config_load(&cfg, cfgpath + strlen("/tmp/"), err, sizeof(err)), 0);
	ck_assert_int_eq(chdir(here), 0);
	ck_assert_str_eq(cfg.security.secret_file, "/tmp/keys/ps.secret");
	unlink(cfgpath);
	ck_assert_int_eq(ps_auth_set_secret_file(&cfg, "/etc/ps/secret"), 0);
	ps_auth_secret_path(&cfg, path, sizeof(path));
	ck_assert_str_eq(path, "/etc/ps/secret");
	ck_assert_int_eq(ps_auth_set_secret_file(&cfg, "rel.secret"), 0);
	ck_assert(cfg.security.secret_file[0] == '/'); /* made absolute */
	cfg.security.secret_file[0] = 0;
	setenv("PS_SECRET_FILE", "/run/x", 1);
	ps_auth_secret_path(&cfg, path, sizeof(path));
	ck_assert_str_eq(path, "/run/x");
	unsetenv("PS_SECRET_FILE");
	ck_assert_int_eq(ps_auth_load_secret(&cfg, k, err, sizeof(err)), PS_EAUTH);
	ck_assert_msg(strstr(err, "no secret file is named") && strstr(err, "security.auth: false"),
		      "%s", err);
}
END_TEST

/* Proofs: each side's proof checks only under the same key, transcript
 * and role; session keys pair up (one side's send is the other's recv)
 * and differ by direction and by handshake. */
START_TEST(test_proofs_and_keys)
{
	uint8_t key[32], other[32], n1[32], n2[32], t1[32], t2[32], p[32];
	const uint8_t hello[] = "hello bytes";
	struct ps_frame_keys srv, cli, cli2;

	memset(key, 7, sizeof(key));
	memset(other, 7, sizeof(other));
	other[31] = 8;
	ps_auth_random(n1, sizeof(n1));
	ps_auth_random(n2, sizeof(n2));
	ck_assert(memcmp(n1, n2, 32) != 0);
	ps_auth_transcript(hello, sizeof(hello), n1, t1);
	ps_auth_transcript(hello, sizeof(hello), n2, t2);
	ck_assert(memcmp(t1, t2, 32) != 0);
	ps_auth_proof(key, t1, 1, p);
	ck_assert(ps_auth_proof_ok(key, t1, 1, p, 32));
	ck_assert(!ps_auth_proof_ok(key, t1, 0, p, 32));     /* the client's is another */
	ck_assert(!ps_auth_proof_ok(other, t1, 1, p, 32));   /* another secret */
	ck_assert(!ps_auth_proof_ok(key, t2, 1, p, 32));     /* a replay into a new handshake */
	ck_assert(!ps_auth_proof_ok(key, t1, 1, p, 31));     /* short */
	ck_assert(!ps_auth_proof_ok(key, t1, 1, NULL, 32));
	p[0] ^= 1;
	ck_assert(!ps_auth_proof_ok(key, t1, 1, p, 32));
	ps_auth_session_keys(key, t1, 1, &srv);
	ps_auth_session_keys(key, t1, 0, &cli);
	ps_auth_session_keys(key, t2, 0, &cli2);
	ck_assert_mem_eq(srv.send, cli.recv, 32);
	ck_assert_mem_eq(srv.recv, cli.send, 32);
	ck_assert(memcmp(cli.send, cli.recv, 32) != 0);
	ck_assert(memcmp(cli.send, cli2.send, 32) != 0);
}
END_TEST

/* The replication key: a file under the secret's rules, its messages
 * naming the replication key file; refused when it holds the cluster
 * secret; found like the secret (config, then $PS_REPL_KEY_FILE); its
 * proofs and frame keys never pass for the secret's, even over the same
 * key bytes and transcript. */
START_TEST(test_repl_key)
{
	static const char hex64b[] =
		"3f9a01c7e2b84d56a0f1937c5e2d8b64190ace7d3b5f2864c0e9a7d1b3f5062e";
	uint8_t secret[32], k[32], k2[32], t[32], n[32], p[32];
	struct ps_frame_keys a, b;
	struct ps_config cfg;
	char path[64], spath[64], got[1100], err[1024];

	put_file(spath, hex64, 64, 0600);
	ck_assert_int_eq(ps_auth_load_secret_file(spath, secret, err, sizeof(err)), 0);
	/* the secret's own bytes: refused, naming why */
	ck_assert_int_eq(ps_auth_load_repl_key_file(spath, secret, k, err, sizeof(err)), PS_EAUTH);
	ck_assert_msg(strstr(err, "holds the cluster secret") && strstr(err, spath), "%s", err);
	put_file(path, hex64b, 64, 0644);
	ck_assert_int_eq(ps_auth_load_repl_key_file(path, secret, k, err, sizeof(err)), PS_EAUTH);
	ck_assert_msg(strstr(err, "replication key file") && strstr(err, "mode 0644"), "%s", err);
	ck_assert_int_eq(chmod(path, 0600), 0);
	ck_assert_int_eq(ps_auth_load_repl_key_file(path, secret, k, err, sizeof(err)), 0);
	/* its hash is of its own domain: not the secret-file hash of the same bytes */
	ck_assert_int_eq(ps_auth_load_secret_file(path, k2, err, sizeof(err)), 0);
	ck_assert(memcmp(k, k2, 32) != 0);
	unlink(path);
	unlink(spath);

	ck_assert_int_eq(tu_write_temp(path, "cluster:\n  servers: [127.0.0.1:1]\n  backups: "
				       "[127.0.0.1:2]\n  replicas: 1\n  workers: 1\n"
				       "model:\n  tensors:\n    - {name: a, shape: [1]}\n"
				       "security:\n  repl_key_file: keys/ps.replkey\n"), 0);
	ck_assert_int_eq(ps_config_load(&cfg, path, err, sizeof(err)), 0);
	unlink(path);
	ps_auth_repl_key_path(&cfg, got, sizeof(got));
	ck_assert_str_eq(got, "/tmp/keys/ps.replkey");
	ck_assert_int_eq(ps_auth_set_repl_key_file(&cfg, "/etc/ps/repl-key"), 0);
	ps_auth_repl_key_path(&cfg, got, sizeof(got));
	ck_assert_str_eq(got, "/etc/ps/repl-key");
	cfg.security.repl_key_file[0] = 0;
	setenv("PS_REPL_KEY_FILE", "/run/r", 1);
	ps_auth_repl_key_path(&cfg, got, sizeof(got));
	ck_assert_str_eq(got, "/run/r");
	unsetenv("PS_REPL_KEY_FILE");
	ck_assert_int_eq(ps_auth_load_repl_key(&cfg, NULL, k, err, sizeof(err)), PS_EAUTH);
	ck_assert_msg(strstr(err, "no replication key file is named"), "%s", err);

	/* proof domains */
	ps_auth_random(n, sizeof(n));
	ps_auth_transcript((const uint8_t *)"hello", 5, n, t);
	for (int from_server = 0; from_server < 2; from_server++) {
		ps_auth_repl_proof(k, t, from_server, p);
		ck_assert(ps_auth_repl_proof_ok(k, t, from_server, p, 32));
		ck_assert(!ps_auth_proof_ok(k, t, from_server, p, 32));
		ck_assert(!ps_auth_repl_proof_ok(k, t, !from_server, p, 32));
		ps_auth_proof(k, t, from_server, p);
		ck_assert(!ps_auth_repl_proof_ok(k, t, from_server, p, 32));
	}
	ps_auth_repl_session_keys(k, t, 1, &a);
	ps_auth_repl_session_keys(k, t, 0, &b);
	ck_assert_mem_eq(a.send, b.recv, 32);
	ck_assert_mem_eq(a.recv, b.send, 32);
	ps_auth_session_keys(k, t, 1, &b);
	ck_assert(memcmp(a.send, b.send, 32) != 0 && memcmp(a.recv, b.recv, 32) != 0);
}
END_TEST

/* The reader key: refused when it holds the cluster secret, hashed in a
 * domain of its own, named by config, flag or environment, and its proofs
 * and frame keys pass for no other role's (nor theirs for it). */
START_TEST(test_reader_key)
{
	static const char hex64b[] =
		"0d9a01c7e2b84d56a0f1937c5e2d8b64190ace7d3b5f2864c0e9a7d1b3f50611";
	uint8_t secret[32], k[32], k2[32], t[32], n[32], p[32];
	struct ps_frame_keys a, b;
	struct ps_config cfg;
	char path[64], spath[64], got[1100], err[1024];

	put_file(spath, hex64, 64, 0600);
	ck_assert_int_eq(ps_auth_load_secret_file(spath, secret, err, sizeof(err)), 0);
	ck_assert_int_eq(ps_auth_load_reader_key_file(spath, secret, k, err, sizeof(err)),
			 PS_EAUTH);
	ck_assert_msg(strstr(err, "holds the cluster secret") && strstr(err, spath), "%s", err);
	put_file(path, hex64b, 64, 0600);
	ck_assert_int_eq(ps_auth_load_reader_key_file(path, secret, k, err, sizeof(err)), 0);
	ck_assert_int_eq(ps_auth_load_secret_file(path, k2, err, sizeof(err)), 0);
	ck_assert(memcmp(k, k2, 32) != 0);
	ck_assert_int_eq(ps_auth_load_repl_key_file(path, NULL, k2, err, sizeof(err)), 0);
	ck_assert(memcmp(k, k2, 32) != 0);
	unlink(path);
	unlink(spath);

	ck_assert_int_eq(tu_write_temp(path, "cluster:\n  servers: [127.0.0.1:1]\n  workers: 1\n"
				       "model:\n  tensors:\n    - {name: a, shape: [1]}\n"
				       "security:\n  reader_key_file: keys/reader.key\n"), 0);
	ck_assert_int_eq(ps_config_load(&cfg, path, err, sizeof(err)), 0);
	unlink(path);
	ps_auth_reader_key_path(&cfg, got, sizeof(got));
	ck_assert_str_eq(got, "/tmp/keys/reader.key");
	ck_assert_int_eq(ps_auth_set_reader_key_file(&cfg, "/etc/ps/reader-key"), 0);
	ps_auth_reader_key_path(&cfg, got, sizeof(got));
	ck_assert_str_eq(got, "/etc/ps/reader-key");
	cfg.security.reader_key_file[0] = 0;
	setenv("PS_READER_KEY_FILE", "/run/rd", 1);
	ps_auth_reader_key_path(&cfg, got, sizeof(got));
	ck_assert_str_eq(got, "/run/rd");
	unsetenv("PS_READER_KEY_FILE");
	ck_assert_int_eq(ps_auth_load_reader_key(&cfg, NULL, k, err, sizeof(err)), PS_EAUTH);
	ck_assert_msg(strstr(err, "security.reader_key_file"), "%s", err);

	ps_auth_random(n, sizeof(n));
	ps_auth_transcript((const uint8_t *)"hello", 5, n, t);
	for (int from_server = 0; from_server < 2; from_server++) {
		ps_auth_reader_proof(k, t, from_server, p);
		ck_assert(ps_auth_reader_proof_ok(k, t, from_server, p, 32));
		ck_assert(!ps_auth_reader_proof_ok(k, t, !from_server, p, 32));
		ck_assert(!ps_auth_proof_ok(k, t, from_server, p, 32));
		ck_assert(!ps_auth_repl_proof_ok(k, t, from_server, p, 32));
		ps_auth_proof(k, t, from_server, p);
		ck_assert(!ps_auth_reader_proof_ok(k, t, from_server, p, 32));
		ps_auth_repl_proof(k, t, from_server, p);
		ck_assert(!ps_auth_reader_proof_ok(k, t, from_server, p, 32));
	}
	ps_auth_reader_session_keys(k, t, 1, &a);
	ps_auth_reader_session_keys(k, t, 0, &b);
	ck_assert_mem_eq(a.send, b.recv, 32);
	ck_assert_mem_eq(a.recv, b.send, 32);
	ps_auth_session_keys(k, t, 1, &b);
	ck_assert(memcmp(a.send, b.send, 32) != 0 && memcmp(a.recv, b.recv, 32) != 0);
	ps_auth_repl_session_keys(k, t, 1, &b);
	ck_assert(memcmp(a.send, b.send, 32) != 0 && memcmp(a.recv, b.recv, 32) != 0);
}
END_TEST

/* Every byte of a proof counts, in both directions: one flipped bit in any
 * of the 32 bytes (the second half included) is refused. */
START_TEST(test_proof_every_byte)
{
	uint8_t key[32], t[32], p[PS_AUTH_PROOF_LEN];

	memset(key, 9, sizeof(key));
	ps_auth_random(t, sizeof(t));
	for (int from_server = 0; from_server <= 1; from_server++) {
		ps_auth_proof(key, t, from_server, p);
		ck_assert(ps_auth_proof_ok(key, t, from_server, p, sizeof(p)));
		for (size_t i = 0; i < sizeof(p); i++) {
			for (int bit = 0; bit < 8; bit += 7) {
				p[i] ^= (uint8_t)(1u << bit);
				ck_assert_msg(!ps_auth_proof_ok(key, t, from_server, p, sizeof(p)),
					      "%s proof with byte %zu bit %d flipped accepted",
					      from_server ? "server" : "client", i, bit);
				p[i] ^= (uint8_t)(1u << bit);
			}
		}
		ck_assert(ps_auth_proof_ok(key, t, from_server, p, sizeof(p)));
	}
}
END_TEST

/* Frame MACs: incremental updates in any split give the one tag; a
 * flipped bit anywhere, another sequence number or another key fails. */
START_TEST(test_frame_mac)
{
	uint8_t key[32], key2[32], msg[5000], tag[16], tag2[16];
	struct ps_mac m;

	for (int i = 0; i < 32; i++)
		key[i] = key2[i] = (uint8_t)i;
	key2[0] = 99;
	ck_assert_int_eq(ps_mac_init(&m), 0);
	for (size_t i = 0; i < sizeof(msg); i++)
		msg[i] = (uint8_t)(i * 31 + 7);
	ps_mac_begin(&m, key, 42);
	ps_mac_update(&m, msg, sizeof(msg));
	ps_mac_end(&m, tag);
	for (size_t cut = 0; cut < sizeof(msg); cut += 487) {
		ps_mac_begin(&m, key, 42);
		ps_mac_update(&m, msg, cut);
		ps_mac_update(&m, msg + cut, 3 < sizeof(msg) - cut ? 3 : sizeof(msg) - cut);
		if (cut + 3 < sizeof(msg))
			ps_mac_update(&m, msg + cut + 3, sizeof(msg) - cut - 3);
		ck_assert_int_eq(ps_mac_verify(&m, tag), 0);
	}
	for (size_t bit = 0; bit < sizeof(msg) * 8; bit += 997) {
		msg[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		ps_mac_begin(&m, key, 42);
		ps_mac_update(&m, msg, sizeof(msg));
		ck_assert_msg(ps_mac_verify(&m, tag) == -1, "bit %zu flipped, tag still good", bit);
		msg[bit / 8] ^= (uint8_t)(1u << (bit % 8));
	}
	ps_mac_begin(&m, key, 43);
	ps_mac_update(&m, msg, sizeof(msg));
	ck_assert_int_eq(ps_mac_verify(&m, tag), -1);
	ps_mac_begin(&m, key2, 42);
	ps_mac_update(&m, msg, sizeof(msg));
	ck_assert_int_eq(ps_mac_verify(&m, tag), -1);
	memcpy(tag2, tag, 16);
	tag2[15] ^= 0x80;
	ps_mac_begin(&m, key, 42);
	ps_mac_update(&m, msg, sizeof(msg));
	ck_assert_int_eq(ps_mac_verify(&m, tag2), -1);
	/* the construction is ChaCha20-Poly1305's: the tag equals libsodium's
	 * Poly1305 under the same one-time key */
	uint8_t nonce[8] = { 42 }, otk[32], ref[16];
	crypto_stream_chacha20(otk, sizeof(otk), nonce, key);
	crypto_onetimeauth(ref, msg, sizeof(msg), otk);
	ck_assert_mem_eq(ref, tag, 16);
	ps_mac_free(&m);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("auth");
	TCase *tc = tcase_create("auth");
	int failed;

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_secret_rules);
	tcase_add_test(tc, test_secret_path);
	tcase_add_test(tc, test_proofs_and_keys);
	tcase_add_test(tc, test_repl_key);
	tcase_add_test(tc, test_reader_key);
	tcase_add_test(tc, test_proof_every_byte);
	tcase_add_test(tc, test_frame_mac);
	suite_add_tcase(s, tc);
	failed = tu_run_suite(s);
	return failed ? 1 : 0;
}

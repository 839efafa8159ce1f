/* auth.h - the cluster secret and the handshake's challenge-response
 * (docs/security.md).
 *
 * Every process of a cluster reads the same secret file (at least 32
 * random bytes, mode 0600 or stricter; scripts/ps-keygen writes one). Its
 * bytes are hashed into a 32-byte key. On each connection:
 *
 *   client -> shard  Hello (with 32 random bytes Nc)
 *   shard -> client  AuthChallenge: its 32 random bytes Ns and
 *                    proof_s = BLAKE2b(key; "server" || T)
 *   client -> shard  Auth: proof_c = BLAKE2b(key; "client" || T)
 *
 * where T = BLAKE2b(Hello bytes as sent || Ns) binds the whole Hello and
 * both nonces. The client checks proof_s before it proves anything, so a
 * shard without the secret learns nothing usable; the shard checks proof_c,
 * which a replayed Auth cannot match because Ns is fresh. Both sides then
 * derive one key per direction from key and T (frame_mac.h).
 *
 * The two processes of a replicated shard (cluster.replicas: 1) prove a
 * key of their own instead, the replication key, which workers and
 * monitors do not hold: a Hello with the replica role is challenged with
 * proofs and frame keys under that key and labels of their own
 * ("replication proof server", ...), so neither the cluster secret nor a
 * proof made with it can pass for it.
 *
 * The read-only role (Hello ROLE_READER, ps_client_init with
 * PS_RANK_READER) proves a third key, the reader key
 * (security.reader_key_file), held by the shards and the readers, under
 * labels of its own ("reader proof server", ...): a process with the
 * cluster secret cannot pass for a reader, and a reader's key cannot pass
 * for a worker or a monitor. A shard refuses every state-changing request
 * of a reader's connection.
 */
#ifndef PS_AUTH_H
#define PS_AUTH_H

#include <stddef.h>
#include <stdint.h>
#include "config.h"
#include "frame_mac.h"

#define PS_AUTH_KEY_LEN 32
#define PS_AUTH_NONCE_LEN 32
#define PS_AUTH_PROOF_LEN 32
#define PS_SECRET_MIN_BYTES 32   /* of a binary secret; a hex one needs twice as many digits */
#define PS_SECRET_MAX_BYTES 4096

/* The secret file cfg uses: security.secret_file (ps_config_load has made
 * a relative name relative to the config file's folder), else
 * $PS_SECRET_FILE; "" when neither names one. */
void ps_auth_secret_path(const struct ps_config *cfg, char *out, size_t outlen);

/* --secret-file: makes path (relative to the current folder; stored
 * absolute) cfg's secret file. 0, or -ENAMETOOLONG. */
int ps_auth_set_secret_file(struct ps_config *cfg, const char *path);

/* Reads the secret file of cfg and hashes it into key. Refuses, with a
 * message naming the file and what to do in err: no file named, missing or
 * unreadable, not a regular file, readable or writable by group or others,
 * shorter than 32 bytes (64 hex digits), longer than 4096. Returns 0 or
 * PS_EAUTH. */
int ps_auth_load_secret(const struct ps_config *cfg, uint8_t key[PS_AUTH_KEY_LEN], char *err,
			size_t errlen);

/* Same for a named file (ps_auth_load_secret's work; tests use it). */
int ps_auth_load_secret_file(const char *path, uint8_t key[PS_AUTH_KEY_LEN], char *err,
			     size_t errlen);

/* The replication key file cfg uses: security.repl_key_file (made
 * relative to the config file's folder), else $PS_REPL_KEY_FILE; "" when
 * neither names one. */
void ps_auth_repl_key_path(const struct ps_config *cfg, char *out, size_t outlen);

/* --repl-key-file: as ps_auth_set_secret_file, for the replication key. */
int ps_auth_set_repl_key_file(struct ps_config *cfg, const char *path);

/* Reads the replication key file of cfg and hashes it into key, under the
 * secret file's rules (and messages naming the replication key file).
 * Also refused: a file that holds the cluster secret (secret: its hash as
 * ps_auth_load_secret gives it; NULL skips the comparison). 0 or
 * PS_EAUTH. */
int ps_auth_load_repl_key(const struct ps_config *cfg, const uint8_t secret[PS_AUTH_KEY_LEN],
			  uint8_t key[PS_AUTH_KEY_LEN], char *err, size_t errlen);
int ps_auth_load_repl_key_file(const char *path, const uint8_t secret[PS_AUTH_KEY_LEN],
			       uint8_t key[PS_AUTH_KEY_LEN], char *err, size_t errlen);

/* The reader key, as the replication key's functions: the path cfg uses
 * (security.reader_key_file, else $PS_READER_KEY_FILE; "" when neither),
 * --reader-key-file, and the load (secret: the cluster secret's hash, a
 * file holding it is refused; NULL skips that). 0 or PS_EAUTH. */
void ps_auth_reader_key_path(const struct ps_config *cfg, char *out, size_t outlen);
int ps_auth_set_reader_key_file(struct ps_config *cfg, const char *path);
int ps_auth_load_reader_key(const struct ps_config *cfg, const uint8_t secret[PS_AUTH_KEY_LEN],
			    uint8_t key[PS_AUTH_KEY_LEN], char *err, size_t errlen);
int ps_auth_load_reader_key_file(const char *path, const uint8_t secret[PS_AUTH_KEY_LEN],
				 uint8_t key[PS_AUTH_KEY_LEN], char *err, size_t errlen);

/* n bytes from the system's random source. */
void ps_auth_random(uint8_t *p, size_t n);

/* T of the header comment. */
void ps_auth_transcript(const uint8_t *hello, size_t hello_len,
			const uint8_t snonce[PS_AUTH_NONCE_LEN], uint8_t t[32]);

/* The proof of the server (from_server 1) or of the client over t. */
void ps_auth_proof(const uint8_t key[PS_AUTH_KEY_LEN], const uint8_t t[32], int from_server,
		   uint8_t proof[PS_AUTH_PROOF_LEN]);

/* 1 when proof (len bytes) is the right proof, compared in constant time. */
int ps_auth_proof_ok(const uint8_t key[PS_AUTH_KEY_LEN], const uint8_t t[32], int from_server,
		     const uint8_t *proof, size_t len);

/* The same two for the replication link, keyed with the replication key:
 * a proof of one domain never passes for the other's. */
void ps_auth_repl_proof(const uint8_t key[PS_AUTH_KEY_LEN], const uint8_t t[32], int from_server,
			uint8_t proof[PS_AUTH_PROOF_LEN]);
int ps_auth_repl_proof_ok(const uint8_t key[PS_AUTH_KEY_LEN], const uint8_t t[32],
			  int from_server, const uint8_t *proof, size_t len);

/* And for the reader role, keyed with the reader key. */
void ps_auth_reader_proof(const uint8_t key[PS_AUTH_KEY_LEN], const uint8_t t[32],
			  int from_server, uint8_t proof[PS_AUTH_PROOF_LEN]);
int ps_auth_reader_proof_ok(const uint8_t key[PS_AUTH_KEY_LEN], const uint8_t t[32],
			    int from_server, const uint8_t *proof, size_t len);

/* What protects frames after the handshake, from security: -1 for MACs (or
 * nothing, without mac), else the enum ps_cipher of security.encrypt. The
 * Hello carries it + 1 (0: not encrypted); both ends must agree. */
int ps_auth_cipher(const struct ps_security_cfg *sec);

/* The frame keys of the server end (server 1) or the client end: the
 * client's send key is the server's receive key and the other way round. */
void ps_auth_session_keys(const uint8_t key[PS_AUTH_KEY_LEN], const uint8_t t[32], int server,
			  struct ps_frame_keys *out);

/* The frame keys of the replication link (its own labels). */
void ps_auth_repl_session_keys(const uint8_t key[PS_AUTH_KEY_LEN], const uint8_t t[32],
			       int server, struct ps_frame_keys *out);

/* The frame keys of a reader's connection (its own labels). */
void ps_auth_reader_session_keys(const uint8_t key[PS_AUTH_KEY_LEN], const uint8_t t[32],
				 int server, struct ps_frame_keys *out);

#endif

/* main.c - ps-server: one shard of the parameter server.
 *
 *   ps-server --config FILE --shard I|auto [--log-level L] [--dump-config] [--help]
 *             [--reshard-from DIR --reshard-shards N]
 */
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "auth.h"
#include "config.h"
#include "ps_err.h"
#include "ps_log.h"
#include "reshard.h"
#include "server.h"
#include "version.h"

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: ps-server --config FILE --shard I|auto [options]\n"
		"\n"
		"Runs shard I of the parameter server described by FILE: owns the parameter\n"
		"slices the shard map gives it, applies pushed gradients with the configured\n"
		"optimizer and answers pulls. SIGINT or SIGTERM stops it cleanly.\n"
		"\n"
		"Options:\n"
		"  -c, --config FILE    cluster configuration (YAML), required\n"
		"  -s, --shard I        which shard this process is (0-based), required; 'auto':\n"
		"                       the number after the last '-' of the host name (a\n"
		"                       StatefulSet pod ps-shard-2 is shard 2); default:\n"
		"                       $PS_SHARD (a number or 'auto')\n"
		"  -r, --replica R      cluster.replicas: 1: 0 runs at the shard's cluster.servers\n"
		"                       address, 1 at its cluster.backups address (default 0);\n"
		"                       either may become the primary\n"
		"  -l, --log-level L    debug, info, warn, error or off (default: the config's log.level)\n"
		"      --secret-file F  the cluster secret (default: the config's\n"
		"                       security.secret_file, else $PS_SECRET_FILE)\n"
		"      --repl-key-file F\n"
		"                       cluster.replicas: 1: the replication key, which only\n"
		"                       the shard processes hold (default: the config's\n"
		"                       security.repl_key_file, else $PS_REPL_KEY_FILE)\n"
		"      --reader-key-file F\n"
		"                       the key readers (read-only clients) prove; without one\n"
		"                       readers are refused (default: the config's\n"
		"                       security.reader_key_file, else $PS_READER_KEY_FILE)\n"
		"      --reshard-from DIR\n"
		"                       start from the checkpoints of a cluster of another\n"
		"                       number of shards (or of the placement before\n"
		"                       re-sharding), which lie in DIR (not checkpoint.dir):\n"
		"                       this shard takes what it owns under its map, serves,\n"
		"                       and writes its own checkpoint in the background (until\n"
		"                       then CKPT_DIR/shard-K.reshard names DIR, and a restart\n"
		"                       takes DIR again); one whose own checkpoint is of this\n"
		"                       map and newer than DIR's resumes from it\n"
		"                       (docs/elastic.md; ps-local.sh CONFIG reshard NEW);\n"
		"                       cluster.replicas: 1: both processes of each pair take\n"
		"                       it, each writes its own checkpoint before serving, and\n"
		"                       of each old pair the newer of its two files\n"
		"                       (shard-K.ckpt, shard-K-r1.ckpt) is read\n"
		"      --reshard-shards N\n"
		"                       with --reshard-from: how many shards the old cluster had\n"
		"      --reshard-stage PID\n"
		"                       with --reshard-from: a pre-copy: load the old shards'\n"
		"                       files from checkpoint.dir while they run (each wrote a\n"
		"                       full one on SIGUSR1), wait for SIGUSR1 (the launcher's\n"
		"                       commit, 600 s at most), then apply the stop's\n"
		"                       incremental checkpoints from DIR; PID: the launcher,\n"
		"                       this process's parent, with which it ends\n"
		"      --dump-config    print the effective configuration and exit\n"
		"      --list-shards    print 'INDEX HOST PORT' for every shard and exit\n"
		"      --list-backups   the same for every shard's backup address (cluster.backups)\n"
		"  -h, --help           this text, followed by every configuration option\n"
		"      --version        version, wire protocol, rdma and CUDA plug-in of this build\n"
		"\n"
		"Exit status: 0 stopped by SIGTERM or SIGINT with its checkpoint written (or none\n"
		"configured), or at a re-shard's stop (ps-stat --reshard-stop) with it written;\n"
		"1 could not start (listen, keys, checkpoint) or the last checkpoint\n"
		"failed: worth a restart; 2 bad flags or config: a restart changes nothing.\n"
		"\n");
}

/* The shard a host name gives: the decimal digits after its last '-'
 * (a StatefulSet names its pods NAME-ORDINAL: ps-shard-2 is shard 2).
 * -1 with the reason in why when the name does not end that way. */
static int shard_from_hostname(char *name, size_t len, char *why, size_t whylen)
{
	const char *dash, *p;
	long v = 0;

	if (gethostname(name, len) != 0) {
		snprintf(why, whylen, "cannot read the host name");
		return -1;
	}
	name[len - 1] = '\0';
	dash = strrchr(name, '-');
	for (p = dash ? dash + 1 : ""; *p >= '0' && *p <= '9' && v <= 1000000; p++)
		v = v * 10 + (*p - '0');
	if (!dash || dash[1] == '\0' || *p || v > 1000000) {
		snprintf(why, whylen, "host name '%s' does not end in -N, the ordinal a StatefulSet "
			 "gives its pods (ps-shard-0, ps-shard-1, ...)", name);
		return -1;
	}
	return (int)v;
}

/* --shard's value (or $PS_SHARD's): a number, or "auto" for the host
 * name's ordinal. -1 after printing the error naming what (the flag or
 * the variable). */
static int parse_shard(const char *s, const char *what)
{
	char host[HOST_NAME_MAX + 1], why[HOST_NAME_MAX + 128];
	char *end;
	long v;

	if (!strcmp(s, "auto")) {
		v = shard_from_hostname(host, sizeof(host), why, sizeof(why));
		if (v < 0)
			fprintf(stderr, "ps-server: %s auto: %s; give the shard as a number\n", what, why);
		return (int)v;
	}
	v = strtol(s, &end, 10);
	if (!*s || *end || v < 0 || v > 1000000) {
		fprintf(stderr, "ps-server: %s: expected a shard index or 'auto', got '%s'\n", what, s);
		return -1;
	}
	return (int)v;
}

/* Parses a non-negative int flag value fully; -1 on error. */
static int parse_index(const char *s)
{
	char *end;
	long v = strtol(s, &end, 10);

	if (!*s || *end || v < 0 || v > 1000000)
		return -1;
	return (int)v;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "shard", required_argument, NULL, 's' },
		{ "log-level", required_argument, NULL, 'l' },
		{ "dump-config", no_argument, NULL, 'D' },
		{ "secret-file", required_argument, NULL, 'K' },
		{ "repl-key-file", required_argument, NULL, 'R' },
		{ "reader-key-file", required_argument, NULL, 'E' },
		{ "list-shards", no_argument, NULL, 'S' },
		{ "list-backups", no_argument, NULL, 'B' },
		{ "replica", required_argument, NULL, 'r' },
		{ "reshard-from", required_argument, NULL, 'F' },
		{ "reshard-shards", required_argument, NULL, 'N' },
		{ "reshard-stage", required_argument, NULL, 'G' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	const char *config = NULL, *level = NULL, *secret = NULL, *repl_key = NULL;
	const char *reader_key = NULL, *shard_arg = NULL;
	char *end;
	int shard = -1, replica = 0, dump = 0, list = 0, opt, rc;
	struct ps_reshard_from resh = { NULL, -1, 0 };
	struct ps_config *cfg;
	struct ps_server srv;
	enum ps_log_level lvl;
	char err[1024];

	/* A write to a connection the peer has just reset must fail with EPIPE,
	 * not end the shard (and lose everything since the last checkpoint):
	 * libuv writes with plain writev, which raises SIGPIPE. */
	signal(SIGPIPE, SIG_IGN);
	while ((opt = getopt_long(argc, argv, "c:s:r:l:h", opts, NULL)) != -1) {
		switch (opt) {
		case 'c': config = optarg; break;
		case 'r':
			replica = parse_index(optarg);
			if (replica < 0 || replica > 1) {
				fprintf(stderr, "ps-server: --replica: expected 0 or 1, got '%s'\n", optarg);
				return 2;
			}
			break;
		case 'B': list = 2; break;
		case 'F': resh.dir = optarg; break;
		case 'G':
			resh.stage = strtol(optarg, &end, 10);
			if (*end || end == optarg || resh.stage < 2 || resh.stage > INT_MAX) {
				fprintf(stderr, "ps-server: --reshard-stage: expected the launcher's pid, got "
					"'%s'\n", optarg);
				return 2;
			}
			break;
		case 'N':
			resh.nshards = parse_index(optarg);
			if (resh.nshards < 1 || resh.nshards > PS_MAX_SHARDS) {
				fprintf(stderr, "ps-server: --reshard-shards: expected 1..%d, got '%s'\n",
					PS_MAX_SHARDS, optarg);
				return 2;
			}
			break;
		case 's': shard_arg = optarg; break;
		case 'l': level = optarg; break;
		case 'D': dump = 1; break;
		case 'K': secret = optarg; break;
		case 'R': repl_key = optarg; break;
		case 'E': reader_key = optarg; break;
		case 'S': list = 1; break;
		case 'V': ps__version_print(stdout, "ps-server"); return 0;
		case 'h':
			usage(stdout);
			ps_config_help(stdout);
			return 0;
		default:
			fprintf(stderr, "Try 'ps-server --help'.\n");
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "ps-server: unexpected argument '%s'\nTry 'ps-server --help'.\n", argv[optind]);
		return 2;
	}
	if (!config) {
		fprintf(stderr, "ps-server: --config FILE is required\nTry 'ps-server --help'.\n");
		return 2;
	}
	if (shard_arg && (shard = parse_shard(shard_arg, "--shard")) < 0)
		return 2;
	if (!resh.dir != (resh.nshards < 0)) {
		fprintf(stderr, "ps-server: --reshard-from DIR and --reshard-shards N go together\n");
		return 2;
	}
	if (resh.stage && !resh.dir) {
		fprintf(stderr, "ps-server: --reshard-stage needs --reshard-from DIR --reshard-shards N\n");
		return 2;
	}
	cfg = malloc(sizeof(*cfg));
	if (!cfg)
		return 1;
	rc = ps_config_load(cfg, config, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "ps-server: %s\n", err);
		free(cfg);
		return 2;
	}
	if (secret && ps_auth_set_secret_file(cfg, secret)) {
		fprintf(stderr, "ps-server: --secret-file: name too long\n");
		free(cfg);
		return 2;
	}
	if (repl_key && ps_auth_set_repl_key_file(cfg, repl_key)) {
		fprintf(stderr, "ps-server: --repl-key-file: name too long\n");
		free(cfg);
		return 2;
	}
	if (reader_key && ps_auth_set_reader_key_file(cfg, reader_key)) {
		fprintf(stderr, "ps-server: --reader-key-file: name too long\n");
		free(cfg);
		return 2;
	}
	if (dump || list) {
		if (dump)
			ps_config_dump(cfg, stdout);
		for (int k = 0; list == 1 && k < cfg->nshards; k++)
			printf("%d %s %d\n", k, cfg->shards[k].host, cfg->shards[k].port);
		for (int k = 0; list == 2 && k < cfg->nbackups; k++)
			printf("%d %s %d\n", k, cfg->backups[k].host, cfg->backups[k].port);
		free(cfg);
		return 0;
	}
	/* --shard, else $PS_SHARD: named so in the errors */
	const char *env = getenv("PS_SHARD"), *from = "--shard ", *val = shard_arg;

	if (!shard_arg && env && env[0]) {
		from = "$PS_SHARD=";
		val = env;
		shard = parse_shard(env, "$PS_SHARD");
		if (shard < 0) {
			free(cfg);
			return 2;
		}
	}
	if (shard < 0) {
		fprintf(stderr, "ps-server: --shard I|auto (or $PS_SHARD) is required (0..%d for %s)\n",
			cfg->nshards - 1, config);
		free(cfg);
		return 2;
	}
	if (shard >= cfg->nshards) {
		fprintf(stderr, "ps-server: %s%s%s: shard %d does not exist: %s names shards 0..%d\n",
			from, val, strcmp(val, "auto") ? "" : " (the host name's ordinal)", shard,
			config, cfg->nshards - 1);
		free(cfg);
		return 2;
	}
	if (ps_log_parse_level(level ? level : cfg->log_level, &lvl)) {
		fprintf(stderr, "ps-server: --log-level: expected debug, info, warn, error or off, got '%s'\n", level);
		free(cfg);
		return 2;
	}
	if (replica > cfg->replicas) {
		fprintf(stderr, "ps-server: --replica 1 needs cluster.replicas: 1 in %s\n", config);
		free(cfg);
		return 2;
	}
	ps_log_init(replica ? "server.r1" : "server", shard);
	ps_log_set_level(lvl);

	uv_loop_t *loop = uv_default_loop();
	rc = ps_server_init_from(&srv, cfg, shard, replica, loop, resh.dir ? &resh : NULL);
	if (rc) {
		ps_error("not started: %s", ps_strerror(rc));
		free(cfg);
		return 1;
	}
	uv_run(loop, UV_RUN_DEFAULT);
	ps_info("stopped: %llu pushes, %llu pulls, %llu applies",
		(unsigned long long)srv.c.pushes, (unsigned long long)srv.c.pulls,
		(unsigned long long)srv.store.applies);
	rc = srv.exit_status;
	ps_server_free(&srv);
	uv_loop_close(loop);
	free(cfg);
	return rc;
}

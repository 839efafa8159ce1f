/* ps_export.c - ps-export: a cluster's checkpoints, read offline, as one
 * NumPy .npz file a serving stack reads without this project
 * (docs/embeddings.md, "Export").
 *
 *   ps-export --config C --out FILE.npz [--dir D] [--since N] [--quiet]
 *
 * For every shard of the config it reads <dir>/shard-K.ckpt and the
 * incremental checkpoints after it (shard-K.ckpt.delta-1, -2, ... while
 * they exist and build on that file), checking every record against the
 * config (shard, shard map, optimizer, slices, tables) and every byte
 * against the file's CRC-32 before anything is used, and writes:
 *   dense/<tensor>.npy        float32, the tensor's shape
 *   tables/<table>/ids.npy    uint64 [n], sorted (the config's tables and
 *                             those workers declared, checkpoint versions 3
 *                             and 4)
 *   tables/<table>/rows.npy   float32 [n, dim], row i belongs to ids[i]
 *   tables/<table>/dropped.npy uint64 (--since only): ids dropped since
 *   meta.json                 config and map hash, per shard its files,
 *                             clocks and versions, shapes, optimizers
 * With --since N only the rows that incremental checkpoints N+1, N+2, ...
 * of each shard changed are written (the rows a serving cache must
 * refresh), with the ids they dropped; the dense tensors are written
 * whole. A damaged, truncated or foreign file is refused naming the file
 * and the offset, and nothing is written.
 *
 * Exit status: 0 written, 1 a checkpoint could not be exported, 2 usage
 * or config error.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "config.h"
#include "config_agree.h"
#include "export.h"
#include "npz.h"
#include "ps_err.h"
#include "ps_time.h"
#include "shardmap.h"
#include "version.h"

/* ---- output ---- */

struct keyed {
	uint64_t id, at;
};

/* LSD radix sort by id, 16 bits a pass, passes where every id has the
 * same digit skipped. Returns the sorted array (a or tmp). */
static struct keyed *radix_sort(struct keyed *a, struct keyed *tmp, uint64_t n)
{
	enum { BITS = 16, NB = 1 << BITS };
	uint64_t *cnt = malloc(NB * sizeof(*cnt));

	if (!cnt)
		return NULL;
	for (int shift = 0; shift < 64 && n; shift += BITS) {
		uint64_t sum = 0;
		memset(cnt, 0, NB * sizeof(*cnt));
		for (uint64_t i = 0; i < n; i++)
			cnt[(a[i].id >> shift) & (NB - 1)]++;
		if (cnt[(a[0].id >> shift) & (NB - 1)] == n)
			continue;
		for (uint64_t d = 0; d < NB; d++) {
			uint64_t c = cnt[d];
			cnt[d] = sum;
			sum += c;
		}
		for (uint64_t i = 0; i < n; i++)
			tmp[cnt[(a[i].id >> shift) & (NB - 1)]++] = a[i];
		struct keyed *t = a;
		a = tmp;
		tmp = t;
	}
	free(cnt);
	return a;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* A JSON string of s (names are printable, but quoted safely anyway). */
static void json_str(FILE *o, const char *s)
{
	fputc('"', o);
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch == '"' || ch == '\\')
			fprintf(o, "\\%c", ch);
		else if (ch < 0x20)
			fprintf(o, "\\u%04x", ch);
		else
			fputc(ch, o);
	}
	fputc('"', o);
}

/* Writes table t's rows (live ones; with --since those changed), and with
 * --since its dropped ids. *rows gets the count. */
static int write_table(struct exporter *ex, struct ps_npz *z, int t, uint64_t *rows,
		       uint64_t *ndropped)
{
	const struct ps_table_cfg *tc = &(ex->ecfg ? ex->ecfg : ex->cfg)->tables[t];
	struct tacc *a = &ex->tab[t];
	uint8_t want = ex->since >= 0 ? (F_LIVE | F_CHANGED) : F_LIVE;
	struct keyed *k = NULL, *tmp = NULL, *s;
	uint64_t n = 0, *idbuf = NULL;
	float *wbuf = NULL;
	char name[PS_NAME_MAX + 40];
	int64_t dims[2];
	int rc = 0, dim = tc->dim;
	enum { CHUNK = 65536 };

	for (uint64_t i = 0; i < a->n; i++)
		n += (a->flags[i] & want) == want;
	k = malloc((n ? n : 1) * sizeof(*k));
	tmp = malloc((n ? n : 1) * sizeof(*tmp));
	idbuf = malloc(CHUNK * sizeof(*idbuf));
	wbuf = malloc((size_t)CHUNK * (size_t)dim * sizeof(*wbuf));
	if (!k || !tmp || !idbuf || !wbuf) {
		rc = ps__export_fail(ex, -ENOMEM, "out of memory for table '%s'", tc->name);
		goto out;
	}
	n = 0;
	for (uint64_t i = 0; i < a->n; i++)
		if ((a->flags[i] & want) == want)
			k[n++] = (struct keyed){ a->ids[i], i };
	if (!(s = radix_sort(k, tmp, n))) {
		rc = ps__export_fail(ex, -ENOMEM, "out of memory");
		goto out;
	}
	for (uint64_t i = 1; i < n; i++)
		if (s[i].id == s[i - 1].id) {
			rc = ps__export_fail(ex, PS_EPROTO, "table '%s': id %" PRIu64 " is held by two shards "
				  "(checkpoints of different runs or configs?)", tc->name, s[i].id);
			goto out;
		}
	dims[0] = (int64_t)n;
	dims[1] = dim;
	snprintf(name, sizeof(name), "tables/%s/ids.npy", tc->name);
	rc = ps__npz_begin_npy(z, name, "<u8", dims, 1);
	for (uint64_t i = 0; !rc && i < n; i += CHUNK) {
		uint64_t m = n - i < CHUNK ? n - i : CHUNK;
		for (uint64_t j = 0; j < m; j++)
			idbuf[j] = s[i + j].id;
		rc = ps__npz_write(z, idbuf, m * 8);
	}
	if (!rc)
		rc = ps__npz_end(z);
	snprintf(name, sizeof(name), "tables/%s/rows.npy", tc->name);
	if (!rc)
		rc = ps__npz_begin_npy(z, name, "<f4", dims, 2);
	for (uint64_t i = 0; !rc && i < n; i += CHUNK) {
		uint64_t m = n - i < CHUNK ? n - i : CHUNK;
		for (uint64_t j = 0; j < m; j++)
			memcpy(wbuf + j * (uint64_t)dim, a->row[s[i + j].at],
			       (size_t)dim * sizeof(float));
		rc = ps__npz_write(z, wbuf, m * (uint64_t)dim * sizeof(float));
	}
	if (!rc)
		rc = ps__npz_end(z);
	*rows = n;
	*ndropped = 0;
	if (!rc && ex->since >= 0) {
		/* dropped after the base and not back since, each once */
		uint64_t nd = 0;
		if (a->ndropped && ps__tacc_hash_sync(a)) {
			rc = ps__export_fail(ex, -ENOMEM, "out of memory");
			goto out;
		}
		if (a->ndropped)
			qsort(a->dropped, a->ndropped, sizeof(uint64_t), cmp_u64);
		for (uint64_t i = 0; i < a->ndropped; i++) {
			uint64_t at = ps__tacc_find(a, a->dropped[i]);
			if ((i && a->dropped[i] == a->dropped[i - 1]) ||
			    (at != UINT64_MAX && (a->flags[at] & F_LIVE)))
				continue;
			a->dropped[nd++] = a->dropped[i];
		}
		dims[0] = (int64_t)nd;
		snprintf(name, sizeof(name), "tables/%s/dropped.npy", tc->name);
		rc = ps__npz_add_npy(z, name, "<u8", dims, 1, a->dropped, nd * 8);
		*ndropped = nd;
	}
	if (rc && !ex->err[0])
		ps__export_fail(ex, rc, "cannot write table '%s': %s", tc->name, strerror(-rc));
out:
	free(k);
	free(tmp);
	free(idbuf);
	free(wbuf);
	return rc;
}

static int write_meta(struct exporter *ex, struct ps_npz *z, const char *cfgpath,
		      const uint64_t *rows, const uint64_t *dropped)
{
	const struct ps_config *c = ex->ecfg ? ex->ecfg : ex->cfg;
	char agree[PS_AGREE_MAX], *buf = NULL;
	size_t blen = 0;
	FILE *o = open_memstream(&buf, &blen);
	int rc;

	if (!o)
		return ps__export_fail(ex, -ENOMEM, "out of memory");
	ps_config_agreement(ex->cfg, agree, sizeof(agree));
	fprintf(o, "{\n  \"format\": \"ps-export\",\n  \"format_version\": 1,\n  \"config\": ");
	json_str(o, cfgpath);
	fprintf(o, ",\n  \"config_hash\": \"%016" PRIx64 "\",\n  \"map_hash\": \"%016" PRIx64
		"\",\n", ps_fnv1a(PS_FNV_OFFSET, agree, strlen(agree)), ex->map.hash);
	if (ex->since >= 0)
		fprintf(o, "  \"since\": %d,\n", ex->since);
	else
		fprintf(o, "  \"since\": null,\n");
	fprintf(o, "  \"optimizer\": \"%s\",\n  \"consistency\": \"%s\",\n  \"shards\": [",
		ps_optim_name(c->optim.kind), c->consistency == PS_SYNC ? "sync" : "async");
	for (int k = 0; k < c->nshards; k++) {
		const struct shard_info *si = &ex->sh[k];
		fprintf(o, "%s\n    {\"shard\": %d, \"file\": ", k ? "," : "", k);
		json_str(o, si->path);
		fprintf(o, ", \"checkpoint_version\": %d, \"map_epoch\": %" PRIu64 ", \"deltas\": %u, "
			"\"base_crc\": \"%08x\", \"base_len\": %" PRIu64 ", \"slice_versions\": [%"
			PRIu64 ", %" PRIu64 "], \"finished_clocks\": [", si->version, si->map_epoch,
			si->deltas, si->base_crc, si->base_len,
			si->min_version == UINT64_MAX ? 0 : si->min_version, si->max_version);
		for (int r = 0; r < c->nworkers; r++)
			fprintf(o, "%s%" PRIu64, r ? ", " : "", si->finished[r]);
		fprintf(o, "], \"table_versions\": {");
		for (int t = 0; t < c->ntables; t++) {
			fprintf(o, "%s", t ? ", " : "");
			json_str(o, c->tables[t].name);
			fprintf(o, ": %" PRIu64, si->table_version[t]);
		}
		fprintf(o, "}}");
	}
	fprintf(o, "\n  ],\n  \"dense\": {");
	for (int t = 0; t < c->ntensors; t++) {
		const struct ps_tensor_cfg *tc = &c->tensors[t];
		fprintf(o, "%s\n    ", t ? "," : "");
		json_str(o, tc->name);
		fprintf(o, ": {\"dtype\": \"float32\", \"shape\": [");
		for (int d = 0; d < tc->ndims; d++)
			fprintf(o, "%s%" PRId64, d ? ", " : "", tc->dims[d]);
		fprintf(o, "], \"optimizer\": \"%s\"", ps_optim_name(c->ngroups ?
			c->groups[tc->group].kind : c->optim.kind));
		if (c->ngroups)
			fprintf(o, ", \"group\": %d", tc->group);
		fprintf(o, "}");
	}
	fprintf(o, "%s},\n  \"tables\": {", c->ntensors ? "\n  " : "");
	for (int t = 0; t < c->ntables; t++) {
		const struct ps_table_cfg *tc = &c->tables[t];
		fprintf(o, "%s\n    ", t ? "," : "");
		json_str(o, tc->name);
		fprintf(o, ": {\"dim\": %d, \"rows\": %" PRIu64 ", \"dtype\": \"float32\", "
			"\"id_dtype\": \"uint64\", \"optimizer\": \"%s\", \"declared\": %s", tc->dim,
			rows[t], ps_row_optim_name(tc->optimizer),
			t >= c->ntables - c->ndecl_tables ? "true" : "false");
		if (ex->since >= 0)
			fprintf(o, ", \"dropped\": %" PRIu64, dropped[t]);
		fprintf(o, "}");
	}
	fprintf(o, "%s}\n}\n", c->ntables ? "\n  " : "");
	/* glibc's fclose of a memory stream returns 0 when its last realloc
	 * fails, leaving buf NULL (and blen as it was): an empty meta.json
	 * written and the export called good (it_export.sh's sweep found it) */
	if (fclose(o) || !buf) {
		free(buf);
		return ps__export_fail(ex, -ENOMEM, "out of memory");
	}
	rc = ps__npz_begin(z, "meta.json");
	if (!rc)
		rc = ps__npz_write(z, buf, blen);
	if (!rc)
		rc = ps__npz_end(z);
	free(buf);
	return rc;
}

static int write_all(struct exporter *ex, const char *out, const char *cfgpath, int quiet,
		     double t0)
{
	const struct ps_config *c = ex->ecfg ? ex->ecfg : ex->cfg;
	struct ps_npz *z = NULL;
	uint64_t *rows = calloc((size_t)c->ntables + 1, 8), *dropped = calloc((size_t)c->ntables + 1, 8);
	char name[PS_NAME_MAX + 20];
	int rc = 0;

	if (!rows || !dropped) {
		rc = ps__export_fail(ex, -ENOMEM, "out of memory");
		goto out;
	}
	if ((rc = ps__npz_open(&z, out, ex->err, sizeof(ex->err))))
		goto out;
	for (int t = 0; !rc && t < c->ntensors; t++) {
		snprintf(name, sizeof(name), "dense/%s.npy", c->tensors[t].name);
		rc = ps__npz_add_npy(z, name, "<f4", c->tensors[t].dims, c->tensors[t].ndims,
				     ex->dense[t], (size_t)c->tensors[t].count * sizeof(float));
		if (rc)
			ps__export_fail(ex, rc, "%s: cannot write: %s", out, strerror(-rc));
	}
	for (int t = 0; !rc && t < c->ntables; t++)
		rc = write_table(ex, z, t, &rows[t], &dropped[t]);
	if (!rc && (rc = write_meta(ex, z, cfgpath, rows, dropped)))
		ps__export_fail(ex, rc, "%s: cannot write: %s", out, strerror(-rc));
	rc = ps__npz_close(z, !rc, rc ? name : ex->err, rc ? sizeof(name) : sizeof(ex->err)) ? : rc;
	if (!rc && !quiet) {
		int64_t floats = 0;
		for (int t = 0; t < c->ntensors; t++)
			floats += c->tensors[t].count;
		fprintf(stderr, "ps-export: wrote %s: %d dense tensors (%" PRId64 " floats)", out,
			c->ntensors, floats);
		for (int t = 0; t < c->ntables; t++) {
			fprintf(stderr, ", table '%s' %" PRIu64 " rows of dim %d", c->tables[t].name,
				rows[t], c->tables[t].dim);
			if (ex->since >= 0)
				fprintf(stderr, " (%" PRIu64 " dropped)", dropped[t]);
		}
		fprintf(stderr, " in %.2f s\n", ps_now_s() - t0);
	}
out:
	free(rows);
	free(dropped);
	return rc;
}

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: ps-export --config FILE --out FILE.npz [options]\n"
		"\n"
		"Reads every shard's checkpoint (shard-K.ckpt and the incremental checkpoints\n"
		"after it) offline, no shard running, and writes the model as a NumPy .npz:\n"
		"dense/<tensor>.npy (float32, its shape), tables/<table>/ids.npy (uint64,\n"
		"sorted) and tables/<table>/rows.npy (float32 [n, dim]), and meta.json.\n"
		"A damaged, truncated or foreign checkpoint is refused naming the file and\n"
		"the offset; nothing is written then.\n"
		"\n"
		"Options:\n"
		"  -c, --config FILE   the cluster's config (required; PS_CONFIG)\n"
		"  -o, --out FILE      the .npz to write (required; written whole, then renamed)\n"
		"  -d, --dir DIR       where the checkpoints are (default: checkpoint.dir)\n"
		"      --since N       only the rows the incremental checkpoints after number N\n"
		"                      changed (0: since the full checkpoint), and the ids they\n"
		"                      dropped (tables/<table>/dropped.npy); dense tensors whole\n"
		"  -q, --quiet         no summary line\n"
		"  -h, --help          this text\n"
		"      --version       version, wire protocol, rdma and CUDA plug-in of this build\n"
		"\n"
		"Exit status: 0 written, 1 a checkpoint could not be exported, 2 usage or\n"
		"config error.\n");
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "out", required_argument, NULL, 'o' },
		{ "dir", required_argument, NULL, 'd' },
		{ "since", required_argument, NULL, 'S' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ 0, 0, 0, 0 }
	};
	const char *cfgpath = getenv("PS_CONFIG"), *out = NULL, *dir = NULL;
	struct exporter ex = { .since = -1 };
	struct ps_config *cfg = NULL;
	int quiet = 0, opt, rc = 2;
	double t0 = ps_now_s();
	char err[1024];

	while ((opt = getopt_long(argc, argv, "c:o:d:qh", lo, NULL)) != -1) {
		switch (opt) {
		case 'c': cfgpath = optarg; break;
		case 'o': out = optarg; break;
		case 'd': dir = optarg; break;
		case 'q': quiet = 1; break;
		case 'S': {
			char *end;
			long v = strtol(optarg, &end, 10);
			if (!*optarg || *end || v < 0 || v > 1000000000) {
				fprintf(stderr, "ps-export: --since %s: expected the number of an "
					"incremental checkpoint (0 or more)\n", optarg);
				return 2;
			}
			ex.since = (int)v;
			break;
		}
		case 'h': usage(stdout); return 0;
		case 'V': ps__version_print(stdout, "ps-export"); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "ps-export: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	if (!cfgpath || !out) {
		fprintf(stderr, "ps-export: %s is required (ps-export --help)\n",
			!cfgpath ? "--config" : "--out");
		return 2;
	}
	cfg = calloc(1, sizeof(*cfg));
	if (!cfg) {
		fprintf(stderr, "ps-export: out of memory\n");
		return 2;
	}
	if (ps_config_load(cfg, cfgpath, err, sizeof(err))) {
		fprintf(stderr, "ps-export: %s\n", err);
		goto out;
	}
	if (!dir)
		dir = cfg->checkpoint.dir;
	if (!dir[0]) {
		fprintf(stderr, "ps-export: %s sets no checkpoint.dir: give the checkpoints' folder "
			"with --dir\n", cfgpath);
		goto out;
	}
	ex.cfg = cfg;
	ex.sh = calloc((size_t)cfg->nshards, sizeof(*ex.sh));
	/* room for the tables declared at run time (versions 3 and 4) */
	ex.tab = calloc(PS_MAX_TABLES, sizeof(*ex.tab));
	if (!ex.sh || !ex.tab) {
		fprintf(stderr, "ps-export: out of memory\n");
		goto out;
	}
	for (int k = 0; k < cfg->nshards; k++) {
		ex.sh[k].finished = calloc((size_t)cfg->nworkers + 1, 8);
		ex.sh[k].table_version = calloc(PS_MAX_TABLES, 8);
		if (!ex.sh[k].finished || !ex.sh[k].table_version) {
			fprintf(stderr, "ps-export: out of memory\n");
			goto out;
		}
	}
	rc = 1;
	for (int k = 0; k < cfg->nshards; k++)
		if (ps__export_read_shard(&ex, dir, k, quiet)) {
			fprintf(stderr, "ps-export: %s\n", ex.err);
			goto out;
		}
	if (write_all(&ex, out, cfgpath, quiet, t0)) {
		fprintf(stderr, "ps-export: %s\n", ex.err[0] ? ex.err : "cannot write the export");
		goto out;
	}
	rc = 0;
out:
	if (ex.have_map)
		ps_shardmap_free(&ex.map);
	for (int t = 0; ex.dense && t < (ex.ecfg ? ex.ecfg : cfg)->ntensors; t++)
		free(ex.dense[t]);
	free(ex.dense);
	for (int t = 0; ex.tab && t < PS_MAX_TABLES; t++) {
		free(ex.tab[t].ids);
		free(ex.tab[t].row);
		free(ex.tab[t].flags);
		free(ex.tab[t].hash);
		free(ex.tab[t].dropped);
	}
	free(ex.tab);
	for (int i = 0; i < ex.nmaps; i++)
		munmap(ex.maps[i].p, ex.maps[i].len);
	free(ex.maps);
	for (int k = 0; ex.sh && k < cfg->nshards; k++) {
		free(ex.sh[k].finished);
		free(ex.sh[k].table_version);
	}
	free(ex.sh);
	free(ex.ecfg);
	free(cfg);
	return rc;
}

/* export_read.c - ps-export's reading of checkpoints (export.h): every
 * record of a shard's full checkpoint and of its incremental ones checked
 * against the config and bounded by the bytes left (an error names the
 * file and the offset), then the file's CRC-32, and only then its dense
 * slices copied into the tensors and its rows into the tables (an
 * incremental one's dropped ids and changed rows applied in order). The
 * layout is that of server/checkpoint.c, server/decl_tables.c (versions 3
 * and 4: the tables declared at run time) and server/table_ckpt.c, whose
 * records server/ckpt_format.h shares.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include "ckpt_format.h"
#include "config.h"
#include "export.h"
#include "optimizer.h"
#include "ps_err.h"
#include "rows_wire.h"
#include "shardmap.h"
#include "table_decl.h"

/* The error (ps__export_fail) of a function whose exporter is ex. */
#define FAIL(...) ps__export_fail(ex, __VA_ARGS__)

/* One checkpoint file, mapped. */
struct file {
	const char *path;
	const uint8_t *p;
	uint64_t len, end;      /* end: where the CRC starts */
	int shard;
	uint32_t seq;           /* 0: the full file */
	int stale;              /* an incremental one naming another full file */
	int ntables;            /* tables it holds: the config's, then its declared ones */
	struct ps_table_cfg *decl;  /* its declared tables (ndecl), checked */
	int ndecl;
	uint64_t decl_at;       /* offset of its first declared table's record */
	int decl_differs;       /* not those registered: why in decl_why, told after the CRC */
	char decl_why[600];
};

/* Table t of file f: the config's, or one the file declares. */
static const struct ps_table_cfg *file_table(const struct exporter *ex, const struct file *f,
					     int t)
{
	return t < ex->cfg->ntables ? &ex->cfg->tables[t] : &f->decl[t - ex->cfg->ntables];
}

int ps__export_fail(struct exporter *ex, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(ex->err, sizeof(ex->err), fmt, ap);
	va_end(ap);
	return rc;
}

/* 0 when count records of size bytes at pos lie before the CRC; else the
 * error naming the file, the offset and what did not fit. */
static int need(struct exporter *ex, const struct file *f, uint64_t pos, uint64_t count,
		uint64_t size, const char *what)
{
	if (pos <= f->end && count <= (f->end - pos) / size)
		return 0;
	if (count > UINT64_MAX / size)
		return FAIL(PS_EPROTO, "%s: damaged at offset %" PRIu64 ": %s: more than any file "
			    "holds", f->path, pos, what);
	return FAIL(PS_EPROTO, "%s: truncated or damaged: %" PRIu64 " bytes for %s from "
		    "offset %" PRIu64 ", but the records end at %" PRIu64 " (file of %" PRIu64
		    " bytes)", f->path, count * size, what, pos, f->end, f->len);
}

static uint64_t mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* ---- rows of a table ---- */

static int tacc_reserve(struct tacc *a, uint64_t more)
{
	uint64_t cap = a->cap ? a->cap : 1024;

	if (a->n + more <= a->cap)
		return 0;
	while (cap < a->n + more)
		cap *= 2;
	uint64_t *ids = realloc(a->ids, cap * sizeof(*ids));
	if (ids)
		a->ids = ids;
	const uint8_t **row = realloc(a->row, cap * sizeof(*row));
	if (row)
		a->row = row;
	uint8_t *fl = realloc(a->flags, cap);
	if (fl)
		a->flags = fl;
	if (!ids || !row || !fl)
		return -ENOMEM;
	a->cap = cap;
	return 0;
}

/* The hash holds every entry; grows at half load. */
int ps__tacc_hash_sync(struct tacc *a)
{
	if (!a->hash || a->n * 2 > a->hmask + 1) {
		uint64_t size = 1024;
		while (size < a->n * 2 + 2)
			size *= 2;
		free(a->hash);
		a->hash = calloc(size, sizeof(*a->hash));
		if (!a->hash)
			return -ENOMEM;
		a->hmask = size - 1;
		a->hashed = 0;
	}
	for (; a->hashed < a->n; a->hashed++) {
		uint64_t i = mix64(a->ids[a->hashed]) & a->hmask;
		while (a->hash[i])
			i = (i + 1) & a->hmask;
		a->hash[i] = a->hashed + 1;
	}
	return 0;
}

/* Index of id, or UINT64_MAX (after tacc_hash_sync). */
uint64_t ps__tacc_find(const struct tacc *a, uint64_t id)
{
	for (uint64_t i = mix64(id) & a->hmask; a->hash[i]; i = (i + 1) & a->hmask)
		if (a->ids[a->hash[i] - 1] == id)
			return a->hash[i] - 1;
	return UINT64_MAX;
}

static int tacc_drop(struct tacc *a, uint64_t id)
{
	if (a->ndropped == a->dcap) {
		uint64_t cap = a->dcap ? a->dcap * 2 : 256;
		uint64_t *d = realloc(a->dropped, cap * sizeof(*d));
		if (!d)
			return -ENOMEM;
		a->dropped = d;
		a->dcap = cap;
	}
	a->dropped[a->ndropped++] = id;
	return 0;
}

/* ---- the declared tensors and the map ---- */

/* The declared list at pos (and version 2's groups): checked, then the
 * export's config when it has none yet, else compared with it. *pos moves
 * past them. */
static int read_declared(struct exporter *ex, const struct file *f, const struct ckpt_hdr *h,
			 int groups, uint64_t *pos)
{
	struct ps_config *c = NULL;
	char why[300];
	int rc = 0, ngroups = 0;

	if (!ex->cfg->declare)
		return FAIL(PS_ECONFIG, "%s: holds %u tensors declared by workers, but the config "
			    "names its model (model.preset, .layers or .tensors): another config?",
			    f->path, h->ndeclared);
	if (h->ndeclared > PS_MAX_TENSORS)
		return FAIL(PS_EPROTO, "%s: damaged at offset %zu: %u declared tensors, at most %d",
			    f->path, offsetof(struct ckpt_hdr, ndeclared), h->ndeclared,
			    PS_MAX_TENSORS);
	if ((rc = need(ex, f, *pos, h->ndeclared, sizeof(struct ckpt_decl),
		       "the declared tensors' list")))
		return rc;
	c = malloc(sizeof(*c));
	if (!c)
		return FAIL(-ENOMEM, "out of memory");
	memcpy(c, ex->cfg, sizeof(*c));
	c->ntensors = (int)h->ndeclared;
	for (uint32_t i = 0; i < h->ndeclared; i++, *pos += sizeof(struct ckpt_decl)) {
		struct ckpt_decl d;
		struct ps_tensor_cfg *t = &c->tensors[i];

		memcpy(&d, f->p + *pos, sizeof(d));
		if (!memchr(d.name, 0, sizeof(d.name)) || !d.name[0] || d.ndims < 0 ||
		    d.ndims > PS_MAX_DIMS) {
			rc = FAIL(PS_EPROTO, "%s: damaged at offset %" PRIu64 ": declared tensor %u "
				  "has no name or %d dimensions", f->path, *pos, i, d.ndims);
			goto out;
		}
		memset(t, 0, sizeof(*t));
		memcpy(t->name, d.name, sizeof(t->name));
		t->ndims = d.ndims;
		t->count = 1;
		for (int j = 0; j < d.ndims; j++) {
			if (d.dims[j] < 1 || d.dims[j] > (INT64_C(1) << 36) ||
			    t->count > (INT64_C(1) << 36) / d.dims[j]) {
				rc = FAIL(PS_EPROTO, "%s: damaged at offset %" PRIu64 ": declared "
					  "tensor '%s' has a damaged shape", f->path, *pos, t->name);
				goto out;
			}
			t->dims[j] = d.dims[j];
			t->count *= d.dims[j];
		}
		t->group = d.group;
	}
	if (groups) {
		struct ckpt_groups gh;
		if ((rc = need(ex, f, *pos, 1, sizeof(gh), "the optimizer groups' header")))
			goto out;
		memcpy(&gh, f->p + *pos, sizeof(gh));
		if (gh.ngroups < 1 || gh.ngroups > PS_MAX_GROUPS) {
			rc = FAIL(PS_EPROTO, "%s: damaged at offset %" PRIu64 ": %u optimizer "
				  "groups, expected 1..%d", f->path, *pos, gh.ngroups, PS_MAX_GROUPS);
			goto out;
		}
		*pos += sizeof(gh);
		if ((rc = need(ex, f, *pos, gh.ngroups, sizeof(struct ckpt_group),
			       "the optimizer groups")))
			goto out;
		for (uint32_t g = 0; g < gh.ngroups; g++, *pos += sizeof(struct ckpt_group)) {
			struct ckpt_group cg;
			memcpy(&cg, f->p + *pos, sizeof(cg));
			if (cg.kind >= PS_OPT_COUNT) {
				rc = FAIL(PS_EPROTO, "%s: damaged at offset %" PRIu64 ": optimizer "
					  "group %u of unknown kind %u", f->path, *pos, g, cg.kind);
				goto out;
			}
			c->groups[g] = (struct ps_optim_cfg){
				.kind = (enum ps_optim_kind)cg.kind, .nesterov = cg.nesterov != 0,
				.average = cg.average != 0, .lr = cg.lr, .momentum = cg.momentum,
				.dampening = cg.dampening, .beta1 = cg.beta1, .beta2 = cg.beta2,
				.eps = cg.eps, .weight_decay = cg.weight_decay, .lr_decay = cg.lr_decay,
				.initial_accumulator = cg.initial_accumulator,
			};
		}
		ngroups = (int)gh.ngroups;
		for (int i = 0; i < c->ntensors; i++)
			if (c->tensors[i].group < 0 || c->tensors[i].group >= ngroups) {
				rc = FAIL(PS_EPROTO, "%s: declared tensor '%s' has optimizer group %d "
					  "of %d (damaged?)", f->path, c->tensors[i].name,
					  c->tensors[i].group, ngroups);
				goto out;
			}
	}
	c->ngroups = ngroups;
	if (ex->ecfg && ex->ecfg->declare) {
		/* another shard's file, or an incremental one: the same list */
		int same = c->ntensors == ex->ecfg->ntensors && c->ngroups == ex->ecfg->ngroups;
		for (int i = 0; same && i < c->ntensors; i++) {
			const struct ps_tensor_cfg *a = &c->tensors[i], *b = &ex->ecfg->tensors[i];
			same = !strcmp(a->name, b->name) && a->ndims == b->ndims &&
			       !memcmp(a->dims, b->dims, sizeof(a->dims[0]) * (size_t)a->ndims) &&
			       a->group == b->group;
		}
		for (int g = 0; same && g < c->ngroups; g++)
			same = c->groups[g].kind == ex->ecfg->groups[g].kind;
		if (!same)
			rc = FAIL(PS_ECONFIG, "%s: declares other tensors or optimizer groups than "
				  "%s (files of different runs?)", f->path, ex->sh[0].path);
		goto out;
	}
	if ((rc = ps_config_declared_codecs(c, why, sizeof(why)))) {
		rc = FAIL(rc, "%s: its declared tensors: %s", f->path, why);
		goto out;
	}
	ex->ecfg = c;
	c = NULL;
out:
	free(c);
	return rc;
}

/* Versions 3 and 4: the declared tables' section at *pos, checked as the
 * shard's loader checks it (decl_tables.c: the count against the config's
 * tables and the bytes left, each record's bounds and ps_table_decl_check,
 * no name of the config's tables, none twice) into f->decl; *pos moves past
 * it. Compared with the tables registered from an earlier file (another
 * shard's, or the full one of this chain): a difference is noted in f and
 * told after the CRC, so that damage reads as damage. */
static int read_tables(struct exporter *ex, struct file *f, uint64_t *pos)
{
	const struct ps_config *e = ex->ecfg;
	int nyaml = ex->cfg->ntables, rc;
	struct ckpt_tables_head th;
	char why[400];

	if ((rc = need(ex, f, *pos, 1, sizeof(th), "the declared tables' header")))
		return rc;
	memcpy(&th, f->p + *pos, sizeof(th));
	if (th.ntables < 1 || th.ntables > (uint32_t)(PS_MAX_TABLES - nyaml))
		return FAIL(PS_EPROTO, "%s: damaged at offset %" PRIu64 ": %u declared tables, "
			    "expected 1..%d beside the config's %d", f->path, *pos, th.ntables,
			    PS_MAX_TABLES - nyaml, nyaml);
	*pos += sizeof(th);
	if ((rc = need(ex, f, *pos, th.ntables, sizeof(struct ckpt_table_decl),
		       "the declared tables")))
		return rc;
	f->decl = calloc(th.ntables, sizeof(*f->decl));
	if (!f->decl)
		return FAIL(-ENOMEM, "out of memory");
	for (uint32_t i = 0; i < th.ntables; i++, *pos += sizeof(struct ckpt_table_decl)) {
		struct ckpt_table_decl d;
		struct ps_table_cfg *t = &f->decl[i];

		memcpy(&d, f->p + *pos, sizeof(d));
		if (ckpt_table_decl_get(&d, t))
			return FAIL(PS_EPROTO, "%s: damaged at offset %" PRIu64 ": declared table %u "
				    "has a name without its end or a value out of bounds", f->path,
				    *pos, i);
		if (ps_table_decl_check(t, why, sizeof(why)))
			return FAIL(PS_EPROTO, "%s: damaged at offset %" PRIu64 ": declared table %u: "
				    "%s", f->path, *pos, i, why);
		for (int j = 0; j < nyaml; j++)
			if (!strcmp(ex->cfg->tables[j].name, t->name))
				return FAIL(PS_ECONFIG, "%s: at offset %" PRIu64 ": declared table '%s' "
					    "is a table of the config (model.embeddings): another "
					    "config, or damaged?", f->path, *pos, t->name);
		for (uint32_t j = 0; j < i; j++)
			if (!strcmp(f->decl[j].name, t->name))
				return FAIL(PS_EPROTO, "%s: damaged at offset %" PRIu64 ": declared "
					    "table '%s' twice", f->path, *pos, t->name);
	}
	f->ndecl = (int)th.ntables;
	f->ntables = nyaml + f->ndecl;
	f->decl_at = *pos - th.ntables * sizeof(struct ckpt_table_decl);
	if (e && e->ndecl_tables) {
		uint64_t at = f->decl_at;
		if (f->ndecl != e->ndecl_tables) {
			f->decl_differs = 1;
			snprintf(f->decl_why, sizeof(f->decl_why), "%d declared tables at offset %"
				 PRIu64 ", that file has %d", f->ndecl, at, e->ndecl_tables);
		}
		for (int i = 0; !f->decl_differs && i < f->ndecl;
		     i++, at += sizeof(struct ckpt_table_decl))
			if (ps_table_decl_diff(&f->decl[i], &e->tables[nyaml + i], "here",
					       "there", why, sizeof(why))) {
				f->decl_differs = 1;
				snprintf(f->decl_why, sizeof(f->decl_why), "declared table %d at offset %"
					 PRIu64 " differs: %s", i, at, why);
			}
	}
	return 0;
}

/* Registers f's declared tables as the export's (after its CRC matched):
 * the config's tables, then these, in declaration order. */
static int register_tables(struct exporter *ex, const struct file *f)
{
	struct ps_config *e = ex->ecfg;

	if (!e) {
		/* a config naming its tensors: a copy for the tables alone */
		e = malloc(sizeof(*e));
		if (!e)
			return FAIL(-ENOMEM, "out of memory");
		memcpy(e, ex->cfg, sizeof(*e));
		ex->ecfg = e;
	}
	memcpy(&e->tables[ex->cfg->ntables], f->decl, sizeof(*f->decl) * (size_t)f->ndecl);
	e->ntables = ex->cfg->ntables + f->ndecl;
	e->ndecl_tables = f->ndecl;
	snprintf(ex->decl_from, sizeof(ex->decl_from), "%s", f->path);
	return 0;
}

/* The map of the config (or of the declared tensors), built once. */
static int build_map(struct exporter *ex)
{
	const struct ps_config *c = ex->ecfg ? ex->ecfg : ex->cfg;
	int rc;

	if (ex->have_map)
		return 0;
	rc = ps_shardmap_init(&ex->map, c);
	if (rc)
		return FAIL(rc, "cannot build the shard map: %s", ps_strerror(rc));
	ex->have_map = 1;
	ex->dense = calloc((size_t)(c->ntensors ? c->ntensors : 1), sizeof(*ex->dense));
	if (!ex->dense)
		return FAIL(-ENOMEM, "out of memory");
	for (int t = 0; t < c->ntensors; t++)
		if (!(ex->dense[t] = calloc((size_t)c->tensors[t].count, sizeof(float))))
			return FAIL(-ENOMEM, "out of memory for tensor '%s'", c->tensors[t].name);
	return 0;
}

/* ---- one file ---- */

static int slot_nstate(const struct exporter *ex, int version, int tensor, uint32_t hdr_nstate)
{
	if ((version - 1) & CKPT_V_GROUPS)
		return ps_optimizer_get(ex->ecfg->groups[ex->ecfg->tensors[tensor].group].kind)->nstate;
	return (int)hdr_nstate;
}

/* The records after the header and the declared list, walked twice: with
 * apply == 0 every length and value is checked (nothing used), with
 * apply == 1, after the CRC matched, the data is copied out. */
static int walk_records(struct exporter *ex, struct file *f, const struct ckpt_hdr *h,
			int version, uint64_t pos, int apply, uint8_t *seen)
{
	const struct ps_config *c = ex->ecfg ? ex->ecfg : ex->cfg;
	struct shard_info *si = &ex->sh[f->shard];
	int rc, changed = ex->since >= 0 && f->seq > (uint32_t)ex->since;
	char what[200];

	if (apply) {
		si->min_version = UINT64_MAX;
		si->max_version = 0;
	}
	for (uint32_t k = 0; k < h->nslots; k++) {
		struct ckpt_slot cs;
		const struct ps_slice *sl;
		int ns;

		if ((rc = need(ex, f, pos, 1, sizeof(cs), "a slice record")))
			return rc;
		memcpy(&cs, f->p + pos, sizeof(cs));
		if (cs.slice >= ex->map.nslices || ex->map.slices[cs.slice].shard != f->shard ||
		    cs.count != (uint64_t)ex->map.slices[cs.slice].count)
			return FAIL(PS_EPROTO, "%s: damaged at offset %" PRIu64 ": slice record %u "
				    "names slice %u of %" PRIu64 " values, which is not one of this "
				    "shard's", f->path, pos, k, cs.slice, cs.count);
		sl = &ex->map.slices[cs.slice];
		if (!apply && seen[cs.slice]++)
			return FAIL(PS_EPROTO, "%s: damaged at offset %" PRIu64 ": slice %u "
				    "appears twice", f->path, pos, cs.slice);
		ns = slot_nstate(ex, version, sl->tensor, h->nstate);
		pos += sizeof(cs);
		snprintf(what, sizeof(what), "slice %u's weights and optimizer state", cs.slice);
		if ((rc = need(ex, f, pos, cs.count, sizeof(float) * (uint64_t)(1 + ns), what)))
			return rc;
		if (apply) {
			memcpy(ex->dense[sl->tensor] + sl->offset, f->p + pos,
			       (size_t)cs.count * sizeof(float));
			if (cs.version < si->min_version)
				si->min_version = cs.version;
			if (cs.version > si->max_version)
				si->max_version = cs.version;
		}
		pos += cs.count * sizeof(float) * (uint64_t)(1 + ns);
	}
	if ((rc = need(ex, f, pos, (uint64_t)c->nworkers, 8, "the workers' finished clocks")))
		return rc;
	if (apply)
		memcpy(si->finished, f->p + pos, (size_t)c->nworkers * 8);
	pos += (uint64_t)c->nworkers * 8;
	if ((version - 1) & CKPT_V_EPOCH) {
		struct ckpt_map cm;
		if ((rc = need(ex, f, pos, 1, sizeof(cm), "the map epoch")))
			return rc;
		memcpy(&cm, f->p + pos, sizeof(cm));
		if (apply)
			si->map_epoch = cm.epoch;
		pos += sizeof(cm);
	}
	if (!f->ntables && f->seq)
		return FAIL(PS_ECONFIG, "%s: an incremental checkpoint, but the config has no "
			    "embedding tables and it declares none", f->path);
	if (f->seq && f->ntables) {
		struct ckpt_delta_head dh;
		if ((rc = need(ex, f, pos, 1, sizeof(dh), "the incremental header")))
			return rc;
		memcpy(&dh, f->p + pos, sizeof(dh));
		if (dh.magic != CKPT_DELTA_MAGIC || dh.seq != f->seq)
			return FAIL(PS_EPROTO, "%s: damaged at offset %" PRIu64 ": not incremental "
				    "checkpoint %u of the chain", f->path, pos, f->seq);
		if (dh.base_crc != si->base_crc || dh.base_len != si->base_len)
			f->stale = 1; /* told after the CRC: damage is no staleness */
		pos += sizeof(dh);
	}
	for (int t = 0; t < f->ntables; t++) {
		const struct ps_table_cfg *tc = file_table(ex, f, t);
		struct tacc *a = &ex->tab[t];
		struct ckpt_table ct;
		uint64_t rb, rows_at;
		int dim = tc->dim, rf = tc->dim + ps_row_optim_nstate(tc);

		snprintf(what, sizeof(what), "the header of table '%s'", tc->name);
		if ((rc = need(ex, f, pos, 1, sizeof(ct), what)))
			return rc;
		memcpy(&ct, f->p + pos, sizeof(ct));
		if ((ct.key != ps_rows_table_key(tc) || ct.dim != (uint32_t)dim ||
		     ct.row_floats != (uint32_t)rf) && t >= ex->cfg->ntables)
			return FAIL(PS_EPROTO, "%s: damaged at offset %" PRIu64 ": table %d is not "
				    "'%s' of dim %d with %d floats of optimizer state as its declaration "
				    "at offset %" PRIu64 " says", f->path, pos, t, tc->name, dim, rf - dim,
				    f->decl_at + (uint64_t)(t - ex->cfg->ntables) *
				    sizeof(struct ckpt_table_decl));
		if (ct.key != ps_rows_table_key(tc) || ct.dim != (uint32_t)dim ||
		    ct.row_floats != (uint32_t)rf)
			return FAIL(PS_EPROTO, "%s: at offset %" PRIu64 ": table %d is not '%s' of "
				    "dim %d with %d floats of optimizer state as configured (damaged, or "
				    "name, dim or optimizer changed)", f->path, pos, t, tc->name, dim,
				    rf - dim);
		pos += sizeof(ct);
		rb = sizeof(struct ckpt_row) + (uint64_t)rf * sizeof(float);
		if (f->seq) {
			snprintf(what, sizeof(what), "the %" PRIu64 " dropped ids of table '%s'",
				 ct.ntombs, tc->name);
			if ((rc = need(ex, f, pos, ct.ntombs, 8, what)))
				return rc;
			if (apply && ct.ntombs) {
				if ((rc = ps__tacc_hash_sync(a)))
					return FAIL(rc, "out of memory");
				for (uint64_t i = 0; i < ct.ntombs; i++) {
					uint64_t id, at;
					memcpy(&id, f->p + pos + i * 8, 8);
					at = ps__tacc_find(a, id);
					if (at != UINT64_MAX)
						a->flags[at] &= (uint8_t)~F_LIVE;
					if (changed && tacc_drop(a, id))
						return FAIL(-ENOMEM, "out of memory");
				}
			}
			pos += ct.ntombs * 8;
		}
		snprintf(what, sizeof(what), "the %" PRIu64 " rows of table '%s'", ct.nrows, tc->name);
		if ((rc = need(ex, f, pos, ct.nrows, rb, what)))
			return rc;
		rows_at = pos;
		if (!apply) {
			/* every row's id must be this shard's */
			for (uint64_t i = 0; i < ct.nrows; i++) {
				uint64_t id;
				memcpy(&id, f->p + rows_at + i * rb, 8);
				if (ps_rows_shard_placed(ct.key, id, c->nshards, ex->map.placement) !=
				    f->shard)
					return FAIL(PS_EPROTO, "%s: at offset %" PRIu64 ": row %" PRIu64
						    " of table '%s' has id %" PRIu64 ", which lives on "
						    "another shard (damaged?)", f->path, rows_at + i * rb,
						    i, tc->name, id);
			}
		} else if (!f->seq) {
			if (tacc_reserve(a, ct.nrows))
				return FAIL(-ENOMEM, "out of memory for table '%s'", tc->name);
			for (uint64_t i = 0; i < ct.nrows; i++) {
				const uint8_t *r = f->p + rows_at + i * rb;
				memcpy(&a->ids[a->n], r, 8);
				a->row[a->n] = r + sizeof(struct ckpt_row);
				a->flags[a->n++] = F_LIVE;
			}
		} else if (ct.nrows) {
			if (tacc_reserve(a, ct.nrows) || ps__tacc_hash_sync(a))
				return FAIL(-ENOMEM, "out of memory for table '%s'", tc->name);
			for (uint64_t i = 0; i < ct.nrows; i++) {
				const uint8_t *r = f->p + rows_at + i * rb;
				uint64_t id, at;
				memcpy(&id, r, 8);
				at = ps__tacc_find(a, id);
				if (at == UINT64_MAX) {
					at = a->n++;
					a->ids[at] = id;
					a->flags[at] = 0;
					if (ps__tacc_hash_sync(a))
						return FAIL(-ENOMEM, "out of memory");
				}
				a->row[at] = r + sizeof(struct ckpt_row);
				a->flags[at] |= F_LIVE | (changed ? F_CHANGED : 0);
			}
		}
		pos += ct.nrows * rb;
		snprintf(what, sizeof(what), "the admission filter of table '%s'", tc->name);
		if ((rc = need(ex, f, pos, ct.filter_slots, 4, what)))
			return rc;
		pos += ct.filter_slots * 4;
		if (apply)
			si->table_version[t] = ct.version;
	}
	if (pos != f->end)
		return FAIL(PS_EPROTO, "%s: damaged at offset %" PRIu64 ": %" PRIu64 " bytes after "
			    "the last record (made with other tables?)", f->path, pos, f->end - pos);
	return 0;
}

static int walk(struct exporter *ex, struct file *f, const struct ckpt_hdr *h, int version,
		uint64_t pos, int apply)
{
	uint8_t *seen = apply ? NULL : calloc(ex->map.nslices + 1, 1);
	int rc;

	if (!apply && !seen)
		return FAIL(-ENOMEM, "out of memory");
	rc = walk_records(ex, f, h, version, pos, apply, seen);
	free(seen);
	return rc;
}

/* Exports file seq of shard k's chain (0: the full one). 0; -ENOENT when
 * an incremental one does not exist; -ESTALE when it builds on another
 * full file; else an error in ex->err. */
static int read_file(struct exporter *ex, int k, const char *path, uint32_t seq)
{
	struct file f = { .path = path, .shard = k, .seq = seq, .ntables = ex->cfg->ntables };
	struct shard_info *si = &ex->sh[k];
	struct ckpt_hdr h;
	struct stat st;
	void *map = MAP_FAILED;
	int fd, rc = 0, version;
	uint64_t pos, nstate;
	uint32_t crc, want_slots = 0;

	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0) {
		if (errno == ENOENT && seq)
			return -ENOENT;
		return FAIL(-errno, "%s: cannot read: %s%s", path, strerror(errno),
			    errno == ENOENT ? " (no checkpoint of this shard: is checkpoint.dir, or "
			    "--dir, right?)" : errno == ELOOP ? " (a symbolic link: give the file "
			    "itself)" : "");
	}
	if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
		rc = FAIL(PS_EPROTO, "%s: not a regular file", path);
		goto out;
	}
	f.len = (uint64_t)st.st_size;
	if (f.len < sizeof(h) + 4) {
		rc = FAIL(PS_EPROTO, "%s: %" PRIu64 " bytes, too short for a checkpoint "
			  "(truncated?)", path, f.len);
		goto out;
	}
	f.end = f.len - 4;
	map = mmap(NULL, (size_t)f.len, PROT_READ, MAP_PRIVATE, fd, 0);
	if (map == MAP_FAILED) {
		rc = FAIL(-errno, "%s: cannot map it: %s", path, strerror(errno));
		goto out;
	}
	f.p = map;
	/* kept until the export is written (the rows are read from it) */
	if (ex->nmaps == ex->mapcap) {
		int cap = ex->mapcap ? ex->mapcap * 2 : 16;
		struct ps_export_map *m = realloc(ex->maps, (size_t)cap * sizeof(*m));
		if (!m) {
			rc = FAIL(-ENOMEM, "out of memory");
			goto out;
		}
		ex->maps = m;
		ex->mapcap = cap;
	}
	memcpy(&h, f.p, sizeof(h));
	/* "PSCKPT0" v or "PSDELTA" v, v 1..8 */
	version = !memcmp(h.magic, seq ? "PSDELTA" : "PSCKPT0", 7) && h.magic[7] >= '1' &&
		  h.magic[7] <= '0' + CKPT_V_MAX ? h.magic[7] - '0' : 0;
	if (!version) {
		rc = FAIL(PS_EPROTO, "%s: damaged at offset 0: not a ps-server %scheckpoint "
			  "(bad magic)", path, seq ? "incremental " : "");
		goto out;
	}
	if (h.endian != CKPT_ENDIAN) {
		rc = FAIL(PS_EPROTO, "%s: written on a machine of the other byte order, or "
			  "damaged at offset 8", path);
		goto out;
	}
	if (h.shard != k) {
		rc = FAIL(PS_ECONFIG, "%s: belongs to shard %d (offset 12), expected shard %d",
			  path, h.shard, k);
		goto out;
	}
	pos = sizeof(h);
	if (((version - 1) & CKPT_V_GROUPS) && !h.ndeclared) {
		rc = FAIL(PS_EPROTO, "%s: a version %d checkpoint (optimizer groups) without "
			  "declared tensors (damaged?)", path, version);
		goto out;
	}
	if (h.ndeclared || ex->cfg->declare) {
		if ((rc = read_declared(ex, &f, &h, (version - 1) & CKPT_V_GROUPS, &pos)))
			goto out;
	}
	if (((version - 1) & CKPT_V_TABLES) && (rc = read_tables(ex, &f, &pos)))
		goto out;
	if ((rc = build_map(ex)))
		goto out;
	/* along a chain the groups stay; declared tables may appear (declared
	 * after the full checkpoint) but never go, as the shard's loader says */
	if (seq && ((((version - 1) ^ (si->last_version - 1)) & CKPT_V_GROUPS) ||
		    (((si->last_version - 1) & CKPT_V_TABLES) && !((version - 1) & CKPT_V_TABLES)))) {
		rc = FAIL(PS_EPROTO, "%s: a version %d checkpoint after a version %d one", path,
			  version, si->last_version);
		goto out;
	}
	if (h.map_hash != ex->map.hash && !ex->map_seen) {
		/* a build before re-sharding placed slices and rows otherwise
		 * (placement 0): its checkpoints are read with its map */
		const struct ps_config *c = ex->ecfg ? ex->ecfg : ex->cfg;
		struct ps_shardmap old;
		if (!ps_shardmap_init_placed(&old, c, PS_PLACE_GREEDY)) {
			if (old.hash == h.map_hash) {
				ps_shardmap_free(&ex->map);
				ex->map = old;
			} else {
				ps_shardmap_free(&old);
			}
		}
	}
	ex->map_seen = 1;
	if (h.map_hash != ex->map.hash) {
		rc = FAIL(PS_ECONFIG, "%s: made with another configuration: shard map %016"
			  PRIx64 " there, %016" PRIx64 " here (servers, tensors, tables or "
			  "slice_bytes changed)", path, h.map_hash, ex->map.hash);
		goto out;
	}
	nstate = (uint64_t)ps_optimizer_get(ex->cfg->optim.kind)->nstate;
	if (h.optimizer != (uint32_t)ex->cfg->optim.kind) {
		rc = FAIL(PS_ECONFIG, "%s: made with optimizer %s, the config says %s", path,
			  h.optimizer < PS_OPT_COUNT ? ps_optim_name((enum ps_optim_kind)h.optimizer) :
			  "(damaged)", ps_optim_name(ex->cfg->optim.kind));
		goto out;
	}
	if (h.nstate != nstate) {
		rc = FAIL(PS_EPROTO, "%s: damaged at offset 28: %u floats of optimizer state a "
			  "value, optimizer %s keeps %" PRIu64, path, h.nstate,
			  ps_optim_name(ex->cfg->optim.kind), nstate);
		goto out;
	}
	if (h.nworkers != (uint32_t)ex->cfg->nworkers) {
		rc = FAIL(PS_ECONFIG, "%s: made for %u workers, the config says %d", path,
			  h.nworkers, ex->cfg->nworkers);
		goto out;
	}
	for (uint32_t i = 0; i < ex->map.nslices; i++)
		want_slots += ex->map.slices[i].shard == k;
	if (h.nslots != want_slots) {
		rc = FAIL(PS_EPROTO, "%s: holds %u slices, shard %d owns %u (damaged?)", path,
			  h.nslots, k, want_slots);
		goto out;
	}
	/* every record checked (offsets named), then the checksum, then used */
	if ((rc = walk(ex, &f, &h, version, pos, 0)))
		goto out;
	memcpy(&crc, f.p + f.end, 4);
	{
		uint32_t got = (uint32_t)crc32_z(crc32(0L, Z_NULL, 0), f.p, (size_t)f.end);
		if (got != crc) {
			rc = FAIL(PS_EPROTO, "%s: checksum mismatch: the CRC-32 of bytes 0..%"
				  PRIu64 " is %08x, the file's last 4 bytes (offset %" PRIu64 ") say "
				  "%08x: the file is damaged", path, f.end, got, f.end, crc);
			goto out;
		}
	}
	if (f.stale) {
		rc = -ESTALE;
		goto out;
	}
	if (f.decl_differs) {
		/* whole and not damaged: another run's tables */
		rc = FAIL(PS_ECONFIG, "%s: declares other tables than %s (files of different "
			  "runs?): %s", path, ex->decl_from, f.decl_why);
		goto out;
	}
	if (f.ndecl && !(ex->ecfg && ex->ecfg->ndecl_tables) && (rc = register_tables(ex, &f)))
		goto out;
	if (!seq) {
		si->version = version;
		si->base_crc = crc;
		si->base_len = f.len;
	}
	si->last_version = version;
	rc = walk(ex, &f, &h, version, pos, 1);
	if (!rc) {
		ex->maps[ex->nmaps++] = (struct ps_export_map){ map, (size_t)f.len };
		map = MAP_FAILED;
	}
out:
	if (map != MAP_FAILED)
		munmap(map, (size_t)f.len);
	close(fd);
	free(f.decl);
	return rc;
}

/* Shard k's full checkpoint and its chain. */
int ps__export_read_shard(struct exporter *ex, const char *dir, int k, int quiet)
{
	struct shard_info *si = &ex->sh[k];
	char dp[4300];
	int rc;

	snprintf(si->path, sizeof(si->path), "%s/shard-%d.ckpt", dir, k);
	if ((rc = read_file(ex, k, si->path, 0)))
		return rc;
	for (uint32_t n = 1;; n++) {
		snprintf(dp, sizeof(dp), "%s.delta-%u", si->path, n);
		rc = read_file(ex, k, dp, n);
		if (rc == -ENOENT)
			break;
		if (rc == -ESTALE) {
			/* the shard would set it aside too */
			if (!quiet)
				fprintf(stderr, "ps-export: %s builds on an older full checkpoint (left "
					"by a crash): not applied, nor any after it\n", dp);
			break;
		}
		if (rc)
			return rc;
		si->deltas = n;
	}
	if (ex->since >= 0 && si->deltas < (uint32_t)ex->since)
		return FAIL(-EINVAL, "--since %d: shard %d has only %u incremental checkpoints "
			    "after its full one %s (a newer full checkpoint restarted the chain: "
			    "export everything)", ex->since, k, si->deltas, si->path);
	return 0;
}

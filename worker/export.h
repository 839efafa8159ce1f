/* export.h - ps-export's state (worker/ps_export.c writes the .npz,
 * worker/export_read.c reads the checkpoints into it). */
#ifndef PS_EXPORT_H
#define PS_EXPORT_H

#include <stdint.h>
#include "config.h"
#include "shardmap.h"

#define F_LIVE 1
#define F_CHANGED 2

/* One table's rows from every shard, in the order read. */
struct tacc {
	uint64_t *ids;
	const uint8_t **row;    /* n: the row's dim floats, inside a mapped checkpoint */
	uint8_t *flags;         /* F_LIVE, F_CHANGED */
	uint64_t n, cap;
	uint64_t *hash;         /* index + 1, 0 = empty; built when a delta needs it */
	uint64_t hmask, hashed; /* entries [0, hashed) are in it */
	uint64_t *dropped;      /* --since: ids dropped by the deltas after it */
	uint64_t ndropped, dcap;
};

/* What meta.json says of a shard. */
struct shard_info {
	char path[4200];
	int version;            /* of the full file: 1..8 (ckpt_format.h's CKPT_V_* bits) */
	uint64_t map_epoch;     /* re-shards the state went through (versions 5..8; else 0) */
	int last_version;       /* of the last file applied (a delta may add the tables bit) */
	uint32_t deltas;        /* incremental checkpoints applied */
	uint32_t base_crc;
	uint64_t base_len;
	uint64_t min_version, max_version;
	uint64_t *finished;
	uint64_t *table_version;      /* PS_MAX_TABLES */
};

struct exporter {
	const struct ps_config *cfg;  /* as loaded */
	/* with the declared tensors (cfg->declare) and the declared tables
	 * (versions 3 and 4: after the config's, in declaration order); NULL
	 * while the files read had neither */
	struct ps_config *ecfg;
	struct ps_shardmap map;
	int have_map;
	int map_seen;           /* a file's map hash compared with it (the placement
				   is settled: the first file's, 1 or 0) */
	int since;                    /* -1: everything */
	float **dense;                /* per tensor */
	struct tacc *tab;             /* PS_MAX_TABLES */
	char decl_from[4300];         /* the file whose declared tables were registered */
	struct shard_info *sh;
	/* the checkpoints read, mapped until the export is written: the
	 * tables' rows are taken from there, not copied */
	struct ps_export_map { void *p; size_t len; } *maps;
	int nmaps, mapcap;
	char err[1024];
};

/* Formats the error into ex->err; returns rc. */
int ps__export_fail(struct exporter *ex, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* The hash of a's ids holds every entry (grown at half load); 0 or
 * -ENOMEM. Then ps__tacc_find gives id's index, or UINT64_MAX. */
int ps__tacc_hash_sync(struct tacc *a);
uint64_t ps__tacc_find(const struct tacc *a, uint64_t id);

/* Reads shard k's full checkpoint in dir and its incremental ones into
 * ex (ex->since decides which rows count as changed): 0, or a negative
 * code with the reason, naming the file and offset, in ex->err. quiet:
 * no line for a chain cut short by a stale delta. */
int ps__export_read_shard(struct exporter *ex, const char *dir, int k, int quiet);

#endif

/* ckpt_format.h - the records of a shard's checkpoint file, shared by the
 * shard (checkpoint.c writes and loads the dense part, table_ckpt.c the
 * embedding tables) and by ps-export (worker/ps_export.c), which reads the
 * files offline. The order of the records is described at the head of
 * checkpoint.c and table_ckpt.c; every record is in the host's byte order
 * (the header's endian field says which), and the file ends in a CRC-32
 * (zlib) of every byte before it.
 */
#ifndef PS_CKPT_FORMAT_H
#define PS_CKPT_FORMAT_H

#include <stdint.h>
#include <string.h>
#include "config.h"

#define CKPT_MAGIC "PSCKPT01"
#define CKPT_DELTA "PSDELTA1"
#define CKPT_MAGIC2 "PSCKPT02"
#define CKPT_DELTA2 "PSDELTA2"
#define CKPT_ENDIAN 0x01020304u
/* Versions 1..8: bits of version - 1 (checkpoint.c's head): optimizer
 * groups, declared tables (a section after the declared tensors and groups,
 * server/decl_tables.c), the map epoch. The magic of version v: "PSCKPT0" v, "PSDELTA" v. */
#define CKPT_V_GROUPS 1
#define CKPT_V_TABLES 2
/* Bit 2 (versions 5..8): the state went through a re-shard; a struct
 * ckpt_map follows the workers' finished clocks (before the tables' rows).
 * A file without it is of map epoch 0, and a shard of epoch 0 writes none,
 * so a cluster never re-sharded writes the files of builds before it. */
#define CKPT_V_EPOCH 4
#define CKPT_V_MAX 8

struct ckpt_hdr {
	char magic[8];
	uint32_t endian;
	int32_t shard;
	uint64_t map_hash;
	uint32_t optimizer;
	uint32_t nstate;
	uint32_t nworkers;
	uint32_t consistency;
	uint32_t nslots;
	uint32_t ndeclared;         /* struct ckpt_decl entries after the header */
};

struct ckpt_decl {
	char name[PS_NAME_MAX];
	int32_t ndims;
	int32_t group;              /* version 2: its optimizer group; else 0 */
	int64_t dims[PS_MAX_DIMS];
};

/* Version 2: the optimizer groups, after the declared list. */
struct ckpt_groups {
	uint32_t ngroups;
	uint32_t reserved;
};

struct ckpt_group {
	uint32_t kind;              /* enum ps_optim_kind */
	uint32_t nesterov, average, reserved;
	float lr, momentum, dampening, beta1, beta2, eps, weight_decay, lr_decay;
	float initial_accumulator, pad;
};

struct ckpt_slot {
	uint32_t slice;
	uint32_t reserved;
	uint64_t count;
	uint64_t version;
	uint64_t steps;
};

/* Versions 5..8: the map epoch, the number of re-shards the state went
 * through (server/reshard.c: the old shards' epoch plus one). */
struct ckpt_map {
	uint64_t epoch;
	uint64_t reserved;
};

/* ---- versions 3 and 4: the declared tables (server/decl_tables.c) ---- */

/* After the declared tensors and groups (right after the header when
 * there are none), before the slices. */
struct ckpt_tables_head {
	uint32_t ntables;
	uint32_t reserved;
};

/* One declared table: model.embeddings[]'s keys (enums as in config.h:
 * init 0 zeros, 1 const, 2 uniform, 3 normal; optimizer 0 sgd, 1 adagrad,
 * 2 rowwise_adagrad, 3 adam, 4 ftrl). 136 bytes. */
struct ckpt_table_decl {
	char name[PS_NAME_MAX];     /* NUL-terminated */
	uint32_t dim, init, optimizer, admission;
	float init_value, lr, eps, beta1, beta2, initial_accumulator, l1, l2, ftrl_beta;
	uint32_t ttl_s;
	uint64_t max_rows, filter_ids;
};
_Static_assert(sizeof(struct ckpt_table_decl) == 136, "ckpt_table_decl layout");

/* d into t (zeroed first): 0, or -1 when a field is out of what any
 * declaration holds (a name without its NUL, dim, an enum, a bound); the
 * rest is ps_table_decl_check's (table_decl.h). One decoder, so the shard's
 * loader and ps-export refuse the same records. */
static inline int ckpt_table_decl_get(const struct ckpt_table_decl *d, struct ps_table_cfg *t)
{
	if (!memchr(d->name, 0, sizeof(d->name)) || d->dim > PS_MAX_ROW_DIM ||
	    d->init > PS_INIT_NORMAL || d->optimizer >= PS_ROPT_COUNT || d->admission > 255 ||
	    d->ttl_s > (1u << 30) || d->max_rows > (UINT64_C(1) << 40) ||
	    d->filter_ids > (UINT64_C(1) << 32))
		return -1;
	memset(t, 0, sizeof(*t));
	memcpy(t->name, d->name, sizeof(t->name));
	t->dim = (int)d->dim;
	t->init = (enum ps_init_kind)d->init;
	t->optimizer = (int)d->optimizer;
	t->admission = (int)d->admission;
	t->init_value = d->init_value;
	t->lr = d->lr;
	t->eps = d->eps;
	t->beta1 = d->beta1;
	t->beta2 = d->beta2;
	t->initial_accumulator = d->initial_accumulator;
	t->l1 = d->l1;
	t->l2 = d->l2;
	t->ftrl_beta = d->ftrl_beta;
	t->ttl_s = (int)d->ttl_s;
	t->max_rows = (int64_t)d->max_rows;
	t->filter_ids = (int64_t)d->filter_ids;
	return 0;
}

/* ---- the embedding tables' part (table_ckpt.c) ---- */

struct ckpt_table {
	uint64_t key;           /* ps_rows_table_key */
	uint32_t dim, row_floats;
	uint64_t version, nrows, filter_slots;
	uint64_t admitted, evicted, expired;
	uint64_t filter_lookups, filter_hits, filter_decays;
	uint64_t ntombs;        /* incremental only: dropped ids that follow */
	uint64_t live_rows;     /* rows the table holds (incremental: after applying it) */
	double wall;            /* time of the snapshot (time(2), fractional) */
};

struct ckpt_delta_head {
	uint32_t magic;         /* CKPT_DELTA_MAGIC */
	uint32_t seq;           /* 1 for the first after the full file */
	uint32_t base_crc;
	uint32_t reserved;
	uint64_t base_len;
};
#define CKPT_DELTA_MAGIC 0x31544c44u /* "DLT1" */

struct ckpt_row {
	uint64_t id;
	uint32_t age;           /* seconds since its last update, at the snapshot */
	uint32_t reserved;
};

#endif

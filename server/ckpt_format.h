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
#include "config.h"

#define CKPT_MAGIC "PSCKPT01"
#define CKPT_DELTA "PSDELTA1"
#define CKPT_MAGIC2 "PSCKPT02"
#define CKPT_DELTA2 "PSDELTA2"
#define CKPT_ENDIAN 0x01020304u
/* Versions 1..4: bits of version - 1 (checkpoint.c's head): optimizer
 * groups, declared tables (a section after the declared tensors and groups,
 * server/decl_tables.c). The magic of version v: "PSCKPT0" v, "PSDELTA" v. */
#define CKPT_V_GROUPS 1
#define CKPT_V_TABLES 2

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

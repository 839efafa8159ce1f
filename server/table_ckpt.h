/* table_ckpt.h - the embedding tables' part of a checkpoint (layout in
 * table_ckpt.c), written and read by checkpoint.c after the dense state. */
#ifndef PS_TABLE_CKPT_H
#define PS_TABLE_CKPT_H

#include <stddef.h>
#include <stdint.h>

struct ps_server;

/* Bytes the tables take in a checkpoint now. */
size_t ps__rows_ckpt_size(const struct ps_server *s);
/* Copies them to b (ps__rows_ckpt_size bytes; loop thread). */
void ps__rows_ckpt_snapshot(const struct ps_server *s, uint8_t *b);
/* The same with the ages taken at now (ps_now_s): a row's stamp is then
 * ps_table_stamp(now) minus its age (the replication snapshot). */
void ps__rows_ckpt_snapshot_at(const struct ps_server *s, uint8_t *b, double now);
/* Checks the tables' part of a file, bytes [pos, end) of fd, against the
 * config: 0, or PS_ECONFIG / PS_EPROTO with the reason in err. */
int ps__rows_ckpt_check(const struct ps_server *s, int fd, uint64_t pos, uint64_t end,
			char *err, size_t errlen);
/* Restores them (after a successful check, into empty tables). */
int ps__rows_ckpt_restore(struct ps_server *s, int fd, uint64_t pos, char *err, size_t errlen);

/* Incremental checkpoints: whether one is right now (every dropped id was
 * remembered), its size, and the copy (seq: its place after the full file
 * of CRC base_crc and base_len bytes). */
int ps__rows_delta_possible(const struct ps_server *s);
size_t ps__rows_delta_size(const struct ps_server *s);
void ps__rows_delta_snapshot(const struct ps_server *s, uint8_t *b, uint32_t seq,
			     uint32_t base_crc, uint64_t base_len);
/* After any snapshot: the next incremental one starts from here. */
void ps__rows_ckpt_taken(struct ps_server *s);
/* Checks incremental checkpoint seq (its tables' part, bytes pos..end of
 * fd) against the full file it must build on; 0, -ESTALE when it builds
 * on another full file, or another negative code with err. */
int ps__rows_delta_check(const struct ps_server *s, int fd, uint64_t pos, uint64_t end,
			 uint32_t seq, uint32_t base_crc, uint64_t base_len, char *err,
			 size_t errlen);
int ps__rows_delta_restore(struct ps_server *s, int fd, uint64_t pos, char *err, size_t errlen);

#endif

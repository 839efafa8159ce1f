/* checkpoint.h - a shard's state on disk (config `checkpoint`).
 *
 * One file per shard, <checkpoint.dir>/shard-<k>.ckpt: the weights and
 * optimizer state of every slice the shard owns, each slice's version and
 * optimizer step count, every worker's finished clock, and what the state
 * belongs to (shard, shard-map hash, optimizer, number of workers,
 * consistency), followed by a CRC-32 of everything before it.
 *
 * Writing goes to a temporary file in the same folder (created exclusively,
 * mode 0600, under a fresh name, so nothing planted there is written
 * through), which is fsynced,
 * renamed over the old checkpoint and followed by an fsync of the folder,
 * so a crash at any point leaves either the old or the new checkpoint,
 * never a torn one. Gradients of a sync clock that is not complete yet are
 * not part of the state (they were never applied); docs/consistency.md and
 * docs/operations.md say what that means after a restart.
 *
 * Byte order is the host's (little-endian on every supported machine); the
 * header records it and a file from the other order is refused.
 */
#ifndef PS_CHECKPOINT_H
#define PS_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

struct ps_server;

/* Path of shard's checkpoint inside dir (into buf, len bytes). */
void ps_checkpoint_path(const char *dir, int shard, char *buf, size_t len);

/* The file's bytes (all but the trailing CRC), copied from the shard. */
struct ps_ckpt_image {
	uint8_t *buf;
	size_t len;
	uint32_t crc;           /* set by ps_checkpoint_write_image */
	uint64_t tables_gen;    /* the server's tables_gen when it was taken */
};

/* Bytes a full checkpoint of s takes now (without its CRC). */
size_t ps_checkpoint_size(const struct ps_server *s);

/* Copies s's state into img (loop thread: the only pause a checkpoint
 * costs the shard, a memcpy of its state). 0 or -ENOMEM with err. */
int ps_checkpoint_snapshot(const struct ps_server *s, struct ps_ckpt_image *img, char *err,
			   size_t errlen);

/* An incremental checkpoint (embedding tables, checkpoint.incremental):
 * the dense state whole, and of the tables the rows changed and the ids
 * dropped since the last snapshot, as number seq after the full file
 * s->ckpt_base_*. Its path is ps_checkpoint_delta_path(path, seq). */
int ps_checkpoint_snapshot_delta(const struct ps_server *s, uint32_t seq,
				 struct ps_ckpt_image *img, char *err, size_t errlen);
void ps_checkpoint_delta_path(const char *path, uint32_t seq, char *buf, size_t len);

/* After ps_checkpoint_load of the full file: applies path.delta-1, -2, ...
 * in order while they exist. One that builds on an older full file (a
 * crash came between a full checkpoint's rename and the removal of the
 * old chain), and every one after it or after a gap, is renamed to
 * <name>.stale with a log line, not loaded. Returns how many were applied,
 * or a negative code with the reason in err (damaged, not a regular file,
 * another configuration). */
int ps_checkpoint_load_deltas(struct ps_server *s, const char *path, char *err,
			      size_t errlen);
/* The same from path.delta-(after + 1) on (the ones up to after applied
 * already: a staged re-shard, reshard.c). readonly: a file of another
 * chain ends the chain without being set aside (a folder a running shard
 * writes to). The count applied, or a negative code with err. */
int ps_checkpoint_load_deltas_after(struct ps_server *s, const char *path, uint32_t after,
				    int readonly, char *err, size_t errlen);

/* After a full checkpoint reached path (any thread): removes the
 * incremental checkpoints of the chain it replaces, path.delta-upto and
 * any after it first, down to delta-1 (a crash part way leaves a chain
 * the loader sets aside whole), then fsyncs the folder. Failures are
 * logged only: the loader sets such files aside. */
void ps_checkpoint_retire_deltas(const char *path, uint32_t upto);

/* Writes img to path (any thread): a temporary file created exclusively
 * with mode 0600 next to it, fsynced, renamed over path, the folder
 * fsynced. 0, or a negative code with the reason in err. *bytes gets the
 * file size. */
int ps_checkpoint_write_image(struct ps_ckpt_image *img, const char *path,
			      uint64_t *bytes, char *err, size_t errlen);
void ps_checkpoint_image_free(struct ps_ckpt_image *img);

/* At start: 0 when a checkpoint for path (inside dir, checkpoint.dir) can
 * be written: dir is a folder and a file can be created in it (one is
 * made and removed). Else a negative code with the reason in err, so a
 * shard that could not write its checkpoint at stop does not start. */
int ps_checkpoint_check_dir(const char *dir, const char *path, char *err, size_t errlen);

/* Restores s's state from path (call before serving). 0; -ENOENT when
 * there is no file; else a negative code with the reason in err (damaged,
 * made by another configuration, counts out of range), and s is left as
 * it was unless the file changed while it was read. The size is checked
 * against the configuration before anything big is read; the file is read
 * twice (checked, then restored), never held in memory whole. Only a
 * regular file is read: a symbolic link is not followed and a FIFO or
 * device is refused without waiting on it. */
int ps_checkpoint_load(struct ps_server *s, const char *path, char *err, size_t errlen);

/* Only the tensors and tables the full checkpoint at path declares (a
 * config without a model, or tables declared at run time), adopted by s
 * as ps_checkpoint_load would (a re-shard, server/reshard.c). */
int ps_checkpoint_load_decl(struct ps_server *s, const char *path, char *err, size_t errlen);

/* The shard-map hash a full checkpoint's header records: 0, -ENOENT, or a
 * negative code with the reason in err. Nothing else is checked. */
int ps_checkpoint_map_hash(const char *path, uint64_t *hash, char *err, size_t errlen);

#endif

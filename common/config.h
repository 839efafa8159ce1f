/* config.h - the cluster configuration, loaded from one YAML file.
 *
 * One option table (config.c) drives YAML loading, validation, the --help
 * text of every program and --dump-config. Errors name file:line, the key
 * and what was expected; unknown keys are refused with the closest valid key
 * suggested. See conf/local.yaml for a commented example.
 */
#ifndef PS_CONFIG_H
#define PS_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "layers.h"

#define PS_MAX_SHARDS 256
/* dense tensors of one model: a config's, or a declaration's (thousands of
 * parameters in real models) */
#define PS_MAX_TENSORS 8192
#define PS_MAX_DIMS 8
#define PS_NAME_MAX 64
#define PS_HOST_MAX 256
#define PS_MAX_TABLES 64
#define PS_MAX_ROW_DIM 4096

enum ps_consistency { PS_SYNC, PS_ASYNC };
enum ps_transport_kind { PS_TRANSPORT_TCP, PS_TRANSPORT_RDMA };
/* Dense update rules. adamw: adam with decoupled weight decay; reduce: the
 * tensor's value becomes the (averaged) gradient of the clock (declared
 * groups only, sync only: workers that run their optimizer locally). */
enum ps_optim_kind { PS_OPT_SGD, PS_OPT_MOMENTUM, PS_OPT_ADAM, PS_OPT_ADAGRAD, PS_OPT_ADAMW,
		     PS_OPT_REDUCE, PS_OPT_COUNT };
/* Optimizer groups of declared tensors (ps_client_declare_groups). */
#define PS_MAX_GROUPS 64
/* compression.tensors entries a config without a model may hold. */
#define PS_MAX_DECL_OVERRIDES 256

/* A compression.tensors entry of a config without a model, applied by name
 * once the tensors are declared (ps_config_declared_codecs). */
struct ps_decl_override {
	char name[PS_NAME_MAX];
	int has_codec, has_ratio;
	int codec;                /* enum ps_codec_kind, when has_codec */
	float ratio;              /* when has_ratio */
};
/* How a tensor's initial values are derived from (seed, tensor, element):
 * zeros; const (value); uniform in [-scale, scale]; normal with std scale;
 * arange (element index mod 1024, exact integers: for tests). */
enum ps_init_kind { PS_INIT_ZEROS, PS_INIT_CONST, PS_INIT_UNIFORM, PS_INIT_NORMAL, PS_INIT_ARANGE };

struct ps_endpoint {
	char host[PS_HOST_MAX];
	int port;
};

/* Parses "host:port" or "[v6]:port" (the form of cluster.servers and
 * stats.http); 0, or -1 with what is wrong in *why. */
int ps_endpoint_parse(const char *s, struct ps_endpoint *ep, const char **why);

struct ps_tensor_cfg {
	char name[PS_NAME_MAX];
	int ndims;
	int64_t dims[PS_MAX_DIMS];
	int64_t count;            /* product of dims */
	enum ps_init_kind init;
	float init_value;         /* const value, or scale for uniform/normal */
	/* Push compression of this tensor: compression.codec / .ratio, or the
	 * compression.tensors entry naming it (resolved by the loader). */
	int codec;                /* enum ps_codec_kind (codec.h) */
	float ratio;              /* topk: fraction kept */
	int group;                /* declared with groups: its optimizer group (ps_config.groups) */
};

/* Update rules of embedding rows (docs/embeddings.md): the optimizer state
 * each keeps beside a row's dim weights is ps_row_optim_nstate() floats. */
enum ps_row_optim { PS_ROPT_SGD, PS_ROPT_ADAGRAD, PS_ROPT_ROWWISE_ADAGRAD, PS_ROPT_ADAM,
		    PS_ROPT_FTRL, PS_ROPT_COUNT };

/* One model.embeddings entry: a sparse table of rows keyed by uint64 ids,
 * created on first (admitted) push, hash-partitioned over the shards. */
struct ps_table_cfg {
	char name[PS_NAME_MAX];
	int dim;                  /* floats per row */
	enum ps_init_kind init;   /* zeros, const, uniform, normal (arange is refused) */
	float init_value;         /* const value, or scale for uniform/normal */
	int optimizer;            /* enum ps_row_optim */
	float lr, eps, beta1, beta2, initial_accumulator;
	float l1, l2, ftrl_beta;  /* ftrl */
	int admission;            /* pushes of an id before its row is created; 0 and 1: at once */
	int ttl_s;                /* rows not updated for this long are dropped; 0 = never */
	int64_t max_rows;         /* rows of the whole table (each shard keeps its share); 0 = no cap */
	int64_t filter_ids;       /* admission filter: ids counted per shard before counts decay */
	uint32_t fields;          /* ctr: bit f set = categorical field f bags from this table
				     (resolved: every field in exactly one table); else 0 */
};

enum ps_lz4_mode { PS_LZ4_OFF, PS_LZ4_ON, PS_LZ4_AUTO };

/* compression: how workers encode pushes and shards encode pull replies. */
struct ps_compress_cfg {
	int codec;                /* enum ps_codec_kind: default for every tensor */
	float ratio;              /* topk: fraction of each slice kept, (0, 1] */
	int error_feedback;       /* topk, sign, q8: keep what was not sent */
	int lz4;                  /* enum ps_lz4_mode */
	int pull;                 /* enum ps_codec_kind: none or fp16 for pull replies */
};

struct ps_optim_cfg {
	enum ps_optim_kind kind;
	float lr;
	float momentum;           /* momentum: mu */
	int nesterov;             /* momentum: Nesterov variant */
	float beta1, beta2, eps;  /* adam (eps also adagrad) */
	float weight_decay;       /* L2 added to the gradient, all optimizers */
	float initial_accumulator; /* adagrad */
	float dampening;          /* momentum: buf = mu*buf + (1-dampening)*g' after the first step */
	float lr_decay;           /* adagrad: step lr = lr / (1 + (t-1)*lr_decay) */
	int average;              /* sync: apply the mean of a clock's gradients, not their sum;
				     async: each gradient scaled by 1/nworkers */
};

struct ps_limits {
	uint64_t max_frame_bytes;   /* largest accepted frame (meta + payload) */
	uint32_t max_meta_bytes;    /* largest accepted protobuf metadata */
	int connect_timeout_ms;     /* client connect + handshake */
	int request_timeout_ms;     /* client waits this long for any reply */
	int handshake_timeout_ms;   /* server drops connections that do not say hello */
	int max_clock_ahead;        /* sync: a push may be at most this many clocks ahead */
	int max_connections;        /* per shard, past the handshake */
	int max_handshakes;         /* connections still in the handshake, per shard */
	int max_handshakes_per_source; /* the same from one address */
	int max_waiting_pulls;      /* pulls one connection may have waiting for their clock */
	uint64_t max_waiting_bytes; /* bytes the waiting row pulls of one connection hold */
	uint64_t max_waiting_bytes_total; /* the same for every connection together */
	int wait_spin_us;           /* client: ps_client_wait polls this long before sleeping */
	int idle_timeout_ms;        /* a connection silent this long is closed; 0 = never */
	uint64_t max_write_queue;   /* reply bytes queued to a peer before its requests wait (backpressure) */
	uint64_t max_queued_bytes;  /* the same for every peer together */
	int drop_timeout_ms;        /* shard: a worker without a connection this long leaves the live set; 0 = idle_timeout_ms */
	int reconnect_timeout_ms;   /* client: keeps reconnecting to a lost shard this long; 0 = never */
	int max_request_rows;       /* ids in one pull_rows / push_rows frame */
	uint64_t max_table_bytes;   /* shard: memory of all its embedding tables (table.c) */
};

struct ps_checkpoint_cfg {
	char dir[512];              /* folder of shard-K.ckpt; "" = no checkpoints */
	int every_s;                /* write one every this many seconds; 0 = only on SIGTERM / request */
	int on_request;             /* peers with the secret may ask for one (ps-stat --checkpoint) */
	int min_interval_s;         /* at most one on request per this many seconds */
	int incremental;            /* embedding tables: this many incremental ones after a full one */
	uint64_t fork_bytes;        /* full checkpoints of a state this big are written by a fork()ed child */
};

/* Who may talk (docs/security.md). */
struct ps_security_cfg {
	int auth;                   /* challenge-response over the shared secret on every connection */
	int mac;                    /* after it, a sequence number and MAC on every frame */
	int encrypt;                /* with mac: frames are AEAD records (frame_aead.h) */
	int cipher;                 /* enum ps_cipher */
	char secret_file[512];      /* relative: from the config file's folder; "" = $PS_SECRET_FILE */
	char repl_key_file[512];    /* replicas: the shard processes' own key; "" = $PS_REPL_KEY_FILE */
	char reader_key_file[512];  /* the read-only role's key (shards and readers); "" = $PS_READER_KEY_FILE */
};

struct ps_stats_cfg {
	char http[PS_HOST_MAX + 8]; /* "host:port" for /metrics, empty = off */
	char token_file[512];       /* bearer token /metrics requires; "" = open */
	int port_per_shard;         /* shard k serves on port + k (one host); 0: on port itself */
};

/* Training: what ps-worker does (the data, batches, where metrics go). */
/* train.pull: when a worker pulls the next step's weights. */
enum ps_pull_when { PS_PULL_LAYER = 0, PS_PULL_STEP = 1 };

struct ps_train_cfg {
	char data_dir[512];         /* IDX files: train-* and t10k-* */
	char train_file[512];       /* ctr: Criteo-format training log */
	char test_file[512];        /* ctr: Criteo-format held-out log */
	int batch;                  /* examples per step per worker */
	int epochs;
	int64_t train_limit;        /* use the first N training images (0 = all) */
	int64_t test_limit;         /* test accuracy on the first N test images (0 = all) */
	int device;                 /* enum ps_device */
	int tf32;                   /* enum ps_tf32 (compute.h): conv, off, all */
	int threads;                /* cpu compute threads; 0 = auto (ps_worker.c) */
	int pull;                   /* enum ps_pull_when: per layer or per step */
	char metrics_dir[512];      /* worker-R.jsonl files go here */
};

enum ps_device { PS_DEVICE_AUTO, PS_DEVICE_CPU, PS_DEVICE_CUDA };

struct ps_config {
	char path[1024];            /* file it was loaded from ("" for defaults) */
	int nshards;
	struct ps_endpoint shards[PS_MAX_SHARDS];
	int nworkers;
	/* cluster.initial_workers: ranks below it are members from clock 0,
	 * the others join at run time (server/members.c); == nworkers unless
	 * the cluster is elastic */
	int initial_workers;
	/* cluster.replicas: 1 gives every shard a second process at
	 * backups[k] that holds the same state (server/replica.h) */
	int replicas;
	int nbackups;
	struct ps_endpoint backups[PS_MAX_SHARDS];
	int repl_timeout_ms;        /* replication.timeout_ms */
	int repl_every_push;        /* replication.forward: every_push (sync) */
	int listen_any;             /* shards bind every address (0.0.0.0 / ::) on their port */
	enum ps_transport_kind transport;
	enum ps_consistency consistency;
	int staleness;              /* async only */
	uint64_t seed;
	uint64_t slice_bytes;       /* max bytes of one slice */
	/* 1 when the config names no dense model (no model.preset, .layers or
	 * .tensors): workers declare the tensors at run time (ps_client_declare,
	 * server/declare.c), and tensors[] is filled from the declaration. */
	int declare;
	int ntensors;
	struct ps_tensor_cfg tensors[PS_MAX_TENSORS];
	struct ps_optim_cfg optim;
	/* Declared with optimizer groups (ps_client_declare_groups): ngroups
	 * (1..PS_MAX_GROUPS) rules, tensor i updated by groups[tensors[i].group].
	 * 0: every tensor is updated by optim. */
	int ngroups;
	struct ps_optim_cfg groups[PS_MAX_GROUPS];
	/* A config without a model: its compression.tensors entries. */
	int ndecl_ovr;
	struct ps_decl_override decl_ovr[PS_MAX_DECL_OVERRIDES];
	struct ps_limits limits;
	struct ps_stats_cfg stats;
	struct ps_checkpoint_cfg checkpoint;
	struct ps_security_cfg security;
	char rdma_device[64];       /* transport rdma: the verbs device; "" = the first */
	char log_level[16];
	struct ps_compress_cfg compress;
	struct ps_model_cfg model;  /* layers; nlayers 0 when only tensors are given */
	int ntables;                /* model.embeddings, then the declared tables */
	struct ps_table_cfg tables[PS_MAX_TABLES];
	/* Tables declared at run time (ps_client_declare_tables): the last
	 * ndecl_tables of tables[]; left out of the shard-map hash, as
	 * declared tensors are (the declaration itself is compared). */
	int ndecl_tables;
	struct ps_train_cfg train;
};

/* The address of replica r (0: cluster.servers, 1: cluster.backups) of
 * shard k. */
static inline const struct ps_endpoint *ps_config_replica_addr(const struct ps_config *cfg,
								int k, int r)
{
	return r ? &cfg->backups[k] : &cfg->shards[k];
}

/* Declared tensors (cfg->tensors, ntensors): sets every tensor's push
 * codec and ratio from compression.codec / .ratio and the
 * compression.tensors entries naming it (cfg->decl_ovr). 0, or PS_ECONFIG
 * with the entry that names no declared tensor (and the file) in why. */
int ps_config_declared_codecs(struct ps_config *cfg, char *why, size_t wl);

/* Fills cfg with every default (no shards, no tensors). */
void ps_config_defaults(struct ps_config *cfg);

/* Loads and validates a YAML file. On error returns PS_ECONFIG (or -errno
 * when the file cannot be read) and writes one message of the form
 * "FILE:LINE: key 'a.b': expected ..., got '...'" into err (errlen bytes). */
int ps_config_load(struct ps_config *cfg, const char *path, char *err, size_t errlen);

/* Same, from a string in memory; name is used in messages instead of a path. */
int ps_config_load_string(struct ps_config *cfg, const char *yaml, const char *name,
			  char *err, size_t errlen);

/* Index of the tensor named name, or PS_ENOTENSOR. */
int ps_config_find_tensor(const struct ps_config *cfg, const char *name);

/* Index of the embedding table named name, or PS_ENOTENSOR. */
int ps_config_find_table(const struct ps_config *cfg, const char *name);

/* Floats of optimizer state a row of table t keeps beside its weights. */
int ps_row_optim_nstate(const struct ps_table_cfg *t);
const char *ps_row_optim_name(int k);

/* Writes the effective configuration as YAML that ps_config_load accepts. */
void ps_config_dump(const struct ps_config *cfg, FILE *out);

/* Writes the documentation of every option (name, type, bounds, default,
 * help), for the --help text of the programs. */
void ps_config_help(FILE *out);

const char *ps_optim_name(enum ps_optim_kind k);

#endif

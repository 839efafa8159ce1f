/* check_store.c - the shard's update path: BSP sums in rank order whatever
 * the arrival order (bit for bit), clock windows and duplicates refused,
 * clocks applied in order, frames released once nothing refers to them, SSP
 * applies on arrival, the finiteness check finds a bad value anywhere. */
#include <check.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "codec.h"
#include "config.h"
#include "ps_err.h"
#include "shardmap.h"
#include "finite.h"
#include "store.h"
#include "test_util.h"

static int released;

static void test_release(struct ps_frame *f)
{
	released++;
	free(f);
}

/* A frame holding len bytes as payload. */
static struct ps_frame_ref *make_frame_bytes(const void *p, size_t len)
{
	struct ps_frame *f = calloc(1, sizeof(*f) + len + 64);
	struct ps_frame_ref *fr = calloc(1, sizeof(*fr));

	ck_assert(f && fr);
	f->payload = (uint8_t *)(f + 1);
	memcpy(f->payload, p, len);
	f->hdr.payload_len = len;
	f->release = test_release;
	fr->frame = f;
	fr->refs = 1;
	return fr;
}

/* A frame holding n floats as payload. */
static struct ps_frame_ref *make_frame(const float *g, size_t n)
{
	return make_frame_bytes(g, n * sizeof(float));
}

/* Offers a copy of g (200 floats, in a frame of its own) from rank for
 * clock, as a push would: ps_store_offer's result. */
static int offer(struct ps_store *st, struct ps_slot *s, int rank, uint64_t clock,
		 const float *g)
{
	struct ps_frame_ref *fr = make_frame(g, 200);
	int rc = ps_store_offer(st, s, rank, clock, (const float *)fr->frame->payload, fr);

	ps_frame_ref_put(fr);
	return rc;
}

static void make_cfg(struct ps_config *cfg, int nworkers, enum ps_consistency mode)
{
	ps_config_defaults(cfg);
	cfg->nshards = 1;
	strcpy(cfg->shards[0].host, "127.0.0.1");
	cfg->shards[0].port = 7000;
	cfg->nworkers = nworkers;
	cfg->consistency = mode;
	cfg->slice_bytes = 1024;
	cfg->ntensors = 1;
	memset(&cfg->tensors[0], 0, sizeof(cfg->tensors[0]));
	strcpy(cfg->tensors[0].name, "w");
	cfg->tensors[0].ndims = 1;
	cfg->tensors[0].dims[0] = cfg->tensors[0].count = 200; /* one slice of 200 floats */
	cfg->tensors[0].init = PS_INIT_UNIFORM;
	cfg->tensors[0].init_value = 1.0f;
	cfg->optim.kind = PS_OPT_SGD;
	cfg->optim.lr = 0.1f;
	cfg->optim.weight_decay = 0;
	cfg->limits.max_clock_ahead = 4;
}

/* Gradients chosen so that float addition order changes the sum. */
static void grads(float g[3][200], int clock)
{
	for (int i = 0; i < 200; i++) {
		g[0][i] = 1e8f * (float)((i + clock) % 3 + 1);
		g[1][i] = 1.0f + (float)i * 0.37f;
		g[2][i] = -1e8f * (float)((i + clock) % 3 + 1) + 0.123f * (float)clock;
	}
}

static const int perms[6][3] = {
	{ 0, 1, 2 }, { 0, 2, 1 }, { 1, 0, 2 }, { 1, 2, 0 }, { 2, 0, 1 }, { 2, 1, 0 },
};

START_TEST(test_bsp_sum_order_bit_identical)
{
	static struct ps_config cfg;
	struct ps_shardmap map;
	float ref[200], g[3][200];

	make_cfg(&cfg, 3, PS_SYNC);
	ck_assert_int_eq(ps_shardmap_init(&map, &cfg), 0);
	/* Sanity: the sum really depends on the order for these values. */
	grads(g, 0);
	ck_assert((g[0][1] + g[1][1]) + g[2][1] != (g[0][1] + g[2][1]) + g[1][1]);
	for (int p = 0; p < 6; p++) {
		struct ps_store st;
		ck_assert_int_eq(ps_store_init(&st, &cfg, &map, 0), 0);
		ck_assert_int_eq(st.nslots, 1);
		struct ps_slot *s = ps_store_slot(&st, 0);
		for (int clock = 0; clock < 5; clock++) {
			grads(g, clock);
			for (int k = 0; k < 3; k++) {
				int r = perms[(p + clock) % 6][k];
				ck_assert_int_eq(offer(&st, s, r, (uint64_t)clock, g[r]), k == 2 ? 1 : 0);
			}
			ck_assert_uint_eq(s->version, (uint64_t)clock + 1);
		}
		if (p == 0)
			memcpy(ref, s->w, sizeof(ref));
		else
			ck_assert_int_eq(memcmp(ref, s->w, sizeof(ref)), 0);
		ps_store_free(&st);
	}
	/* And the result is the rank-order sum: w = init - lr * ((g0 + g1) + g2). */
	for (int i = 0; i < 200; i++) {
		float w = ps_init_value(&cfg, 0, i);
		for (int clock = 0; clock < 5; clock++) {
			grads(g, clock);
			float sum = (g[0][i] + g[1][i]) + g[2][i];
			w = w - 0.1f * sum;
		}
		ck_assert_msg(w == ref[i], "element %d: %a vs %a", i, w, ref[i]);
	}
	ps_shardmap_free(&map);
}
END_TEST

/* ---- encoded gradients: the same rank-order sum ---- */

#define N 200

/* What each rank encodes its gradient with, per run of the test below. */
static const struct {
	const char *what;
	int codec[3];
} enc_mixes[] = {
	{ "fp16", { PS_CODEC_FP16, PS_CODEC_FP16, PS_CODEC_FP16 } },
	{ "topk", { PS_CODEC_TOPK, PS_CODEC_TOPK, PS_CODEC_TOPK } },
	{ "raw fp16 topk", { PS_CODEC_NONE, PS_CODEC_FP16, PS_CODEC_TOPK } },
	{ "topk raw fp16", { PS_CODEC_TOPK, PS_CODEC_NONE, PS_CODEC_FP16 } },
	{ "fp16 topk raw", { PS_CODEC_FP16, PS_CODEC_TOPK, PS_CODEC_NONE } },
};

/* Gradients whose float sum depends on the order of addition and which
 * every codec used carries exactly: per element, one rank gets +B, one a
 * small s, one -B, the roles rotating over the ranks with the element and
 * the clock. B is a multiple of 32 in [2^15, 2^16) (an fp16 value; the
 * float ulp there is 2^-8) and s is 1..4 * 2^-10 (fp16 values too), so
 * B + s rounds away part or all of s unless B and -B meet first. A rank
 * that sends topk (ratio 0.75) has every fourth element zero, so its 150
 * nonzero values are exactly the ones kept (and elements 1, 5, 9, ... have
 * all three ranks' values). */
static void enc_grads(float g[3][N], int clock, const int codec[3])
{
	for (int i = 0; i < N; i++) {
		const int *role = perms[(i + clock) % 6];
		float big = 32768.0f + 32.0f * (float)((i * 7 + clock) % 64);

		g[role[0]][i] = big;
		g[role[1]][i] = 0x1p-10f * (float)(1 + i % 4);
		g[role[2]][i] = -big;
	}
	for (int r = 0; r < 3; r++)
		if (codec[r] == PS_CODEC_TOPK)
			for (int i = 0; i < N; i++)
				if ((i + r) % 4 == 0)
					g[r][i] = 0.0f;
}

/* Offers g (N floats) from rank for clock, encoded with codec (raw when
 * PS_CODEC_NONE), in a frame of its own, checked first as the server does;
 * the check's decoding must give back g exactly (the test's reference sums
 * rely on it). ps_store_offer_grad's result. */
static int offer_enc(struct ps_store *st, struct ps_slot *s, int rank, uint64_t clock,
		     const float *g, int codec)
{
	struct ps_codec_params prm = { .ratio = 0.75f };
	struct ps_frame_ref *fr;
	struct ps_grad gr = { 0 };
	char err[256] = "";
	int rc;

	if (codec == PS_CODEC_NONE) {
		fr = make_frame(g, N);
		gr.len = N * sizeof(float);
	} else {
		const struct ps_codec_ops *co = ps_codec_get(codec);
		ck_assert_ptr_nonnull(co);
		size_t cap = co->max_bytes(N, &prm);
		uint8_t *buf = malloc(cap);
		ck_assert_ptr_nonnull(buf);
		ssize_t len = co->encode(g, NULL, N, &prm, 0, buf, cap);
		ck_assert_int_gt(len, 0);
		fr = make_frame_bytes(buf, (size_t)len);
		free(buf);
		gr.len = (uint64_t)len;
	}
	gr.data = fr->frame->payload;
	gr.codec = codec;
	ck_assert_msg(ps_store_check(st, s, &gr, err, sizeof(err)) == 0, "%s", err);
	if (codec != PS_CODEC_NONE)
		ck_assert_mem_eq(st->check, g, N * sizeof(float));
	rc = ps_store_offer_grad(st, s, rank, clock, &gr, fr);
	ps_frame_ref_put(fr);
	return rc;
}

/* Sync sums of encoded gradients (fp16, topk, and raw mixed with them) are
 * in rank order too: every arrival order of three workers gives the same
 * weights bit for bit, and they are the rank-order float sums. */
START_TEST(test_bsp_encoded_sum_order_bit_identical)
{
	static struct ps_config cfg;
	struct ps_shardmap map;
	const int *codec = enc_mixes[_i].codec;
	float ref[N], g[3][N];

	make_cfg(&cfg, 3, PS_SYNC);
	ck_assert_int_eq(ps_shardmap_init(&map, &cfg), 0);
	/* Sanity: for every arrival order whose last rank is not rank 2 (float
	 * addition commutes, so only the last one matters), some element's
	 * float sum differs from the rank-order one. */
	enc_grads(g, 0, codec);
	for (int p = 0; p < 6; p++) {
		int differ = 0;
		if (perms[p][2] == 2)
			continue;
		for (int i = 0; i < N; i++) {
			const int *o = perms[p];
			float arrival = (g[o[0]][i] + g[o[1]][i]) + g[o[2]][i];
			differ += arrival != (g[0][i] + g[1][i]) + g[2][i];
		}
		ck_assert_msg(differ > 0, "%s: order %d sums like rank order", enc_mixes[_i].what,
			      p);
	}
	for (int p = 0; p < 6; p++) {
		struct ps_store st;
		ck_assert_int_eq(ps_store_init(&st, &cfg, &map, 0), 0);
		struct ps_slot *s = ps_store_slot(&st, 0);
		for (int clock = 0; clock < 3; clock++) {
			enc_grads(g, clock, codec);
			for (int k = 0; k < 3; k++) {
				int r = perms[(p + clock) % 6][k];
				ck_assert_int_eq(offer_enc(&st, s, r, (uint64_t)clock, g[r], codec[r]),
						 k == 2 ? 1 : 0);
			}
			ck_assert_uint_eq(s->version, (uint64_t)clock + 1);
		}
		if (p == 0)
			memcpy(ref, s->w, sizeof(ref));
		else
			ck_assert_msg(memcmp(ref, s->w, sizeof(ref)) == 0,
				      "%s: arrival order %d gives other weights than order 0",
				      enc_mixes[_i].what, p);
		ps_store_free(&st);
	}
	/* The rank-order sum: w = init - lr * ((g0 + g1) + g2). */
	for (int i = 0; i < N; i++) {
		float w = ps_init_value(&cfg, 0, i);
		for (int clock = 0; clock < 3; clock++) {
			enc_grads(g, clock, codec);
			float sum = (g[0][i] + g[1][i]) + g[2][i];
			w = w - 0.1f * sum;
		}
		ck_assert_msg(w == ref[i], "%s: element %d: %a vs %a", enc_mixes[_i].what, i, w,
			      ref[i]);
	}
	ps_shardmap_free(&map);
}
END_TEST

/* Encoded sync sums with a rank in the middle out of the live set (rank 1
 * dropped): ranks 2 and 0 push, the clock applies at the second push, and
 * the weights are the sum of exactly those two (the rank without a
 * gradient passed over, not read), for each mix of codecs. */
START_TEST(test_bsp_encoded_live_set)
{
	static struct ps_config cfg;
	struct ps_shardmap map;
	struct ps_store st;
	uint8_t live[3] = { 1, 0, 1 };
	const int *codec = enc_mixes[_i].codec;
	float g[3][N], w[N];

	make_cfg(&cfg, 3, PS_SYNC);
	ck_assert_int_eq(ps_shardmap_init(&map, &cfg), 0);
	ck_assert_int_eq(ps_store_init(&st, &cfg, &map, 0), 0);
	st.live = live;
	struct ps_slot *s = ps_store_slot(&st, 0);
	for (int i = 0; i < N; i++)
		w[i] = s->w[i];
	for (int clock = 0; clock < 3; clock++) {
		enc_grads(g, clock, codec);
		ck_assert_int_eq(offer_enc(&st, s, clock % 2 ? 0 : 2, (uint64_t)clock,
					   g[clock % 2 ? 0 : 2], codec[clock % 2 ? 0 : 2]), 0);
		ck_assert_int_eq(offer_enc(&st, s, clock % 2 ? 2 : 0, (uint64_t)clock,
					   g[clock % 2 ? 2 : 0], codec[clock % 2 ? 2 : 0]), 1);
		ck_assert_uint_eq(s->version, (uint64_t)clock + 1);
		for (int i = 0; i < N; i++)
			w[i] = w[i] - 0.1f * (g[0][i] + g[2][i]);
	}
	for (int i = 0; i < N; i++)
		ck_assert_msg(w[i] == s->w[i], "%s, rank 1 dropped: element %d: %a where ranks 0 "
			      "and 2 sum to %a", enc_mixes[_i].what, i, s->w[i], w[i]);
	ps_store_free(&st);
	ps_shardmap_free(&map);
}
END_TEST

START_TEST(test_bsp_windows_and_duplicates)
{
	static struct ps_config cfg;
	struct ps_shardmap map;
	struct ps_store st;
	float g[200] = { 0 };

	released = 0;
	make_cfg(&cfg, 2, PS_SYNC);
	ck_assert_int_eq(ps_shardmap_init(&map, &cfg), 0);
	ck_assert_int_eq(ps_store_init(&st, &cfg, &map, 0), 0);
	struct ps_slot *s = ps_store_slot(&st, 0);
	ck_assert_ptr_null(ps_store_slot(&st, 1));
	struct ps_frame_ref *fr = make_frame(g, 200);
	const float *p = (const float *)fr->frame->payload;
	/* Clock 4 is outside the window [0, 4). */
	ck_assert_int_eq(ps_store_offer(&st, s, 0, 4, p, fr), PS_ECLOCK);
	/* Clocks 2 and 1 arrive first; they wait for clock 0. */
	ck_assert_int_eq(ps_store_offer(&st, s, 0, 2, p, fr), 0);
	ck_assert_int_eq(ps_store_offer(&st, s, 1, 2, p, fr), 0);
	ck_assert_int_eq(ps_store_offer(&st, s, 1, 1, p, fr), 0);
	ck_assert_int_eq(ps_store_offer(&st, s, 0, 1, p, fr), 0);
	ck_assert_int_eq(ps_store_offer(&st, s, 0, 1, p, fr), PS_EDUP);
	ck_assert_uint_eq(s->version, 0);
	ck_assert_int_eq(ps_store_offer(&st, s, 1, 0, p, fr), 0);
	/* The last piece of clock 0 releases clocks 0, 1 and 2 in order. */
	ck_assert_int_eq(ps_store_offer(&st, s, 0, 0, p, fr), 1);
	ck_assert_uint_eq(s->version, 3);
	ck_assert_uint_eq(st.applies, 3);
	/* Clock 2 is now in the past. */
	ck_assert_int_eq(ps_store_offer(&st, s, 0, 2, p, fr), PS_ECLOCK);
	/* Every reference was dropped: the frame goes when we drop ours. */
	ck_assert_int_eq(fr->refs, 1);
	ck_assert_int_eq(released, 0);
	ps_frame_ref_put(fr);
	ck_assert_int_eq(released, 1);
	/* Pending gradients are dropped (a primary stepping down forgets what
	 * was not committed): every frame they held released, the slot's
	 * version unchanged, and the same clocks taken again after. */
	ck_assert_int_eq(offer(&st, s, 1, 3, g), 0);
	ck_assert_int_eq(offer(&st, s, 0, 4, g), 0);
	ck_assert_int_eq(offer(&st, s, 1, 4, g), 0);
	ck_assert_int_eq(released, 1);
	ps_store_drop_pending(&st);
	ck_assert_int_eq(released, 4);
	ck_assert_ptr_null(s->pending);
	ck_assert_uint_eq(s->version, 3);
	ck_assert_uint_eq(st.applies, 3);
	ck_assert_int_eq(offer(&st, s, 1, 3, g), 0);   /* not a duplicate now */
	ps_store_drop_pending(&st);                     /* twice: nothing left to drop */
	ck_assert_int_eq(released, 5);
	/* Pending gradients are released when the store is freed. */
	ck_assert_int_eq(offer(&st, s, 1, 3, g), 0);
	ck_assert_int_eq(released, 5);
	ps_store_free(&st);
	ck_assert_int_eq(released, 6);
	ps_shardmap_free(&map);
}
END_TEST

START_TEST(test_ssp_applies_on_arrival)
{
	static struct ps_config cfg;
	struct ps_shardmap map;
	struct ps_store st;
	float g[200];

	make_cfg(&cfg, 3, PS_ASYNC);
	cfg.tensors[0].init = PS_INIT_ZEROS;
	ck_assert_int_eq(ps_shardmap_init(&map, &cfg), 0);
	ck_assert_int_eq(ps_store_init(&st, &cfg, &map, 0), 0);
	struct ps_slot *s = ps_store_slot(&st, 0);
	for (int i = 0; i < 200; i++)
		g[i] = 1.0f;
	for (int k = 0; k < 5; k++) {
		ck_assert_int_eq(offer(&st, s, k % 3, (uint64_t)(k / 2), g), 1);
		ck_assert_uint_eq(s->version, (uint64_t)k + 1);
	}
	for (int i = 0; i < 200; i++)
		ck_assert_float_eq_tol(s->w[i], -0.5f, 1e-6f);
	ps_store_free(&st);
	ps_shardmap_free(&map);
}
END_TEST

/* Offers g (200 floats) with the learning rate lr, as a push of a client
 * that declared optimizer groups: ps_store_offer_grad's result. */
static int offer_lr(struct ps_store *st, struct ps_slot *s, int rank, uint64_t clock,
		    const float *g, float lr)
{
	struct ps_frame_ref *fr = make_frame(g, 200);
	struct ps_grad gr = { fr->frame->payload, 200 * sizeof(float), 0, 0, 1, lr };
	char err[200];
	int rc = ps_store_check(st, s, &gr, err, sizeof(err));

	ck_assert_msg(rc == 0, "%s", err);
	rc = ps_store_offer_grad(st, s, rank, clock, &gr, fr);
	ps_frame_ref_put(fr);
	return rc;
}

/* optimizer.average: sync applies the sum over the ranks that pushed the
 * clock (3, then 2 when rank 2 has ended the clock without pushing), with
 * the learning rate of the lowest of them (pushed rates: rank 1's when rank
 * 0 did not push); async scales each gradient by 1/nworkers and uses its
 * own push's rate. Without average (the YAML default) the sum applies. */
START_TEST(test_average_and_pushed_lr)
{
	static struct ps_config cfg;
	struct ps_shardmap map;
	struct ps_store st;
	float g[3][200];
	uint64_t finished[3] = { 0, 0, 0 };
	uint8_t live[3] = { 1, 1, 1 };

	make_cfg(&cfg, 3, PS_SYNC);
	cfg.tensors[0].init = PS_INIT_ZEROS;
	cfg.optim.average = 1;
	ck_assert_int_eq(ps_shardmap_init(&map, &cfg), 0);
	ck_assert_int_eq(ps_store_init(&st, &cfg, &map, 0), 0);
	st.live = live;
	st.finished = finished;
	struct ps_slot *s = ps_store_slot(&st, 0);
	for (int r = 0; r < 3; r++)
		for (int i = 0; i < 200; i++)
			g[r][i] = (float)(r + 1) * 0.5f + (float)i; /* mean: 1 + i */
	/* clock 0: all three; rates 0.25 (rank 0), others ignored */
	ck_assert_int_eq(offer_lr(&st, s, 2, 0, g[2], 8.0f), 0);
	ck_assert_int_eq(offer_lr(&st, s, 1, 0, g[1], 4.0f), 0);
	ck_assert_int_eq(offer_lr(&st, s, 0, 0, g[0], 0.25f), 1);
	for (int i = 0; i < 200; i++)
		ck_assert_float_eq(s->w[i], -0.25f * (((g[0][i] + g[1][i]) + g[2][i]) / 3.0f));
	/* clock 1: rank 0 ended it without pushing this slice, ranks 1 and 2
	 * push: their mean, rank 1's rate */
	float w1[200];
	memcpy(w1, s->w, sizeof(w1));
	finished[0] = 2;
	ck_assert_int_eq(offer_lr(&st, s, 2, 1, g[2], 8.0f), 0);
	ck_assert_int_eq(offer_lr(&st, s, 1, 1, g[1], 0.5f), 1);
	for (int i = 0; i < 200; i++)
		ck_assert_float_eq(s->w[i], w1[i] - 0.5f * ((g[1][i] + g[2][i]) / 2.0f));
	ps_store_free(&st);

	/* async: each push on its own, over cluster.workers, at its own rate */
	cfg.consistency = PS_ASYNC;
	ck_assert_int_eq(ps_store_init(&st, &cfg, &map, 0), 0);
	s = ps_store_slot(&st, 0);
	ck_assert_int_eq(offer_lr(&st, s, 1, 0, g[1], 0.5f), 1);
	ck_assert_int_eq(offer_lr(&st, s, 0, 0, g[0], 2.0f), 1);
	for (int i = 0; i < 200; i++)
		ck_assert_float_eq(s->w[i], (0.0f - 0.5f * (g[1][i] / 3.0f)) - 2.0f * (g[0][i] / 3.0f));
	ps_store_free(&st);

	/* no average: the sum, at the config's rate (no rate pushed) */
	cfg.consistency = PS_SYNC;
	cfg.optim.average = 0;
	ck_assert_int_eq(ps_store_init(&st, &cfg, &map, 0), 0);
	s = ps_store_slot(&st, 0);
	for (int r = 0; r < 3; r++)
		ck_assert_int_eq(offer(&st, s, r, 0, g[r]), r == 2);
	for (int i = 0; i < 200; i++)
		ck_assert_float_eq(s->w[i], -0.1f * ((g[0][i] + g[1][i]) + g[2][i]));
	ps_store_free(&st);
	ps_shardmap_free(&map);
}
END_TEST

/* Declared optimizer groups: each slot takes its tensor's group's rule and
 * state (adam's two arrays beside sgd's none), not the config's. */
START_TEST(test_slots_take_their_group)
{
	static struct ps_config cfg;
	struct ps_shardmap map;
	struct ps_store st;

	make_cfg(&cfg, 1, PS_SYNC);
	cfg.ntensors = 2;
	cfg.tensors[1] = cfg.tensors[0];
	strcpy(cfg.tensors[1].name, "v");
	cfg.ngroups = 2;
	cfg.groups[0] = (struct ps_optim_cfg){ .kind = PS_OPT_ADAM, .lr = 0.1f, .beta1 = 0.9f,
					      .beta2 = 0.999f, .eps = 1e-8f };
	cfg.groups[1] = (struct ps_optim_cfg){ .kind = PS_OPT_REDUCE };
	cfg.tensors[0].group = 1;
	cfg.tensors[1].group = 0;
	ck_assert_int_eq(ps_shardmap_init(&map, &cfg), 0);
	ck_assert_int_eq(ps_store_init(&st, &cfg, &map, 0), 0);
	ck_assert_int_eq(st.nslots, 2);
	for (int k = 0; k < 2; k++) {
		struct ps_slot *s = &st.slots[k];
		int t = s->slice->tensor;

		ck_assert_ptr_eq(s->ocfg, &cfg.groups[t ? 0 : 1]);
		ck_assert_str_eq(s->opt->name, t ? "adam" : "reduce");
		ck_assert(t ? s->state[0] && s->state[1] : !s->state[0]);
		float g[200];
		for (int i = 0; i < 200; i++)
			g[i] = 3.0f;
		ck_assert_int_eq(offer(&st, s, 0, 0, g), 1);
		/* reduce: w = g; adam's first step: w -= lr * sign(g) */
		for (int i = 0; i < 200; i++)
			ck_assert_float_eq_tol(s->w[i], t ? ps_init_value(&cfg, 1, i) - 0.1f : 3.0f,
					       1e-6f);
	}
	ps_store_free(&st);
	ps_shardmap_free(&map);
}
END_TEST

/* A sync clock whose sum overflows (two workers' 3e38), or whose update
 * would (adagrad's g*g of one worker's 1e20), is not applied: weights and
 * optimizer state stay bit for bit, the version moves on as for a clock
 * passed over (on_version, for a backup), and the refusal is counted in
 * the store and in the errors the server gave it. The next clock applies.
 * Before the check the weights became -inf (sum) and the accumulator inf. */
static int versions_passed;

static void count_version(void *arg, struct ps_slot *s)
{
	(void)arg;
	(void)s;
	versions_passed++;
}

START_TEST(test_bsp_refuses_nonfinite_update)
{
	static struct ps_config cfg;
	struct ps_shardmap map;
	struct ps_store st;
	float g[200], w0[200], a0[200];
	uint64_t errors = 0;
	int adagrad = _i;

	make_cfg(&cfg, 2, PS_SYNC);
	if (adagrad) {
		cfg.optim.kind = PS_OPT_ADAGRAD;
		cfg.optim.eps = 1e-10f;
		cfg.optim.initial_accumulator = 0.1f;
	}
	ck_assert_int_eq(ps_shardmap_init(&map, &cfg), 0);
	ck_assert_int_eq(ps_store_init(&st, &cfg, &map, 0), 0);
	st.errors = &errors;
	st.on_version = count_version;
	versions_passed = 0;
	struct ps_slot *s = ps_store_slot(&st, 0);
	memcpy(w0, s->w, sizeof(w0));
	if (adagrad)
		memcpy(a0, s->state[0], sizeof(a0));
	for (int i = 0; i < 200; i++)
		g[i] = adagrad ? (i == 150 ? 1e20f : 1.0f) : 3e38f;
	ck_assert_int_eq(offer(&st, s, 0, 0, g), 0);
	if (adagrad)
		g[150] = 1.0f; /* rank 1's own gradient is harmless */
	ck_assert_int_eq(offer(&st, s, 1, 0, g), 1);
	ck_assert_uint_eq(s->version, 1);
	ck_assert_uint_eq(s->steps, 0);
	ck_assert_int_eq(memcmp(s->w, w0, sizeof(w0)), 0);
	if (adagrad)
		ck_assert_int_eq(memcmp(s->state[0], a0, sizeof(a0)), 0);
	ck_assert_uint_eq(st.refused, 1);
	ck_assert_uint_eq(errors, 1);
	ck_assert_int_eq(versions_passed, 1);
	ck_assert_uint_eq(st.applies, 0);
	/* the next clock, finite, applies */
	for (int i = 0; i < 200; i++)
		g[i] = 1.0f;
	ck_assert_int_eq(offer(&st, s, 0, 1, g), 0);
	ck_assert_int_eq(offer(&st, s, 1, 1, g), 1);
	ck_assert_uint_eq(s->version, 2);
	ck_assert_uint_eq(st.applies, 1);
	for (int i = 0; i < 200; i++)
		ck_assert_msg(isfinite(s->w[i]) && s->w[i] < w0[i], "w[%d] = %g", i, s->w[i]);
	ps_store_free(&st);
	ps_shardmap_free(&map);
}
END_TEST

/* A clock only one rank pushed (the other dropped from the live set) is
 * applied as that push alone, without a sum; its update is still probed
 * first: an update that would leave a weight (SGD, lr 10, gradient 3e38)
 * or an accumulator (AdaGrad, one gradient of 1e20) that is not finite is
 * refused whole. */
START_TEST(test_bsp_single_push_refuses_nonfinite_update)
{
	static struct ps_config cfg;
	struct ps_shardmap map;
	struct ps_store st;
	float g[200], w0[200], a0[200];
	uint64_t errors = 0;
	int adagrad = _i;

	static const uint8_t live[2] = { 1, 0 }; /* rank 1 dropped */

	make_cfg(&cfg, 2, PS_SYNC);
	if (adagrad) {
		cfg.optim.kind = PS_OPT_ADAGRAD;
		cfg.optim.eps = 1e-10f;
		cfg.optim.initial_accumulator = 0.1f;
	} else {
		cfg.optim.lr = 10.0f;
	}
	ck_assert_int_eq(ps_shardmap_init(&map, &cfg), 0);
	ck_assert_int_eq(ps_store_init(&st, &cfg, &map, 0), 0);
	st.errors = &errors;
	st.live = live;
	struct ps_slot *s = ps_store_slot(&st, 0);
	memcpy(w0, s->w, sizeof(w0));
	if (adagrad)
		memcpy(a0, s->state[0], sizeof(a0));
	for (int i = 0; i < 200; i++)
		g[i] = adagrad ? (i == 150 ? 1e20f : 1.0f) : 3e38f;
	ck_assert_int_eq(offer(&st, s, 0, 0, g), 1);
	ck_assert_uint_eq(s->version, 1);
	ck_assert_uint_eq(s->steps, 0);
	for (int i = 0; i < 200; i++)
		ck_assert_msg(s->w[i] == w0[i], "%s: w[%d] = %g after a refused update, %g before",
			      adagrad ? "adagrad" : "sgd", i, s->w[i], w0[i]);
	if (adagrad)
		ck_assert_int_eq(memcmp(s->state[0], a0, sizeof(a0)), 0);
	ck_assert_uint_eq(st.refused, 1);
	ck_assert_uint_eq(errors, 1);
	ck_assert_uint_eq(st.applies, 0);
	ps_store_free(&st);
	ps_shardmap_free(&map);
}
END_TEST

/* ps_store_each_kept: what waits in the barriers, in slot, clock and rank
 * order, each gradient as pushed (a backup that joins is sent these under
 * replication.forward: every_push); nothing once the clocks are applied. */
static struct {
	int n, rank[8];
	uint64_t clock[8];
	float first[8];
} kept;

static void note_kept(void *arg, struct ps_slot *s, int rank, uint64_t clock, const float *g)
{
	(void)arg;
	(void)s;
	ck_assert_int_lt(kept.n, 8);
	kept.rank[kept.n] = rank;
	kept.clock[kept.n] = clock;
	kept.first[kept.n++] = g[0];
}

START_TEST(test_bsp_each_kept)
{
	static struct ps_config cfg;
	struct ps_shardmap map;
	struct ps_store st;
	float g[200];

	make_cfg(&cfg, 2, PS_SYNC);
	ck_assert_int_eq(ps_shardmap_init(&map, &cfg), 0);
	ck_assert_int_eq(ps_store_init(&st, &cfg, &map, 0), 0);
	struct ps_slot *s = ps_store_slot(&st, 0);
	/* rank 1 at clock 1, rank 0 at clock 0, rank 0 at clock 1: all wait */
	const int order[3][2] = { { 1, 1 }, { 0, 0 }, { 0, 1 } };
	for (int k = 0; k < 3; k++) {
		for (int i = 0; i < 200; i++)
			g[i] = (float)(10 * order[k][0] + order[k][1]);
		ck_assert_int_eq(offer(&st, s, order[k][0], (uint64_t)order[k][1], g), 0);
	}
	memset(&kept, 0, sizeof(kept));
	ps_store_each_kept(&st, note_kept, NULL);
	ck_assert_int_eq(kept.n, 3);
	const int want[3][2] = { { 0, 0 }, { 0, 1 }, { 1, 1 } }; /* (rank, clock) */
	for (int k = 0; k < 3; k++) {
		ck_assert_int_eq(kept.rank[k], want[k][0]);
		ck_assert_uint_eq(kept.clock[k], (uint64_t)want[k][1]);
		ck_assert_float_eq(kept.first[k], (float)(10 * want[k][0] + want[k][1]));
	}
	/* rank 1's clock 0 completes clocks 0 and 1: nothing waits */
	ck_assert_int_eq(offer(&st, s, 1, 0, g), 1);
	ck_assert_uint_eq(s->version, 2);
	memset(&kept, 0, sizeof(kept));
	ps_store_each_kept(&st, note_kept, NULL);
	ck_assert_int_eq(kept.n, 0);
	ps_store_free(&st);
	ps_shardmap_free(&map);
}
END_TEST

START_TEST(test_checksum_tracks_weights)
{
	static struct ps_config cfg;
	struct ps_shardmap map;
	struct ps_store a, b;

	make_cfg(&cfg, 1, PS_SYNC);
	ck_assert_int_eq(ps_shardmap_init(&map, &cfg), 0);
	ck_assert_int_eq(ps_store_init(&a, &cfg, &map, 0), 0);
	ck_assert_int_eq(ps_store_init(&b, &cfg, &map, 0), 0);
	ck_assert_uint_eq(ps_store_checksum(&a), ps_store_checksum(&b));
	b.slots[0].w[17] += 1.0f;
	ck_assert_uint_ne(ps_store_checksum(&a), ps_store_checksum(&b));
	/* every float of the slot counts, the last one too */
	b.slots[0].w[17] = a.slots[0].w[17];
	ck_assert_uint_eq(ps_store_checksum(&a), ps_store_checksum(&b));
	b.slots[0].w[199] += 1.0f;
	ck_assert_uint_ne(ps_store_checksum(&a), ps_store_checksum(&b));
	ps_store_free(&a);
	ps_store_free(&b);
	ps_shardmap_free(&map);
}
END_TEST

/* The vector blocks of 16 and the scalar tail: a NaN, +inf or -inf at every
 * position of arrays whose lengths cross the block edges is found, large
 * finite values and subnormals are not refused, and an untouched array passes. */
START_TEST(test_all_finite_every_position)
{
	static const float bad[] = { NAN, INFINITY, -INFINITY };
	float v[53] = { 0 };

	for (size_t n = 0; n <= 53; n++) {
		for (size_t i = 0; i < n; i++)
			v[i] = (i & 1) ? 3.4e38f : -1e-45f;
		ck_assert_int_eq(ps_words_finite(v, n), 1);
		for (size_t i = 0; i < n; i++) {
			float keep = v[i];

			for (int b = 0; b < 3; b++) {
				v[i] = bad[b];
				ck_assert_msg(!ps_words_finite(v, n), "n %zu pos %zu kind %d", n, i, b);
			}
			v[i] = keep;
		}
	}
}
END_TEST

/* The live set: a bucket waits only for live ranks; dropping a rank that
 * has not pushed completes the buckets that waited for it
 * (ps_store_advance), summing in rank order what the others pushed; a rank
 * that pushed before it was dropped still counts. */
START_TEST(test_bsp_live_set)
{
	static struct ps_config cfg;
	struct ps_shardmap map;
	struct ps_store st;
	uint8_t live[3] = { 1, 1, 1 };
	float g[3][200], w0[200];

	make_cfg(&cfg, 3, PS_SYNC);
	ck_assert_int_eq(ps_shardmap_init(&map, &cfg), 0);
	ck_assert_int_eq(ps_store_init(&st, &cfg, &map, 0), 0);
	st.live = live;
	struct ps_slot *s = &st.slots[0];
	memcpy(w0, s->w, sizeof(w0));
	grads(g, 0);
	/* clock 0: ranks 0 and 2 push, rank 1 is silent */
	for (int r = 0; r < 3; r += 2)
		ck_assert_int_eq(offer(&st, s, r, 0, g[r]), 0);
	ck_assert_uint_eq(s->version, 0);
	ck_assert_int_eq(ps_store_advance(&st), 0);  /* rank 1 still live: waits */
	live[1] = 0;
	ck_assert_int_eq(ps_store_advance(&st), 1);
	ck_assert_uint_eq(s->version, 1);
	for (int i = 0; i < 200; i++) {
		float sum = g[0][i] + g[2][i];
		ck_assert_float_eq(s->w[i], w0[i] - 0.1f * sum);
	}
	/* clock 1: with rank 1 out, rank 0 and 2 complete it on arrival */
	grads(g, 1);
	ck_assert_int_eq(offer(&st, s, 0, 1, g[0]), 0);
	ck_assert_int_eq(offer(&st, s, 2, 1, g[2]), 1);
	ck_assert_uint_eq(s->version, 2);
	/* clock 2: rank 1 back; rank 0 pushes, then drops before the others */
	live[1] = 1;
	grads(g, 2);
	ck_assert_int_eq(offer(&st, s, 0, 2, g[0]), 0);
	live[0] = 0;
	ck_assert_int_eq(ps_store_advance(&st), 0);  /* 1 and 2 are still awaited */
	ck_assert_int_eq(offer(&st, s, 1, 2, g[1]), 0);
	ck_assert_int_eq(offer(&st, s, 2, 2, g[2]), 1);
	ck_assert_uint_eq(s->version, 3);
	ps_store_free(&st);
	ps_shardmap_free(&map);
}
END_TEST

/* A sync store of 3 ranks reading the live set and ended clocks from live
 * and finished, clocks up to 64 ahead accepted. */
static void store_with_ended(struct ps_config *cfg, struct ps_shardmap *map, struct ps_store *st,
			     const uint8_t *live, const uint64_t *finished)
{
	make_cfg(cfg, 3, PS_SYNC);
	cfg->limits.max_clock_ahead = 64;
	ck_assert_int_eq(ps_shardmap_init(map, cfg), 0);
	ck_assert_int_eq(ps_store_init(st, cfg, map, 0), 0);
	st->live = live;
	st->finished = finished;
}

/* Ended clocks (a shard restarted from an older checkpoint learns from
 * its workers' Hellos that they ended clocks it has no pushes for): the
 * version passes over clocks every live rank has ended, applying nothing;
 * a bucket completes without the ranks already past its clock; a rank
 * that has not ended a clock is still waited for. */
START_TEST(test_bsp_ended_clocks)
{
	static struct ps_config cfg;
	struct ps_shardmap map;
	struct ps_store st;
	uint8_t live[3] = { 1, 1, 1 };
	uint64_t finished[3] = { 5, 5, 5 };
	float g[3][200], w0[200];

	store_with_ended(&cfg, &map, &st, live, finished);
	struct ps_slot *s = &st.slots[0];
	s->version = 5; /* as restored from a checkpoint at clock 5 */
	memcpy(w0, s->w, sizeof(w0));
	ck_assert_int_eq(ps_store_advance(&st), 0); /* nobody is past 5 */
	/* ranks 0 and 1 ended clock 8 before the restart, rank 2 clock 7 */
	finished[0] = finished[1] = 9;
	finished[2] = 8;
	ck_assert_int_eq(ps_store_advance(&st), 1);
	ck_assert_uint_eq(s->version, 8); /* passed over 5..7, nothing applied */
	ck_assert_uint_eq(s->steps, 0);
	ck_assert_mem_eq(s->w, w0, sizeof(w0));
	/* clock 8: only rank 2 still owes it; its push completes the bucket */
	grads(g, 8);
	ck_assert_int_eq(offer(&st, s, 2, 8, g[2]), 1);
	ck_assert_uint_eq(s->version, 9);
	for (int i = 0; i < 200; i++)
		ck_assert_float_eq(s->w[i], w0[i] - 0.1f * g[2][i]);
	/* clock 9: everybody pushes again; a rank not past 9 is waited for */
	finished[2] = 9;
	grads(g, 9);
	for (int r = 0; r < 2; r++)
		ck_assert_int_eq(offer(&st, s, r, 9, g[r]), 0);
	ck_assert_int_eq(ps_store_advance(&st), 0);
	ck_assert_uint_eq(s->version, 9);
	/* a dead rank's old finished clock does not hold the others back */
	live[2] = 0;
	ck_assert_int_eq(ps_store_advance(&st), 1);
	ck_assert_uint_eq(s->version, 10);
	ps_store_free(&st);
	ps_shardmap_free(&map);
}
END_TEST

/* The clock every live rank has ended is the lowest of theirs, whichever
 * rank holds it: a slot with nothing pending moves only that far. */
START_TEST(test_bsp_ended_clock_is_the_minimum)
{
	static struct ps_config cfg;
	struct ps_shardmap map;
	struct ps_store st;
	uint8_t live[3] = { 1, 1, 1 };
	uint64_t finished[3] = { 0 };
	static const uint64_t cases[][3] = { { 6, 9, 9 }, { 9, 7, 9 }, { 9, 9, 8 }, { 12, 10, 11 } };

	store_with_ended(&cfg, &map, &st, live, finished);
	struct ps_slot *s = &st.slots[0];
	s->version = 5;
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		uint64_t lo = UINT64_MAX;
		for (int r = 0; r < 3; r++) {
			finished[r] = cases[c][r];
			lo = finished[r] < lo ? finished[r] : lo;
		}
		ps_store_advance(&st);
		ck_assert_msg(s->version == lo, "finished %" PRIu64 ", %" PRIu64 ", %" PRIu64
			      ": version %" PRIu64 ", want %" PRIu64, finished[0], finished[1],
			      finished[2], s->version, lo);
	}
	ps_store_free(&st);
	ps_shardmap_free(&map);
}
END_TEST

/* ---- optimizer state through the store ---- */

/* The optimizers with state, as a config file sets them. */
static const struct {
	const char *what;
	const char *yaml;
} opt_cases[] = {
	{ "adagrad", "{name: adagrad, lr: 0.1, eps: 1e-8, initial_accumulator: 0.5}" },
	{ "momentum", "{name: momentum, lr: 0.1, momentum: 0.9}" },
	{ "momentum nesterov", "{name: momentum, lr: 0.1, momentum: 0.9, nesterov: true}" },
	{ "adam", "{name: adam, lr: 0.1, beta1: 0.9, beta2: 0.999, eps: 1e-8}" },
};

/* Gradient of step t (0 or 1) for element i: nonzero, both signs, in
 * [-0.45, 0.45]. */
static float step_grad(int t, int i)
{
	return t == 0 ? 0.05f * (float)(i % 17 - 8) + 0.01f
		      : 0.07f * (float)((i * 5) % 13 - 6) - 0.02f;
}

/* The store sets up each optimizer's state (adagrad's accumulator starts
 * at optimizer.initial_accumulator, the others at zero) and carries it from
 * step to step: the weights after one and after two pushes are the
 * optimizer's formulas, computed here in double from the config's
 * hyperparameters. */
START_TEST(test_optimizer_state_through_store)
{
	static struct ps_config cfg, opt;
	struct ps_shardmap map;
	struct ps_store st;
	double w[N], s1[N], s2[N]; /* reference weights and state */
	char yaml[512], err[512];

	snprintf(yaml, sizeof(yaml), "cluster:\n  servers: [127.0.0.1:7000]\n  workers: 1\n"
		 "model: {preset: mlp}\noptimizer: %s\n", opt_cases[_i].yaml);
	ck_assert_msg(ps_config_load_string(&opt, yaml, "opt.yaml", err, sizeof(err)) == 0, "%s",
		      err);
	make_cfg(&cfg, 1, PS_SYNC);
	cfg.optim = opt.optim;
	const struct ps_optim_cfg *o = &cfg.optim;
	ck_assert_float_eq(o->lr, 0.1f);
	if (o->kind == PS_OPT_ADAGRAD)
		ck_assert_float_eq(o->initial_accumulator, 0.5f);
	ck_assert_int_eq(ps_shardmap_init(&map, &cfg), 0);
	ck_assert_int_eq(ps_store_init(&st, &cfg, &map, 0), 0);
	struct ps_slot *s = ps_store_slot(&st, 0);
	for (int i = 0; i < N; i++) {
		w[i] = ps_init_value(&cfg, 0, i);
		s1[i] = o->kind == PS_OPT_ADAGRAD ? o->initial_accumulator : 0.0;
		s2[i] = 0.0;
	}
	for (int t = 0; t < 2; t++) {
		float g[N];
		double lr = o->lr, mu = o->momentum, b1 = o->beta1, b2 = o->beta2, eps = o->eps;

		for (int i = 0; i < N; i++) {
			double gi = g[i] = step_grad(t, i);

			switch (o->kind) {
			case PS_OPT_ADAGRAD: /* acc += g^2; w -= lr g / (sqrt(acc) + eps) */
				s1[i] += gi * gi;
				w[i] -= lr * gi / (sqrt(s1[i]) + eps);
				break;
			case PS_OPT_MOMENTUM: /* v = mu v + g; w -= lr v, or lr (g + mu v) */
				s1[i] = mu * s1[i] + gi;
				w[i] -= lr * (o->nesterov ? gi + mu * s1[i] : s1[i]);
				break;
			case PS_OPT_ADAM: { /* bias-corrected moments, step t + 1 */
				s1[i] = b1 * s1[i] + (1 - b1) * gi;
				s2[i] = b2 * s2[i] + (1 - b2) * gi * gi;
				double mhat = s1[i] / (1 - pow(b1, t + 1));
				double vhat = s2[i] / (1 - pow(b2, t + 1));
				w[i] -= lr * mhat / (sqrt(vhat) + eps);
				break;
			}
			default:
				ck_abort_msg("optimizer %d", o->kind);
			}
		}
		ck_assert_int_eq(offer(&st, s, 0, (uint64_t)t, g), 1);
		ck_assert_uint_eq(s->version, (uint64_t)t + 1);
		for (int i = 0; i < N; i++)
			ck_assert_msg(fabs(s->w[i] - w[i]) <= 1e-6 + 1e-5 * fabs(w[i]),
				      "%s step %d element %d: %.9g, want %.9g", opt_cases[_i].what,
				      t + 1, i, (double)s->w[i], w[i]);
	}
	ps_store_free(&st);
	ps_shardmap_free(&map);
}
END_TEST

/* ps_store_check, the push path's test of a gradient before it is
 * offered: a raw one of the wrong length, an unknown codec, an fp16 one
 * that does not decode, a NaN (raw) or an infinity (fp16) anywhere are
 * refused with the reason; in async mode (_i 1) also finite values whose
 * update would overflow (sgd at lr 10: w - 10 * 3e38), which sync probes
 * when it applies the clock's sum instead. Nothing is applied. */
START_TEST(test_check_refuses_bad_gradients)
{
	static struct ps_config cfg;
	struct ps_shardmap map;
	struct ps_store st;
	static float g[200];
	static uint16_t h[200];
	char err[200] = "";
	int rc;

	make_cfg(&cfg, 2, _i ? PS_ASYNC : PS_SYNC);
	cfg.optim.lr = 10;
	ck_assert_int_eq(ps_shardmap_init(&map, &cfg), 0);
	ck_assert_int_eq(ps_store_init(&st, &cfg, &map, 0), 0);
	struct ps_slot *s = ps_store_slot(&st, 0);
	static float w0[200];
	memcpy(w0, s->w, sizeof(w0));
	for (int i = 0; i < 200; i++) {
		g[i] = 0.5f;
		h[i] = 0x3800; /* 0.5 in fp16 */
	}
	struct ps_grad raw = { g, sizeof(g), 0, 0, 0, 0 }, half = { h, sizeof(h), PS_CODEC_FP16,
								    0, 0, 0 }, x;
	ck_assert_msg(ps_store_check(&st, s, &raw, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(ps_store_check(&st, s, &half, err, sizeof(err)) == 0, "%s", err);
	x = raw;
	x.len -= 4;
	ck_assert_int_eq(ps_store_check(&st, s, &x, err, sizeof(err)), PS_ESHAPE);
	ck_assert_msg(strstr(err, "796 bytes for 200 floats"), "%s", err);
	x = raw;
	x.codec = 99;
	ck_assert_int_eq(ps_store_check(&st, s, &x, err, sizeof(err)), PS_EPROTO);
	ck_assert_msg(strstr(err, "unknown codec 99"), "%s", err);
	x = half;
	x.len -= 2;
	ck_assert_int_ne(ps_store_check(&st, s, &x, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "fp16") && strstr(err, "398"), "%s", err);
	g[123] = NAN;
	err[0] = 0;
	ck_assert_int_eq(ps_store_check(&st, s, &raw, err, sizeof(err)), PS_ENOFINITE);
	ck_assert_msg(strstr(err, "NaN or infinite"), "%s", err);
	g[123] = 0.5f;
	h[7] = 0x7c00; /* +inf */
	err[0] = 0;
	ck_assert_int_eq(ps_store_check(&st, s, &half, err, sizeof(err)), PS_ENOFINITE);
	ck_assert_msg(strstr(err, "NaN or infinite"), "%s", err);
	for (int i = 0; i < 200; i++)
		g[i] = 3e38f;
	err[0] = 0;
	rc = ps_store_check(&st, s, &raw, err, sizeof(err));
	if (_i)
		ck_assert_msg(rc == PS_ENOFINITE && strstr(err, "sgd update of these finite "
							    "gradients would leave"), "%d %s", rc, err);
	else
		ck_assert_msg(rc == 0, "sync: %d %s", rc, err);
	ck_assert_uint_eq(s->version, 0);
	for (int i = 0; i < 200; i++)
		ck_assert_msg(s->w[i] == w0[i], "w[%d] = %g, was %g: a check applied something", i,
			      (double)s->w[i], (double)w0[i]);
	ps_store_free(&st);
	ps_shardmap_free(&map);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("store");
	TCase *tc = tcase_create("updates");
	int failed;

	/* generous: sanitizer builds on a loaded 2-core machine */
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_bsp_sum_order_bit_identical);
	tcase_add_loop_test(tc, test_bsp_encoded_sum_order_bit_identical, 0,
			    (int)(sizeof(enc_mixes) / sizeof(enc_mixes[0])));
	tcase_add_loop_test(tc, test_bsp_encoded_live_set, 0,
			    (int)(sizeof(enc_mixes) / sizeof(enc_mixes[0])));
	tcase_add_test(tc, test_bsp_windows_and_duplicates);
	tcase_add_test(tc, test_ssp_applies_on_arrival);
	tcase_add_test(tc, test_average_and_pushed_lr);
	tcase_add_test(tc, test_slots_take_their_group);
	tcase_add_loop_test(tc, test_bsp_refuses_nonfinite_update, 0, 2);
	tcase_add_loop_test(tc, test_bsp_single_push_refuses_nonfinite_update, 0, 2);
	tcase_add_test(tc, test_checksum_tracks_weights);
	tcase_add_test(tc, test_all_finite_every_position);
	tcase_add_test(tc, test_bsp_live_set);
	tcase_add_test(tc, test_bsp_ended_clocks);
	tcase_add_test(tc, test_bsp_ended_clock_is_the_minimum);
	tcase_add_test(tc, test_bsp_each_kept);
	tcase_add_loop_test(tc, test_check_refuses_bad_gradients, 0, 2);
	tcase_add_loop_test(tc, test_optimizer_state_through_store, 0,
			    (int)(sizeof(opt_cases) / sizeof(opt_cases[0])));
	suite_add_tcase(s, tc);
	failed = tu_run_suite(s);
	return failed ? 1 : 0;
}

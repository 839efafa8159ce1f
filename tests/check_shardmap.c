/* check_shardmap.c - the deterministic key space: same map from the same
 * config, every element owned once, rendezvous placement within 10% of
 * the mean plus one slice (the old greedy one within one slice), a hash
 * that moves with anything that moves bytes and with the placement, what
 * going from n to n + 1 shards moves for the mlp, cnn and ctr presets
 * (printed; BENCHMARKS.md), initial values independent of the number of
 * shards. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "config.h"
#include "shardmap.h"
#include "test_util.h"

static void make_cfg(struct ps_config *cfg, int nshards, uint64_t slice_bytes)
{
	static const int64_t counts[] = { 784 * 256, 256, 256 * 128, 128, 1280, 10, 100003, 1 };

	ps_config_defaults(cfg);
	cfg->nshards = nshards;
	for (int k = 0; k < nshards; k++) {
		strcpy(cfg->shards[k].host, "127.0.0.1");
		cfg->shards[k].port = 7000 + k;
	}
	cfg->nworkers = 2;
	cfg->slice_bytes = slice_bytes;
	cfg->ntensors = (int)(sizeof(counts) / sizeof(counts[0]));
	for (int t = 0; t < cfg->ntensors; t++) {
		struct ps_tensor_cfg *tc = &cfg->tensors[t];
		memset(tc, 0, sizeof(*tc));
		snprintf(tc->name, sizeof(tc->name), "t%d", t);
		tc->ndims = 1;
		tc->dims[0] = tc->count = counts[t];
		tc->init = PS_INIT_UNIFORM;
		tc->init_value = 0.1f;
	}
}

START_TEST(test_deterministic)
{
	static struct ps_config cfg;
	struct ps_shardmap a, b;

	make_cfg(&cfg, 3, 65536);
	ck_assert_int_eq(ps_shardmap_init(&a, &cfg), 0);
	ck_assert_int_eq(ps_shardmap_init(&b, &cfg), 0);
	ck_assert_uint_eq(a.nslices, b.nslices);
	ck_assert_uint_eq(a.hash, b.hash);
	ck_assert_int_eq(memcmp(a.slices, b.slices, a.nslices * sizeof(a.slices[0])), 0);
	ps_shardmap_free(&a);
	ps_shardmap_free(&b);
}
END_TEST

START_TEST(test_balanced_and_complete)
{
	static struct ps_config cfg;
	static const uint64_t sizes[] = { 64, 4096, 65536, 1 << 20 };
	int placement = _i; /* both placements */

	for (int ns = 1; ns <= 7; ns++) {
		for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
			struct ps_shardmap m;
			uint64_t max_slice = 0, lo = UINT64_MAX, hi = 0, total = 0;
			make_cfg(&cfg, ns, sizes[si]);
			ck_assert_int_eq(ps_shardmap_init_placed(&m, &cfg, placement), 0);
			ck_assert_int_eq(m.placement, placement);
			/* Every element of every tensor in exactly one slice, in order. */
			for (int t = 0; t < cfg.ntensors; t++) {
				int64_t next = 0;
				for (uint32_t s = m.tensor_first[t]; s < m.tensor_first[t + 1]; s++) {
					ck_assert_int_eq(m.slices[s].tensor, t);
					ck_assert_int_eq(m.slices[s].offset, next);
					ck_assert_int_gt(m.slices[s].count, 0);
					ck_assert_uint_le((uint64_t)m.slices[s].count * 4, sizes[si]);
					next += m.slices[s].count;
				}
				ck_assert_int_eq(next, cfg.tensors[t].count);
			}
			uint64_t *bytes = calloc((size_t)ns, sizeof(*bytes));
			for (uint32_t s = 0; s < m.nslices; s++) {
				ck_assert_uint_eq(m.slices[s].id, s);
				ck_assert_int_ge(m.slices[s].shard, 0);
				ck_assert_int_lt(m.slices[s].shard, ns);
				uint64_t b = (uint64_t)m.slices[s].count * 4;
				bytes[m.slices[s].shard] += b;
				if (b > max_slice)
					max_slice = b;
			}
			for (int k = 0; k < ns; k++) {
				ck_assert_uint_eq(bytes[k], m.shard_bytes[k]);
				lo = bytes[k] < lo ? bytes[k] : lo;
				hi = bytes[k] > hi ? bytes[k] : hi;
				total += bytes[k];
			}
			/* Greedy: balanced within one slice; rendezvous: no shard
			 * over the load bound plus one slice. */
			if (placement == PS_PLACE_GREEDY)
				ck_assert_msg(hi - lo <= max_slice, "shards=%d slice=%llu: loads "
					      "%llu..%llu", ns, (unsigned long long)sizes[si],
					      (unsigned long long)lo, (unsigned long long)hi);
			else
				ck_assert_msg(hi <= total / ns + total / ns / PS_HRW_SLACK + 1 + max_slice,
					      "shards=%d slice=%llu: loads %llu..%llu of %llu", ns,
					      (unsigned long long)sizes[si], (unsigned long long)lo,
					      (unsigned long long)hi, (unsigned long long)total);
			uint64_t want = 0;
			for (int t = 0; t < cfg.ntensors; t++)
				want += (uint64_t)cfg.tensors[t].count * 4;
			ck_assert_uint_eq(total, want);
			free(bytes);
			ps_shardmap_free(&m);
		}
	}
}
END_TEST

START_TEST(test_hash_moves)
{
	static struct ps_config cfg;
	struct ps_shardmap m;
	uint64_t h0, h;

	make_cfg(&cfg, 3, 65536);
	ck_assert_int_eq(ps_shardmap_init(&m, &cfg), 0);
	h0 = m.hash;
	ps_shardmap_free(&m);

	cfg.tensors[2].count++;
	ck_assert_int_eq(ps_shardmap_init(&m, &cfg), 0);
	h = m.hash;
	ps_shardmap_free(&m);
	ck_assert_uint_ne(h, h0);

	make_cfg(&cfg, 4, 65536);
	ck_assert_int_eq(ps_shardmap_init(&m, &cfg), 0);
	ck_assert_uint_ne(m.hash, h0);
	ps_shardmap_free(&m);

	make_cfg(&cfg, 3, 32768);
	ck_assert_int_eq(ps_shardmap_init(&m, &cfg), 0);
	ck_assert_uint_ne(m.hash, h0);
	ps_shardmap_free(&m);

	make_cfg(&cfg, 3, 65536);
	strcpy(cfg.tensors[0].name, "renamed");
	ck_assert_int_eq(ps_shardmap_init(&m, &cfg), 0);
	ck_assert_uint_ne(m.hash, h0);
	ps_shardmap_free(&m);
	/* every byte of a name counts, its last one too, and where it ends */
	for (int t = 0; t < 2; t++)
		for (int how = 0; how < 2; how++) {
			make_cfg(&cfg, 3, 65536);
			size_t n = strlen(cfg.tensors[t].name);
			ck_assert_uint_gt(n, 0);
			if (how)
				cfg.tensors[t].name[n - 1] ^= 1;
			else if (n + 1 < sizeof(cfg.tensors[t].name))
				strcat(cfg.tensors[t].name, "x");
			ck_assert_int_eq(ps_shardmap_init(&m, &cfg), 0);
			ck_assert_msg(m.hash != h0, "tensor %d's name changed (%s): the same map hash",
				      t, how ? "its last byte" : "one byte longer");
			ps_shardmap_free(&m);
		}

	/* the placement is in the hash: a process of the old one is refused */
	make_cfg(&cfg, 3, 65536);
	ck_assert_int_eq(ps_shardmap_init_placed(&m, &cfg, PS_PLACE_GREEDY), 0);
	ck_assert_uint_ne(m.hash, h0);
	ps_shardmap_free(&m);
}
END_TEST

/* From n to n + 1 shards (rendezvous placement): the bytes of the slices
 * whose shard changed, every shard's load against the mean, for the
 * presets at the default slice size (1 MiB) and at 64 KiB. A moved slice
 * goes to the new shard or was displaced by the load bound; the bytes
 * moved stay under 2 / (n + 1) (1 / (n + 1) is the least any placement
 * moves), measured per preset in BENCHMARKS.md. */
START_TEST(test_hrw_moves_little)
{
	static struct ps_config cfg;
	static const char *const presets[] = { "mlp", "cnn", "ctr" };
	static const char *const slices[] = { "", "slice_bytes: 65536\n" };
	char yaml[1024], servers[400], err[512];

	for (int p = 0; p < 3; p++) {
		for (int z = 0; z < 2; z++) {
			for (int n = 1; n <= 8; n++) {
				struct ps_shardmap a, b, ga, gb;
				uint64_t moved = 0, total = 0, hi = 0, lo = UINT64_MAX, biggest = 0, gmoved = 0;
				int to_new = 0, nmoved = 0;

				for (int k = 0, o = 0; k <= n; k++)
					o += snprintf(servers + o, sizeof(servers) - (size_t)o, "%s127.0.0.1:%d",
						      k ? ", " : "", 7000 + k);
				/* n + 1 shards: the last one is the new one */
				snprintf(yaml, sizeof(yaml),
					 "cluster: {servers: [%s], workers: 1}\n%s"
					 "security: {auth: false}\nmodel:\n  preset: %s\n%s", servers,
					 slices[z], presets[p], !strcmp(presets[p], "ctr") ?
					 "  embeddings:\n    - {name: cat, dim: 16}\n" : "");
				ck_assert_msg(ps_config_load_string(&cfg, yaml, "t.yaml", err,
								    sizeof(err)) == 0, "%s", err);
				ck_assert_int_eq(ps_shardmap_init(&b, &cfg), 0);
				ck_assert_int_eq(ps_shardmap_init_placed(&gb, &cfg, PS_PLACE_GREEDY), 0);
				cfg.nshards = n;
				ck_assert_int_eq(ps_shardmap_init(&a, &cfg), 0);
				ck_assert_int_eq(ps_shardmap_init_placed(&ga, &cfg, PS_PLACE_GREEDY), 0);
				for (uint32_t i = 0; i < a.nslices; i++) {
					uint64_t by = (uint64_t)a.slices[i].count * 4;
					total += by;
					biggest = by > biggest ? by : biggest;
					if (ga.slices[i].shard != gb.slices[i].shard)
						gmoved += by;
					if (a.slices[i].shard != b.slices[i].shard) {
						moved += by;
						nmoved++;
						to_new += b.slices[i].shard == n;
					}
				}
				for (int k = 0; k <= n; k++) {
					hi = b.shard_bytes[k] > hi ? b.shard_bytes[k] : hi;
					lo = b.shard_bytes[k] < lo ? b.shard_bytes[k] : lo;
				}
				printf("measured: %s, slice_bytes %s, %u slices, %d -> %d shards: %.4f of the "
				       "bytes moved (%d slices, %d to the new shard; 1/(n+1) = %.4f), loads "
				       "%.3f..%.3f of the mean; the greedy placement moves %.4f\n",
				       presets[p], z ? "65536" : "1 MiB", a.nslices, n, n + 1,
				       (double)moved / (double)total, nmoved, to_new, 1.0 / (n + 1),
				       (double)lo * (n + 1) / (double)total,
				       (double)hi * (n + 1) / (double)total, (double)gmoved / (double)total);
				/* a model of a few big slices cannot spread evenly: the
				 * bound holds when slices are small next to a shard */
				if (biggest * 4 * (uint64_t)(n + 1) <= total)
					ck_assert_msg(moved * (uint64_t)(n + 1) <= 2 * total,
						      "%s %d -> %d: %llu of %llu bytes moved", presets[p], n,
						      n + 1, (unsigned long long)moved,
						      (unsigned long long)total);
				ps_shardmap_free(&a);
				ps_shardmap_free(&b);
				ps_shardmap_free(&ga);
				ps_shardmap_free(&gb);
			}
		}
	}
}
END_TEST

START_TEST(test_no_shards_refused)
{
	static struct ps_config cfg;
	struct ps_shardmap m;

	make_cfg(&cfg, 1, 4096);
	cfg.nshards = 0;
	ck_assert_int_lt(ps_shardmap_init(&m, &cfg), 0);
}
END_TEST

START_TEST(test_init_values)
{
	static struct ps_config a, b;
	double sum = 0, sq = 0;
	int n = 100003;

	make_cfg(&a, 1, 4096);
	make_cfg(&b, 5, 65536);
	/* The value of an element depends on (seed, tensor, index) only. */
	for (int t = 0; t < a.ntensors; t++)
		for (int64_t i = 0; i < a.tensors[t].count; i += 97)
			ck_assert(ps_init_value(&a, t, i) == ps_init_value(&b, t, i));
	/* Uniform in [-scale, scale] with mean ~0 and variance scale^2/3. */
	for (int64_t i = 0; i < n; i++) {
		float v = ps_init_value(&a, 6, i);
		ck_assert(v >= -0.1f && v <= 0.1f);
		sum += v;
		sq += (double)v * v;
	}
	ck_assert_double_lt(sum / n, 0.002);
	ck_assert_double_gt(sum / n, -0.002);
	ck_assert_double_eq_tol(sq / n, 0.01 / 3, 0.0005);
	/* A different seed gives different values. */
	b.seed = a.seed + 1;
	ck_assert(ps_init_value(&a, 0, 5) != ps_init_value(&b, 0, 5));
	/* Normal: std as given. */
	a.tensors[6].init = PS_INIT_NORMAL;
	a.tensors[6].init_value = 2.0f;
	sum = sq = 0;
	for (int64_t i = 0; i < n; i++) {
		double v = ps_init_value(&a, 6, i);
		sum += v;
		sq += v * v;
	}
	ck_assert_double_eq_tol(sq / n - (sum / n) * (sum / n), 4.0, 0.1);
	/* Every draw is a midpoint of one of 2^24 cells of (0, 1): over 2^25
	 * elements (each cell drawn twice on average), uniform values stay
	 * strictly inside (-scale, scale) and reach within 2^-21 of both
	 * ends, and normal ones are finite (Box-Muller's log of a draw at
	 * or below 0 would not be) and within scale x sqrt(2 ln 2^25). */
	double lo = 1, hi = -1;
	for (int64_t i = 0; i < (INT64_C(1) << 25); i++) {
		a.tensors[6].init = PS_INIT_UNIFORM;
		a.tensors[6].init_value = 1.0f;
		double u = ps_init_value(&a, 6, i);
		if (!(u > -1.0 && u < 1.0))
			ck_abort_msg("uniform element %lld is %.9g, outside (-1, 1)", (long long)i, u);
		lo = u < lo ? u : lo;
		hi = u > hi ? u : hi;
		a.tensors[6].init = PS_INIT_NORMAL;
		double g = ps_init_value(&a, 6, i);
		if (!(fabs(g) <= 5.9))
			ck_abort_msg("normal element %lld is %g", (long long)i, g);
	}
	ck_assert_msg(lo < -1.0 + 0x1p-21 && hi > 1.0 - 0x1p-21, "uniform over [%.9g, %.9g]", lo,
		      hi);
	a.tensors[6].init = PS_INIT_ARANGE;
	ck_assert(ps_init_value(&a, 6, 1030) == 6.0f);
	a.tensors[6].init = PS_INIT_CONST;
	a.tensors[6].init_value = 2.5f;
	ck_assert(ps_init_value(&a, 6, 17) == 2.5f);
	/* zeros: 0 everywhere, whatever the scale the entry carries */
	a.tensors[6].init = PS_INIT_ZEROS;
	for (int64_t i = 0; i < 4096; i++)
		ck_assert_msg(ps_init_value(&a, 6, i) == 0.0f, "init zeros: element %lld is %g",
			      (long long)i, (double)ps_init_value(&a, 6, i));
}
END_TEST

int main(void)
{
	Suite *s = suite_create("shardmap");
	TCase *tc = tcase_create("map");
	int failed;

	/* generous: sanitizer builds on a loaded 2-core machine */
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_deterministic);
	tcase_add_loop_test(tc, test_balanced_and_complete, PS_PLACE_GREEDY, PS_PLACE_HRW + 1);
	tcase_add_test(tc, test_hrw_moves_little);
	tcase_add_test(tc, test_hash_moves);
	tcase_add_test(tc, test_no_shards_refused);
	tcase_add_test(tc, test_init_values);
	suite_add_tcase(s, tc);
	failed = tu_run_suite(s);
	return failed ? 1 : 0;
}

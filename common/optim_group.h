/* optim_group.h - optimizer groups of declared tensors: names, bounds,
 * comparison and wire form (common/optim_group.c). */
#ifndef PS_OPTIM_GROUP_H
#define PS_OPTIM_GROUP_H

#include <stddef.h>
#include "config.h"
#include "ps.pb-c.h"

/* The group kind name of k ("sgd" for both sgd and momentum). */
const char *ps_optim_group_kind_name(enum ps_optim_kind k);
/* The rule of a group kind name (sgd with momentum != 0: momentum);
 * 0 or PS_ECONFIG for an unknown name. */
int ps_optim_group_kind(const char *name, float momentum, enum ps_optim_kind *k);
/* 0 when o's settings are within torch's valid ranges (finite; lr >= 0,
 * 0 <= beta < 1, eps > 0, ...) and its kind fits the mode (reduce: sync
 * only); else PS_ECONFIG with group g and the field in why. */
int ps_optim_group_check(int g, const struct ps_optim_cfg *o, int async, char *why, size_t wl);
/* 0 when lr is finite and >= 0; else -EINVAL naming group g in why. */
int ps_optim_group_lr_check(int g, float lr, char *why, size_t wl);
/* 1 when a and b differ in anything but lr, with group g, the first
 * differing field and both values (a: the shard's) in why; else 0. */
int ps_optim_group_diff(int g, const struct ps_optim_cfg *a, const struct ps_optim_cfg *b,
			char *why, size_t wl);
/* o as a Declare entry (m points into o and static names). */
void ps_optim_group_to_msg(const struct ps_optim_cfg *o, Ps__OptimGroup *m);
/* A received entry into o, checked (ps_optim_group_check). */
int ps_optim_group_from_msg(int g, const Ps__OptimGroup *m, int async, struct ps_optim_cfg *o,
			    char *why, size_t wl);

#endif

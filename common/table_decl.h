/* table_decl.h - embedding tables declared at run time
 * (ps_client_declare_tables; docs/embeddings.md): their defaults and
 * bounds, which are model.embeddings[]'s (the option table cfg_table_opts
 * of config_table.c, so the rules are one), their comparison, and their
 * form on the wire (DeclareTables, proto/ps.proto). Shared by the client
 * and the shards; not a public API.
 */
#ifndef PS_TABLE_DECL_H
#define PS_TABLE_DECL_H

#include <stddef.h>
#include "config.h"
#include "ps.pb-c.h"

/* Fills t with model.embeddings[]'s defaults (name and dim empty). */
void ps_table_decl_defaults(struct ps_table_cfg *t);

/* 0 when t is a table model.embeddings[] would accept (name, dim, init
 * other than arange, the bounds of every key, ftrl with init zeros);
 * else PS_ECONFIG with the table, the key and the value in why. */
int ps_table_decl_check(const struct ps_table_cfg *t, char *why, size_t wl);

/* 0 when a and b define the same table; else 1 with "table 'x': field
 * differs: A here, B there" in why (a's value first). */
int ps_table_decl_diff(const struct ps_table_cfg *a, const struct ps_table_cfg *b,
		       const char *a_is, const char *b_is, char *why, size_t wl);

/* t as a TableDef (m points into t). */
void ps_table_decl_to_msg(const struct ps_table_cfg *t, Ps__TableDef *m);

/* A peer's TableDef into t, every value bounded (ps_table_decl_check)
 * before use: 0, or PS_EPROTO / PS_ECONFIG with the reason in why. */
int ps_table_decl_from_msg(const Ps__TableDef *m, struct ps_table_cfg *t, char *why, size_t wl);

#endif

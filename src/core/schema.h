/*
 * The schema this build expects: the migrations of sql/ it was built with
 * (src/core/schema_list.c, written by scripts/build), compared with the
 * database's version table (schema_migrations, written by scripts/migrate).
 */

#ifndef __H_SCHEMA_H
#define __H_SCHEMA_H

#include <sys/types.h>

/* The migrations this build expects, as a PostgreSQL text[] literal. */
extern const char	schema_expected[];
extern const int	schema_expected_count;

/*
 * /healthz's query: the missing migrations (behind) and the ones this
 * build does not know (ahead), each a space-separated list or NULL; $1 is
 * schema_expected. A database without the version table is an error of
 * its own (42P01: "schema not migrated").
 */
#define SCHEMA_CHECK_COLUMNS						\
	"(SELECT string_agg(e, ' ' ORDER BY e) FROM unnest($1::text[]) e "	\
	"WHERE NOT EXISTS (SELECT 1 FROM schema_migrations m "		\
	"WHERE m.name = e)) AS behind, "				\
	"(SELECT string_agg(name, ' ' ORDER BY name) FROM schema_migrations "	\
	"WHERE name <> ALL ($1::text[])) AS ahead"

void	schema_check_at_start(void);
void	schema_version_header(void);

#endif

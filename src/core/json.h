/*
 * JSON values as the API reads them: a strict RFC 8259 parser (with \u
 * escapes and surrogate pairs, which kore_json rejects) and the canonical
 * form the fingerprint is computed over.
 */

#ifndef __H_JSON_H
#define __H_JSON_H

#include <sys/types.h>
#include <sys/queue.h>

#include <kore/kore.h>

#define JSON_NULL		1
#define JSON_FALSE		2
#define JSON_TRUE		3
#define JSON_NUMBER		4
#define JSON_STRING		5
#define JSON_ARRAY		6
#define JSON_OBJECT		7

#define JSON_DEPTH_MAX		32
#define JSON_ERROR_LEN		128

struct json_value {
	int			type;

	/* Member name in an object (UTF-8, may hold NUL), else NULL. */
	char			*name;
	size_t			name_len;

	/* STRING: the decoded UTF-8. NUMBER: the literal as sent. */
	char			*str;
	size_t			len;
	int			integer;

	size_t			count;
	/* cppcheck-suppress syntaxError */
	TAILQ_HEAD(, json_value) children;
	TAILQ_ENTRY(json_value)	list;
};

struct json_value	*json_parse(const u_int8_t *, size_t, char *, size_t);
void			json_free(struct json_value *);
struct json_value	*json_member(struct json_value *, const char *);
int			json_int64(struct json_value *, int64_t *);
u_int64_t		json_parse_comparisons(void);
int			json_utf8_valid(const char *, size_t);

void	json_canonical(struct kore_buf *, struct json_value *);
void	json_canonical_members(struct kore_buf *, struct json_value **,
	    size_t);
void	json_append_string(struct kore_buf *, const char *, size_t);

#endif

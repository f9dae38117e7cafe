/*
 * Fuzz target: the Idempotency-Key header (idem_key_parse() in
 * src/core/idem_input.c), bare or as an RFC 8941 string.
 *
 * The input is the header's value as Kore hands it over, a C string. A
 * key taken is 1 to 255 visible ASCII characters; a bare value is the key
 * itself, a quoted one means its content ("a\"b" is a"b); spaces and tabs
 * around the value are not part of it. The parser
 * takes exactly the values a second, plain reading of the rule takes.
 */

#include <sys/types.h>

#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "idem.h"

static int	visible(char);
static int	expected(const char *, char *);
static int	expected_trimmed(const char *, char *);

int	LLVMFuzzerTestOneInput(const u_int8_t *, size_t);

int
LLVMFuzzerTestOneInput(const u_int8_t *data, size_t len)
{
	char		*value, *key, want[IDEM_KEY_MAX + 1];
	size_t		i, n;
	int		ok;

	/* A header value ends at its first NUL. */
	value = malloc(len + 1);
	memcpy(value, data, len);
	value[len] = '\0';

	/* Exactly what idem.c passes: r->key[IDEM_KEY_MAX + 1]. */
	key = malloc(IDEM_KEY_MAX + 1);

	ok = idem_key_parse(value, key);
	if (ok != expected(value, want))
		FUZZ_FAIL("idem_key_parse says %d for [%s]", ok, value);

	if (ok) {
		n = strlen(key);
		if (n < 1 || n > IDEM_KEY_MAX)
			FUZZ_FAIL("a key of %zu characters", n);
		for (i = 0; i < n; i++) {
			if (!visible(key[i]))
				FUZZ_FAIL("byte 0x%02x in a key",
				    (u_int8_t)key[i]);
		}
		if (strcmp(key, want))
			FUZZ_FAIL("[%s] read as [%s], not [%s]", value, key,
			    want);
	}

	free(key);
	free(value);

	return (0);
}

static int
visible(char c)
{
	return (c >= '!' && c <= '~');
}

/*
 * The rule read plainly: a bare key is all visible; a quoted one is a
 * quote, then visible characters where " and \ come escaped by a \, then
 * a closing quote that ends the value. The key it means is put in want.
 */
static int
expected(const char *value, char *want)
{
	char		*trimmed;
	size_t		len;
	int		ok;

	/* Spaces and tabs around the value are not part of it. */
	while (*value == ' ' || *value == '\t')
		value++;
	len = strlen(value);
	while (len > 0 && (value[len - 1] == ' ' || value[len - 1] == '\t'))
		len--;
	trimmed = malloc(len + 1);
	memcpy(trimmed, value, len);
	trimmed[len] = '\0';
	ok = expected_trimmed(trimmed, want);
	free(trimmed);

	return (ok);
}

/* The rule on a value without surrounding whitespace. */
static int
expected_trimmed(const char *value, char *want)
{
	size_t		i, n;

	n = 0;

	if (value[0] != '"') {
		for (i = 0; value[i] != '\0'; i++) {
			if (!visible(value[i]) || n == IDEM_KEY_MAX)
				return (0);
			want[n++] = value[i];
		}
	} else {
		for (i = 1; value[i] != '"'; i++) {
			if (value[i] == '\0' || n == IDEM_KEY_MAX)
				return (0);
			if (value[i] == '\\') {
				i++;
				if (value[i] != '"' && value[i] != '\\')
					return (0);
			} else if (!visible(value[i])) {
				return (0);
			}
			want[n++] = value[i];
		}
		if (value[i + 1] != '\0')
			return (0);
	}

	want[n] = '\0';

	return (n > 0);
}

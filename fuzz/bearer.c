/*
 * Fuzz target: the Authorization header (auth_bearer_token() in
 * src/core/auth_header.c).
 *
 * The input is the header's value, a C string. A token is found exactly
 * when the value starts with "Bearer " in any case and has something
 * after the spaces that follow; it is the rest of the value, which stays
 * inside it.
 */

#include <sys/types.h>

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "fuzz.h"

int	LLVMFuzzerTestOneInput(const u_int8_t *, size_t);

int
LLVMFuzzerTestOneInput(const u_int8_t *data, size_t len)
{
	const char	*token, *want, *scheme;
	char		*value;
	size_t		i;

	value = malloc(len + 1);
	memcpy(value, data, len);
	value[len] = '\0';

	token = auth_bearer_token(value);

	/* The rule read plainly. */
	want = NULL;
	scheme = "bearer ";
	for (i = 0; i < 7; i++) {
		if (tolower((unsigned char)value[i]) != scheme[i])
			break;
	}
	if (i == 7) {
		while (value[i] == ' ')
			i++;
		if (value[i] != '\0')
			want = value + i;
	}

	if (token != want) {
		FUZZ_FAIL("token at %td, expected at %td in [%s]",
		    token ? token - value : -1, want ? want - value : -1,
		    value);
	}

	if (token != NULL && (*token == ' ' || *token == '\0'))
		FUZZ_FAIL("a token that starts with a space or is empty");

	free(value);

	return (0);
}

/*
 * The token of an Authorization header, a function of the header's bytes
 * alone, so that a fuzz target (fuzz/bearer.c) builds it without Kore's
 * runtime.
 */

#include <sys/types.h>

#include <string.h>
#include <strings.h>

#include "auth.h"

/*
 * The token of "Bearer <token>" (the scheme in any case, spaces before
 * the token skipped), or NULL when the header holds none. The token is
 * the rest of the value, which auth.c hashes as it is.
 */
const char *
auth_bearer_token(const char *header)
{
	const char	*token;

	if (strncasecmp(header, "bearer ", 7))
		return (NULL);

	token = header + 7;
	while (*token == ' ')
		token++;

	if (*token == '\0')
		return (NULL);

	return (token);
}

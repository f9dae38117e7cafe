/*
 * A request whose body Kore would not read is refused and its connection
 * closed (framing.c).
 */

#ifndef __H_FRAMING_H
#define __H_FRAMING_H

#include <kore/kore.h>
#include <kore/http.h>

void	framing_guard_routes(void);
int	framing_check(struct http_request *, const void *);

#endif

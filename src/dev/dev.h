/*
 * Development-only routes (the dev flavor defines DEV_ROUTES), registered
 * from code so that a prod build, which has none of them, answers 404.
 */

#ifndef __H_DEV_H
#define __H_DEV_H

#include <kore/kore.h>
#include <kore/http.h>

#if defined(DEV_ROUTES)
int	dev_canonical_json(struct http_request *);
int	dev_problems(struct http_request *);
#if defined(IDEM_SANITIZE)
int	dev_sanitizer_canary(struct http_request *);
#endif
#endif

#endif

/*
 * One line per request the API answers, in logfmt (accesslog.c).
 */

#ifndef __H_ACCESSLOG_H
#define __H_ACCESSLOG_H

#include <kore/kore.h>
#include <kore/http.h>

void	access_log(struct http_request *, const char *, const char *,
	    const char *, u_int64_t, int);
void	access_log_plain(struct http_request *, const char *);

#endif

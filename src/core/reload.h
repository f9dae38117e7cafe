/*
 * Module reloads (SIGHUP, kodev reload, systemd's ExecReload) that lose
 * nothing: a worker swaps its code only while it holds no work.
 */

#ifndef __H_RELOAD_H
#define __H_RELOAD_H

#include <kore/kore.h>
#include <kore/http.h>

void	reload_hold(void);
void	reload_release(void);
int	reload_unload(void);
int	reload_defer(struct http_request *);
int	reload_pending(void);

#endif

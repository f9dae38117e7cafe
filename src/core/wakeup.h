/*
 * A timer in every worker, so that Kore's HTTP timeouts hold (wakeup.c).
 */

#ifndef __H_WAKEUP_H
#define __H_WAKEUP_H

void	wakeup_parent_set(void);
void	wakeup_start(void);
void	wakeup_stop(void);

#endif

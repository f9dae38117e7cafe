/*
 * The API's own documentation: GET /openapi.json and GET /docs.
 */

#ifndef __H_DOCS_H
#define __H_DOCS_H

void	docs_routes_register(const char *);

#endif

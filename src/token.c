/*-------------------------------------------------------------------------
 *
 * token.c
 *	  Single-use tokens against double submission.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "idem.h"

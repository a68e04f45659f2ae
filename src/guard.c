/*-------------------------------------------------------------------------
 *
 * guard.c
 *	  State machines, guarded tables and transitions.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "idem.h"

/*
 * fdatasync_shim: an LD_PRELOAD library for the tests of idem-relay's
 * stdout sink, which syncs a regular file before its messages count as
 * delivered.
 *
 *	cc -shared -fPIC -o fdatasync_shim.so fdatasync_shim.c
 *	LD_PRELOAD=.../fdatasync_shim.so idem-relay ...
 *
 * Each fdatasync(2) appends a line "fdatasync FD" to the file named by
 * IDEM_SHIM_SYNC_LOG, when set; with IDEM_SHIM_SYNC_FAIL set it then fails
 * with EIO (as on a disk that lost the write), else it syncs.  Built by
 * t/090_relay.pl.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

int
fdatasync(int fd)
{
	const char *log = getenv("IDEM_SHIM_SYNC_LOG");
	int			saved = errno;

	if (log != NULL)
	{
		char		line[64];
		int			lfd = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);

		if (lfd >= 0)
		{
			int			n = snprintf(line, sizeof(line), "fdatasync %d\n", fd);

			if (write(lfd, line, (size_t) n) != n)
				abort();
			close(lfd);
		}
		errno = saved;
	}
	if (getenv("IDEM_SHIM_SYNC_FAIL") != NULL)
	{
		errno = EIO;
		return -1;
	}
	return (int) syscall(SYS_fdatasync, fd);
}

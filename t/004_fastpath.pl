# Functions called through the fast-path protocol (libpq's PQfn), which
# passes no call expression: the functions that answer with one of idem's
# enums find their result type in the catalog.  The client is Python's
# ctypes over the system's libpq.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $node = idem_node('fastpath');
my $oid = $node->safe_psql('postgres',
	q{SELECT 'idem_try_claim(text, text)'::regprocedure::oid});

my $script = <<'PY';
import ctypes, ctypes.util, sys
pq = ctypes.CDLL(ctypes.util.find_library("pq") or "libpq.so.5")
pq.PQconnectdb.restype = ctypes.c_void_p
pq.PQconnectdb.argtypes = [ctypes.c_char_p]
pq.PQstatus.argtypes = [ctypes.c_void_p]
pq.PQerrorMessage.restype = ctypes.c_char_p
pq.PQerrorMessage.argtypes = [ctypes.c_void_p]
pq.PQresultStatus.argtypes = [ctypes.c_void_p]
pq.PQresultErrorField.restype = ctypes.c_char_p
pq.PQresultErrorField.argtypes = [ctypes.c_void_p, ctypes.c_int]

class ArgBlock(ctypes.Structure):
    _fields_ = [("len", ctypes.c_int), ("isint", ctypes.c_int), ("ptr", ctypes.c_char_p)]

pq.PQfn.restype = ctypes.c_void_p
pq.PQfn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p,
                    ctypes.POINTER(ctypes.c_int), ctypes.c_int,
                    ctypes.POINTER(ArgBlock), ctypes.c_int]

conn = pq.PQconnectdb(sys.argv[1].encode())
if pq.PQstatus(conn) != 0:
    sys.exit("connection failed: " + pq.PQerrorMessage(conn).decode())
for msg_id in ("fp-1", "fp-1"):
    args = (ArgBlock * 2)()
    for i, v in enumerate((msg_id.encode(), b"default")):
        args[i].len = len(v); args[i].isint = 0; args[i].ptr = v
    buf = ctypes.create_string_buffer(64)
    n = ctypes.c_int(0)
    res = pq.PQfn(conn, int(sys.argv[2]), buf, ctypes.byref(n), 0, args, 2)
    if pq.PQresultStatus(res) != 1:    # PGRES_COMMAND_OK
        print("error", pq.PQresultErrorField(res, ord("C")).decode())
    else:
        print(buf.raw[:n.value].decode())
PY

my ($stdout, $stderr);
my $ok = IPC::Run::run(
	[ 'python3', '-c', $script, $node->connstr('postgres'), $oid ],
	'>', \$stdout, '2>', \$stderr);
ok($ok, 'the fast-path client ran') or diag($stderr);
is($stdout, "claimed\nduplicate\n",
	'idem_try_claim through the fast path answers claimed, then duplicate');

done_testing();

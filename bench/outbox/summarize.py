#!/usr/bin/python3
"""The tables of the outbox benchmark, in markdown, from the raw lines run.sh writes (MACHINE, VERSIONS,
SETTINGS, RESULT, SIZE, SAMPLE, LOAD): medians over the rounds, and the median of each round's ratio to sl."""
import shlex
import statistics as st
import sys
from collections import defaultdict

BASE = "sl"
PHASES = [
    ("p1", "produce 1-row tx x4"),
    ("pb", "produce 100/tx x4"),
    ("c1", "consume 1 relay"),
    ("c4", "consume 4 relays"),
    ("e2e", "e2e 4 1-row producers + 4 relays"),
    ("eb", "e2e 4 100/tx producers + 4 relays"),
    ("el", "e2e 1-row, relays that wait LINGER ms"),
]
NAMES = {
    "idem": "idem (send; lease + ack)",
    "idemr": "idem, leases of runs of up to 100 messages a key (per_key => 100)",
    "sl": "hand-written SKIP LOCKED, unordered (baseline)",
    "ord": "hand-written, ordered per key (key-row lock)",
    "pgq": "PgQ",
    "pgboss": "pg-boss, key_strict_fifo",
}
LINGER = "?"  # from the run's SETTINGS line
ORDER = ["idem", "idemr", "sl", "ord", "pgq", "pgboss"]


def parse(path):
    meta, res, sizes, samples = {}, [], {}, []
    for line in open(path):
        parts = shlex.split(line)
        if not parts:
            continue
        kv = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
        if parts[0] == "RESULT":
            res.append(kv)
        elif parts[0] == "SIZE":
            sizes[kv["peer"]] = kv
        elif parts[0] == "SAMPLE":
            samples.append(kv)
        else:
            meta.update(kv)
    return meta, res, sizes, samples


def num(x, f):
    return float(x.get(f, 0) or 0)


def per_msg(x, f):
    return num(x, f) / max(num(x, "msgs"), 1)


def mb(b):
    return f"{float(b) / 1048576:.1f}"


def main(path):
    global LINGER
    meta, res, sizes, samples = parse(path)
    LINGER = meta.get("linger", "?")
    runs = defaultdict(dict)  # (peer, slot) -> round -> result
    for r in res:
        if r.get("slot") != "st":
            runs[(r["peer"], r["slot"])][r["round"]] = r
    steady = {r["peer"]: r for r in res if r.get("slot") == "st"}
    peers = [p for p in ORDER if any((p, s) in runs for s, _ in PHASES) or p in steady]
    rounds = sorted({r["round"] for r in res if r.get("slot") != "st"}, key=int)

    def metric(p, slot, f):
        return {rd: f(x) for rd, x in runs.get((p, slot), {}).items()}

    def cell(p, slot, f, fmt, ratio=True, star=False):
        v = metric(p, slot, f)
        if not v:
            return "n/a"
        c = fmt(st.median(v.values()))
        if star and any(x.get("timed_out") == "1" for x in runs[(p, slot)].values()):
            c += "*"
        if ratio and p != BASE:
            b = metric(BASE, slot, f)
            rs = [v[rd] / b[rd] for rd in v if rd in b and b[rd] > 0]
            if rs:
                c += f" ({st.median(rs):.2f}x" + (f", {min(rs):.2f}-{max(rs):.2f}" if len(rs) > 1 else "") + ")"
        if p == "pgq" and slot in ("c4", "e2e", "eb"):
            c += " [1 relay]"
        return c

    def table(f, fmt, ratio=True, star=False):
        print("| peer | " + " | ".join(label.replace("LINGER", LINGER) for _, label in PHASES) + " |")
        print("|---|" + "---|" * len(PHASES))
        for p in peers:
            print(f"| {p}: {NAMES[p]} | " + " | ".join(cell(p, s, f, fmt, ratio, star) for s, _ in PHASES) + " |")
        print()

    print(f"## Outbox benchmark, {meta.get('date', '?')}\n")
    print(f"- Machine: {meta.get('cpus', '?')} CPUs ({meta.get('model', '?')}), {meta.get('mem_gb', '?')} GB; "
          f"load average {meta.get('load_start', '?')} at the start, {meta.get('load_end', '?')} at the end. "
          "Clients and server share the CPUs.")
    print(f"- PostgreSQL {meta.get('postgres', '?')}, idem {meta.get('idem', '?')}, PgQ {meta.get('pgq', '?')}, "
          f"pg-boss {meta.get('pgboss', '?')} on Node {meta.get('node', '?')}.")
    print(f"- {meta.get('n', '?')} messages per phase, {meta.get('keys', '?')} keys, batches of {meta.get('batch', '?')}, "
          f"{len(rounds)} rounds; synchronous_commit = {meta.get('sync_commit', '?')}, autovacuum = "
          f"{meta.get('autovacuum', '?')} in the measured phases (on in the steady load); "
          f"a phase stops after {meta.get('deadline', '?')} s.\n")

    if rounds:
        rounds_tables(peers, rounds, runs, metric, table)
    order_table(peers, runs, steady)
    steady_tables(meta, peers, steady, sizes, samples)
    if rounds and "idem" in peers:
        goals(runs, metric)
    if rounds:
        every_round(peers, rounds, runs)


def rounds_tables(peers, rounds, runs, metric, table):
    print("### Throughput, messages per second\n")
    print("Median over the rounds; in brackets the median of each round's ratio to `sl` (min-max over the rounds). "
          "`*`: a phase hit the deadline (rate = messages moved / time). `[1 relay]`: PgQ has one consumer "
          "per queue, so its 4-relay columns are measured with 1.\n")
    table(lambda x: num(x, "rate"), lambda v: f"{v:,.0f}", star=True)

    print("### Server CPU per message, microseconds\n")
    print("Every process of the cluster, from /proc, over the phase, divided by the messages; in brackets the "
          "ratio to `sl` (below 1: less CPU per message than the baseline).\n")
    table(lambda x: per_msg(x, "server_cpu_us"), lambda v: f"{v:.1f}")

    print("### WAL per message, bytes\n")
    table(lambda x: per_msg(x, "wal_bytes"), lambda v: f"{v:,.0f}", ratio=False)

    print("### Messages per lease (PgQ: per batch)\n")
    print("Median over the rounds of the relays' average; leases that found nothing are not counted. Fewer "
          "messages per lease means more transactions per message.\n")
    table(lambda x: num(x, "avg_batch"), lambda v: f"{v:.1f}" if v > 0 else "-", ratio=False)


def order_table(peers, runs, steady):
    print("### Order per key and delivery, over every phase of every round\n")
    print("Inversions: a message delivered after one of the same key with a higher sequence number. Overlaps: "
          "the next message of a key handed to another relay before the relay holding the previous one had "
          "sent its acknowledgement. Lost: committed and never delivered. `sl` is not meant to keep order "
          "with several relays.\n")
    print("| peer | messages delivered | inversions | overlaps | lost | duplicates | phases out of order |")
    print("|---|---|---|---|---|---|---|")
    for p in peers:
        xs = [x for (q, s), rr in runs.items() if q == p and s in ("c1", "c4", "e2e", "eb", "el") for x in rr.values()]
        if p in steady:
            xs.append(steady[p])
        bad = sorted({x["slot"] for x in xs if num(x, "inversions") or num(x, "overlaps")})
        print(f"| {p} | {sum(num(x, 'msgs') for x in xs):,.0f} | {sum(num(x, 'inversions') for x in xs):,.0f} | "
              f"{sum(num(x, 'overlaps') for x in xs):,.0f} | {sum(num(x, 'missing') for x in xs):,.0f} | "
              f"{sum(num(x, 'dups') for x in xs):,.0f} | {', '.join(bad) or '-'} |")
    print()


def steady_tables(meta, peers, steady, sizes, samples):
    if steady:
        print("### Steady load\n")
        print(f"4 producers send {meta.get('steady_rate', '?')} messages per second in all, one per transaction, "
              f"for {meta.get('steady', '?')} s, while 4 relays (PgQ 1) deliver them (a relay that finds nothing "
              "waits 10 ms; idem's relays wait for a notification or 10 ms); autovacuum on, with its default settings. The size is that of the peer's tables, "
              "indexes and TOAST (idem: `idem.outbox*`), sampled every few seconds. PgQ runs its maintenance "
              f"(pgq.maint_operations) every 10 s with rotation_period = {meta.get('pgq_rotation', '?')}; "
              "pg-boss deletes completed jobs after 1 s, supervised every 10 s. msgs/s is what was delivered over the "
              "whole phase: below the rate sent, the peer did not keep up. The server's CPU includes the relays' "
              "polls that find nothing, and autovacuum.\n")
        print("| peer | delivered | msgs/s | server CPU us/msg | WAL B/msg | size at start (MB) | largest (MB) | "
              "at the end (MB) | inversions / overlaps / lost / duplicates |")
        print("|---|---|---|---|---|---|---|---|---|")
        for p in peers:
            x = steady.get(p)
            if not x:
                continue
            s = sizes.get(p, {})
            print(f"| {p} | {num(x, 'msgs'):,.0f}{'*' if x.get('timed_out') == '1' else ''} | {num(x, 'rate'):,.0f} | "
                  f"{per_msg(x, 'server_cpu_us'):.1f} | {per_msg(x, 'wal_bytes'):,.0f} | {mb(s.get('start', 0))} | "
                  f"{mb(s.get('max', 0))} | {mb(s.get('end', 0))} | {x.get('inversions')} / {x.get('overlaps')} / "
                  f"{x.get('missing')} / {x.get('dups')} |")
        print()
    if samples:
        print(f"#### Size of each table during the steady load\n")
        print("Every table of the peer, sampled when the load starts, every "
              f"{meta.get('sample_every', '?')} s during it, and once the relays have drained it: heap (with TOAST) and "
              "indexes in MB, live and dead rows as the statistics collector counts them, and the autovacuums of "
              "the table so far.\n")
        print("| peer | table | s | heap (MB) | indexes (MB) | live rows | dead rows | autovacuums |")
        print("|---|---|---|---|---|---|---|---|")
        for x in samples:
            print(f"| {x['peer']} | {x['rel']} | {x['t']} | {mb(x['table'])} | {mb(x['indexes'])} | "
                  f"{int(x['live']):,} | {int(x['dead']):,} | {x['autovacuums']} |")
        print()


def goals(runs, metric):
    if True:
        def ratios(p, slot, q, qslot):
            a, b = metric(p, slot, lambda x: num(x, "rate")), metric(q, qslot, lambda x: num(x, "rate"))
            rs = [a[rd] / b[rd] for rd in a if rd in b and b[rd] > 0]
            return st.median(rs) if rs else None

        print("### Goals (issue 14), same run\n")
        print("| goal | measured (median of the rounds) | |")
        print("|---|---|---|")
        for label, p, slot, q, target in [
            ("lease + ack in order per key, 1 relay: at least PgQ's consume rate", "idem", "c1", "pgq", 1.0),
            ("lease + ack in order per key, 4 relays: at least PgQ's consume rate (PgQ: 1 consumer)", "idem", "c4", "pgq", 1.0),
            ("the same with runs of up to 100 a key, 1 relay", "idemr", "c1", "pgq", 1.0),
            ("the same with runs of up to 100 a key, 4 relays (PgQ: 1 consumer)", "idemr", "c4", "pgq", 1.0),
            ("e2e, 4 one-message producers + 4 relays: at least 0.9x `sl`", "idem", "e2e", "sl", 0.9),
            ("the same, every relay (idem's and `sl`'s) waiting LINGER ms after a lease that found 1 to 99 messages", "idem", "el", "sl", 0.9),
            ("idem_outbox_send in a one-row transaction: at least 0.9x `sl`'s INSERT", "idem", "p1", "sl", 0.9),
        ]:
            label = label.replace("LINGER", LINGER)
            if (q, slot) not in runs or (p, slot) not in runs:
                print(f"| {label} | {q if (q, slot) not in runs else p} not measured | |")
                continue
            r = ratios(p, slot, q, slot)
            print(f"| {label} | {r:.2f}x {q} | {'met' if r >= target else 'MISSED'} |" if r is not None
                  else f"| {label} | - | |")
        v = metric("idem", "eb", lambda x: num(x, "rate"))
        if v:
            m = st.median(v.values())
            print(f"| e2e, 4 producers of 100 messages per transaction + 4 relays: at least 20,000 msgs/s | "
                  f"{m:,.0f} msgs/s | {'met' if m >= 20000 else 'MISSED'} |")
        print("| consume WAL per message and the size after the steady load, beside the peers' | see above | |")
        print()



def every_round(peers, rounds, runs):
    print("### Every round, messages per second\n")
    print("| peer | phase | " + " | ".join(f"round {r}" for r in rounds) + " |")
    print("|---|---|" + "---|" * len(rounds))
    for p in peers:
        for s, label in PHASES:
            rr = runs.get((p, s), {})
            if rr:
                print(f"| {p} | {s} | " + " | ".join(
                    (f"{num(rr[r], 'rate'):,.0f}" + ("*" if rr[r].get("timed_out") == "1" else "")) if r in rr else "-"
                    for r in rounds) + " |")
    print()


if __name__ == "__main__":
    main(sys.argv[1])

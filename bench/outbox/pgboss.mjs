// pgboss.mjs: the pg-boss side of the outbox benchmark (bench/outbox/run.sh), through pg-boss's own API,
// on one queue with the key_strict_fifo policy (one message of a singleton key in flight at a time, in
// order). Does what obench.c does for the SQL peers and prints the same RESULT line.
//
//   node pgboss.mjs --phase setup|produce|consume|e2e|steady [--mode single|batch] [--n N] [--keys K]
//                   [--w PRODUCERS] [--r RELAYS] [--b BATCH] [--t SECONDS] [--e EXPECT]
//                   [--steady SECONDS] [--rate MSGS_PER_S] [--poll MS]
//
// setup creates the queue; with --steady it lets completed jobs be deleted one second after completion
// and turns pg-boss's supervision on every 10 s (by default it deletes completed jobs after 7 days, and
// runs that maintenance once a day), so that its table can stay bounded in the steady phase.
// Producers: send() (one job per transaction) or insert() of BATCH jobs; relays: fetch() of up to
// BATCH jobs, then complete() of them. Connection: PGHOST (the socket directory), PGPORT, PGDATABASE,
// PGUSER.
const args = {};
for (let i = 2; i < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];
const phase = args.phase, mode = args.mode || 'single';
const N = +(args.n || 100000), K = +(args.keys || 1000), B = +(args.b || 100);
const W = phase === 'consume' ? 0 : +(args.w || 4);
const R = phase === 'produce' ? 0 : +(args.r || 1);
const DEADLINE = +(args.t || 60);
const EXPECT = +(args.e || N);
const STEADY = +(args.steady || 600), RATE = +(args.rate || 1000), POLL = +(args.poll || 1);
const steadySetup = args.steady !== undefined;
const conn = { host: process.env.PGHOST, port: +process.env.PGPORT, database: process.env.PGDATABASE, user: process.env.PGUSER };
const Q = 'outbox';

const now = () => Number(process.hrtime.bigint());
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function makeMsg(p, j) {
  const kpp = K / W, kidx = p + W * (j % kpp), seq = Math.floor(j / kpp);
  const key = 'k' + String(kidx).padStart(4, '0');
  const s = `{"key":"${key}","seq":${seq},"producer":${p},"event":"order.updated","ts":${Date.now() * 1000},"body":"`;
  let body = '';
  while (s.length + body.length < 196) body += String.fromCharCode(97 + ((s.length + body.length) % 26));
  return { key, payload: JSON.parse(s + body + '"}') };
}

const { PgBoss } = await import('pg-boss');
const boss = new PgBoss({
  ...conn, schema: 'pgboss', max: W + R + 4, migrate: true, schedule: false,
  supervise: phase === 'steady', superviseIntervalSeconds: 10, maintenanceIntervalSeconds: 10,
});
boss.on('error', (e) => console.error('pg-boss error', e));
await boss.start();

if (phase === 'setup') {
  await boss.createQueue(Q, { policy: 'key_strict_fifo', ...(steadySetup ? { deleteAfterSeconds: 1 } : {}) });
  await boss.stop({ graceful: false, wait: true, close: true });
  process.exit(0);
}

let produced = 0, consumed = 0, producersDone = 0, batches = 0, emptyLeases = 0, timedOut = 0, stop = false;
let prodEnd = 0;
const recs = []; // [key, seq, relay, t_del, t_ack]
const cpu0 = process.cpuUsage();
const t0 = now();
const elapsed = () => (now() - t0) / 1e9;

async function producer(p) {
  const per = N / W, gapMs = 1000 * W / RATE;
  for (let j = 0; !stop && (phase === 'steady' || j < per);) {
    if (phase === 'steady') {
      const due = j * gapMs;
      if (due >= STEADY * 1000) break;
      const wait = due - elapsed() * 1000;
      if (wait > 0) await sleep(wait);
    } else if (elapsed() > DEADLINE) { timedOut = 1; stop = true; break; }
    if (mode === 'single' || phase === 'steady') {
      const m = makeMsg(p, j);
      await boss.send(Q, m.payload, { singletonKey: m.key });
      j++; produced++;
    } else {
      const jobs = [];
      for (let x = j; x < j + B && x < per; x++) { const m = makeMsg(p, x); jobs.push({ data: m.payload, singletonKey: m.key }); }
      await boss.insert(Q, jobs);
      j += jobs.length; produced += jobs.length;
    }
  }
  prodEnd = elapsed();
  producersDone++;
}

function finished() {
  if (stop) return true;
  if (phase === 'consume') {
    if (consumed >= EXPECT) return true;
    if (elapsed() > DEADLINE) { timedOut = 1; stop = true; return true; }
    return false;
  }
  if (producersDone === W && consumed >= produced) return true;
  if (elapsed() > (phase === 'steady' ? STEADY : 0) + DEADLINE) { timedOut = 1; stop = true; return true; }
  return false;
}

async function relay(r) {
  while (!finished()) {
    const jobs = await boss.fetch(Q, { batchSize: B });
    if (!jobs || jobs.length === 0) { emptyLeases++; await sleep(POLL); continue; }
    const del = jobs.map((j) => [+j.data.key.slice(1), j.data.seq, r, now(), 0]);
    const tAck = now(); // just before the acknowledgement is sent
    await boss.complete(Q, jobs.map((j) => ({ id: j.id, retryCount: j.retryCount })));
    for (const d of del) { d[4] = tAck; recs.push(d); }
    consumed += jobs.length; batches++;
  }
}

const tasks = [];
for (let p = 0; p < W; p++) tasks.push(producer(p));
for (let r = 0; r < R; r++) tasks.push(relay(r));
await Promise.all(tasks);
const secs = R > 0 ? elapsed() : prodEnd;
const cpu = process.cpuUsage(cpu0);

// the checks of obench.c
let dups = 0, missing = 0, inversions = 0, overlaps = 0, keysBad = 0, distinct = 0;
const byKey = new Map();
for (const x of recs) { if (!byKey.has(x[0])) byKey.set(x[0], []); byKey.get(x[0]).push(x); }
for (const l of byKey.values()) {
  let bad = false;
  const t = [...l].sort((a, b) => a[3] - b[3]);
  for (let i = 1; i < t.length; i++) if (t[i][1] < t[i - 1][1]) { inversions++; bad = true; }
  const s = [...l].sort((a, b) => a[1] - b[1] || a[3] - b[3]);
  for (let i = 0; i < s.length; i++) {
    if (i === 0 || s[i][1] !== s[i - 1][1]) distinct++; else dups++;
    if (i > 0 && s[i][1] !== s[i - 1][1] && s[i][2] !== s[i - 1][2] && s[i][3] < s[i - 1][4]) { overlaps++; bad = true; }
  }
  if (bad) keysBad++;
}
const want = phase === 'consume' ? EXPECT : produced;
if (R > 0 && !timedOut && distinct < want) missing = want - distinct;
const msgs = R > 0 ? consumed : produced;
const f = {
  peer: 'pgboss', phase, mode: W > 0 ? (phase === 'steady' ? 'single' : mode) : '-', producers: W, relays: R, n: N,
  msgs, produced, consumed, secs: secs.toFixed(3), rate: (secs > 0 ? msgs / secs : 0).toFixed(0),
  client_cpu_s: ((cpu.user + cpu.system) / 1e6).toFixed(2), batches,
  avg_batch: batches ? (consumed / batches).toFixed(1) : 0, empty_leases: emptyLeases, dups, missing,
  inversions, overlaps, keys_out_of_order: keysBad, rec_overflow: 0, timed_out: timedOut,
};
console.log('RESULT ' + Object.entries(f).map(([k, v]) => `${k}=${v}`).join(' '));
await boss.stop({ graceful: false, wait: true, close: true });
process.exit(0);

// Unit tests of the Replica on an in-memory sql.js database: the parts of docs/PROTOCOL.md §5 to
// §9 the conformance suite does not reach (drop, drop_tables, withheld notes by key hash, repairs
// with rows outside their range, answers in parts, a history left), each against fingerprints
// recomputed from the rows held.
import assert from "node:assert/strict";
import { test } from "node:test";
import { gunzipSync } from "node:zlib";

import initSqlJs from "sql.js";

import { Fingerprint, PullClient, Replica, element, keyHash, rowVersion } from "../dist/index.js";

const SQL = await initSqlJs();
const ID = "6f1c2a9e-1b2c-4d3e-8f40-5a6b7c8d9e0f";
const ORIGIN = "1/1/a";

function fresh() {
  return new Replica(new SQL.Database(), ID);
}

function message(fields) {
  return new TextEncoder().encode(JSON.stringify({ v: 1, replica: ID, gen: 1, origin: ORIGIN, ...fields }));
}

function row(t, id, name) {
  const r = { id, name };
  return { t, k: { id }, r, h: rowVersion(JSON.stringify(r)) };
}

function rows(seq, chunks, extra = {}) {
  return message({ kind: "rows", seq, chunks, ...extra });
}

// What the replica holds, "table key scope" lines, and every scope's fingerprint recomputed from
// its rows equals the running one.
function held(replica) {
  const recomputed = new Map();
  for (const r of replica.heldRows()) {
    const fp = recomputed.get(r.scope) ?? new Fingerprint();
    fp.add(element(keyHash(r.t, r.k), r.h));
    recomputed.set(r.scope, fp);
  }
  for (const [scope, holding] of replica.holdings()) {
    const fp = recomputed.get(scope) ?? new Fingerprint();
    assert.equal(holding.fp.hex(), fp.hex(), `scope ${scope}`);
    assert.equal(holding.fp.count, fp.count, `scope ${scope}`);
  }
  return replica.heldRows().map((r) => `${r.t} ${r.k} ${r.scope}`);
}

test("rows: reset, chunks, moves between scopes, tombstones, drop, drop_tables, withheld", () => {
  const replica = fresh();
  let result = replica.apply(
    rows(1, [
      { scope: "all", from: 0, to: 10, rows: [row("a.t", 1, "x"), row("a.t", 2, "y"), row("a.u", 1, "z")] },
      { scope: "s=1", from: 0, to: 5, rows: [row("a.t", 3, "w")] },
    ], { reset: ["*"] }),
  );
  assert.equal(result.outcome, "applied");
  assert.deepEqual(held(replica), ['a.t {"id":1} all', 'a.t {"id":2} all', 'a.t {"id":3} s=1', 'a.u {"id":1} all']);
  // Row 1 moves to s=1; a tombstone of row 2 in another scope leaves it; row 3's in its scope deletes it.
  result = replica.apply(
    rows(2, [
      { scope: "s=1", from: 5, to: 7, rows: [row("a.t", 1, "x2"), { t: "a.t", k: { id: 2 }, r: null }, { t: "a.t", k: { id: 3 }, r: null }] },
    ]),
  );
  assert.deepEqual(held(replica), ['a.t {"id":1} s=1', 'a.t {"id":2} all', 'a.u {"id":1} all']);
  assert.equal(replica.holdings().get("s=1").through, "7");
  // v2: a table dropped, a row withheld by its key hash.
  result = replica.apply(
    message({
      v: 2,
      kind: "rows",
      seq: 3,
      drop_tables: ["a.u"],
      chunks: [],
      withheld: [{ t: "a.t", kh: keyHash("a.t", '{"id":2}'), why: "too big" }],
    }),
  );
  assert.equal(result.outcome, "applied");
  assert.deepEqual(held(replica), ['a.t {"id":1} s=1']);
  replica.apply(rows(4, [], { drop: ["s=1"] }));
  assert.deepEqual(held(replica), []);
  assert.deepEqual([...replica.holdings().keys()], ["all"]);
});

test("the envelope: refused, already applied, older generation, left history", () => {
  const replica = fresh();
  assert.equal(replica.apply(rows(1, [{ scope: "all", from: 0, to: 1, rows: [row("a.t", 1, "x")] }])).outcome, "applied");
  const bad = [
    '{"v":1,"kind":"rows","v":1}', // a duplicate key
    JSON.stringify({ v: 1, kind: "rows", replica: ID.toUpperCase(), gen: 1, seq: 9, chunks: [] }),
    '{"v":1.0,"kind":"rows","replica":"' + ID + '","gen":1,"seq":9,"chunks":[]}',
    '{"v":1,"kind":"rows","replica":"' + ID + '","gen":1,"seq":9e0,"chunks":[]}',
    '{"v":1,"kind":"rows","replica":"' + ID + '","gen":1,"seq":9,"chunks":[{"scope":"all","from":2,"to":1,"rows":[]}]}',
    '{"v":1,"kind":"rows","replica":"' + ID + '","gen":1,"seq":9,"chunks":[{"scope":"all","from":0,"to":1,"rows":[{"t":"a","k":{"id":1},"r":{"id":1}}]}]}',
    '{"v":1,"kind":"ranges","replica":"' + ID + '","gen":1,"seq":9,"scope":"all","ranges":[["' + "8".repeat(64) + '","' + "0".repeat(64) + '"]]}',
    '{"v":1,"kind":"filed","replica":"' + ID + '","gen":1,"seq":9,"upload":"x","kept":[]}',
  ];
  for (const text of bad) assert.equal(replica.apply(new TextEncoder().encode(text)).outcome, "malformed", text);
  assert.equal(replica.apply(message({ v: 3, kind: "whatever", seq: 9 })).outcome, "unknown version");
  assert.equal(replica.apply(rows(1, [])).outcome, "already applied");
  // A new history: applied whatever its gen and seq; the one left is ignored after.
  assert.equal(replica.apply(message({ kind: "rows", seq: 1, origin: "2/1/b", chunks: [] })).outcome, "applied");
  assert.equal(replica.apply(message({ kind: "rows", seq: 5, origin: ORIGIN, chunks: [] })).outcome, "left history");
  assert.deepEqual(held(replica), ['a.t {"id":1} all']);
  assert.equal(replica.apply(message({ kind: "rows", gen: 2, seq: 1, origin: "2/1/b", reset: ["*"], chunks: [] })).outcome, "applied");
  assert.equal(replica.apply(message({ kind: "rows", gen: 1, seq: 9, origin: "2/1/b", chunks: [] })).outcome, "older generation");
  assert.deepEqual(held(replica), []);
});

test("ranges are answered in the next upload, once; a repair keeps to its range", () => {
  const replica = fresh();
  const all = [1, 2, 3, 4, 5, 6].map((id) => row("a.t", id, "x"));
  replica.apply(rows(1, [{ scope: "all", from: 0, to: 6, rows: all }]));
  const first = JSON.parse(replica.prepareUpload().body);
  replica.markSent(first.id);
  assert.deepEqual(Object.keys(first.holds), ["all"]);
  assert.equal(replica.prepareUpload(), null, "nothing new to say");
  const half = "8" + "0".repeat(63);
  replica.apply(message({ kind: "ranges", seq: 2, scope: "all", ranges: [["0".repeat(64), half], [half, ""]] }));
  const answer = JSON.parse(replica.prepareUpload().body);
  assert.equal(answer.applied, 2);
  const [low, high] = answer.holds.all.ranges;
  assert.equal(low[3] + high[3], 6);
  assert.equal(low[0], "0".repeat(64));
  assert.equal(high[1], "");
  replica.markSent(answer.id);
  assert.equal(replica.prepareUpload(), null);
  // A repair of the low half with a row of the high half: that one is untaken, reported once.
  const inLow = all.filter((r) => keyHash(r.t, JSON.stringify(r.k)) < half);
  const inHigh = all.filter((r) => keyHash(r.t, JSON.stringify(r.k)) >= half);
  assert.ok(inLow.length > 0 && inHigh.length > 0);
  replica.apply(message({ kind: "repair", seq: 3, scope: "all", lo: "0".repeat(64), hi: half, rows: [inLow[0], inHigh[0]] }));
  assert.equal(held(replica).length, 1 + inHigh.length);
  const repaired = JSON.parse(replica.prepareUpload().body);
  assert.deepEqual(repaired.untaken, [{ seq: 3, t: "a.t", k: inHigh[0].k, why: "outside the repaired range" }]);
  replica.markSent(repaired.id);
  assert.equal(replica.prepareUpload(), null);
});

test("uploads: the same id until taken; answers in parts, kept by key hash, filed later", () => {
  const replica = fresh();
  replica.apply(rows(1, [{ scope: "all", from: 0, to: 1, rows: [row("a.t", 1, "x")] }]));
  replica.write("a.t", '{"id":1,"name":"mine"}', ["id"]);
  for (const id of [2, 3, 4]) replica.write("a.s", `{"id":${id},"q":1}`, ["id"]);
  replica.write("a.s", '{"q":2,"id":4}'); // replaces the pending write of row 4
  const offered = JSON.parse(replica.prepareUpload().body);
  assert.equal(JSON.parse(replica.prepareUpload().body).id, offered.id);
  assert.deepEqual(offered.rows.map((r) => JSON.stringify(r.r)), ['{"id":1,"name":"mine"}', '{"id":2,"q":1}', '{"id":3,"q":1}', '{"id":4,"q":2}']);
  replica.markSent(offered.id);
  const filed = (seq, kept, more) => message({ kind: "filed", seq, upload: offered.id, kept, ...(more ? { more: true } : {}) });
  replica.apply(filed(2, [{ t: "a.s", k: { id: 2 }, why: "check" }], true));
  replica.apply(filed(3, [{ t: "a.s", kh: keyHash("a.s", '{"id":3}'), why: "fk" }], false));
  const shown = JSON.parse(replica.showJson());
  assert.deepEqual(shown.kept.map((k) => [k.k.id, k.why, k.r !== null]), [[2, "check", true], [3, "fk", true]]);
  assert.deepEqual(shown.local_writes, []);
  // Row 1 is held with the write over it; row 4 was not held: its row comes down.
  assert.deepEqual(shown.held["a.t"][0].r, { id: 1, name: "mine" });
  assert.equal(shown.held["a.t"][0].h, rowVersion('{"id":1,"name":"mine"}'));
  held(replica);
  // A later answer: 3 still kept, 2 filed on a retry; the same again changes nothing.
  replica.apply(filed(4, [{ t: "a.s", k: { id: 3 }, why: "fk still" }], false));
  replica.apply(filed(5, [{ t: "a.s", k: { id: 3 }, why: "fk still" }], false));
  assert.deepEqual(JSON.parse(replica.showJson()).kept.map((k) => [k.k.id, k.why]), [[3, "fk still"]]);
});

// With gzipUploads, PullClient posts each upload as one gzip member that inflates to the upload's
// JSON and says Content-Encoding: gzip (§7); without it, the JSON as it is.
test("uploads through the up route: gzip with gzipUploads", async () => {
  for (const gzipUploads of [true, false]) {
    const replica = fresh();
    replica.write("a.s", '{"id":1,"q":"' + "tea ".repeat(500) + '"}', ["id"]);
    const expected = replica.prepareUpload().body;
    const posted = [];
    const fetch = async (url, init) => {
      posted.push({ url, headers: init.headers, body: Buffer.from(await new Response(init.body).arrayBuffer()) });
      return new Response("filed\n", { status: 200 });
    };
    const client = new PullClient(replica, { url: "http://gateway/", token: "T", save: () => {}, fetch, gzipUploads });
    assert.equal(await client.upload(), true);
    assert.equal(posted.length, 1);
    assert.equal(posted[0].url, `http://gateway/replicas/${ID}/up`);
    assert.equal(posted[0].headers.Authorization, "Bearer T");
    if (gzipUploads) {
      assert.equal(posted[0].headers["Content-Encoding"], "gzip");
      assert.equal(gunzipSync(posted[0].body).toString(), expected);
      assert.ok(posted[0].body.length < expected.length / 10, `${posted[0].body.length} bytes`);
    } else {
      assert.equal(posted[0].headers["Content-Encoding"], undefined);
      assert.equal(posted[0].body.toString(), expected);
    }
    assert.equal(replica.prepareUpload(), null); // taken: marked sent
  }
});

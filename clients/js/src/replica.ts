// A device replica on SQLite through sql.js (docs/PROTOCOL.md §1, §6 to §9): it applies the
// server's messages, each in one transaction with its position, keeps each scope's running
// fingerprint, queues the app's writes and builds the uploads that carry them up.
import type { Database, SqlValue } from "sql.js";

import { Fingerprint, element, keyHash, rowVersion } from "./fingerprint.js";
import { JsonError, canonical, canonicalString, isObject, parseJson } from "./json.js";
import {
  Chunk,
  DownMessage,
  FiledMessage,
  KeyNote,
  Malformed,
  RepairMessage,
  Row,
  RowsMessage,
  VersionTooNew,
  decodeDown,
  isUuid,
} from "./messages.js";

const kSchema = `
CREATE TABLE IF NOT EXISTS state (
  only INTEGER PRIMARY KEY CHECK (only = 1),
  replica TEXT NOT NULL,
  gen TEXT NOT NULL DEFAULT '0',     -- integers of up to 2^63 - 1, as their decimal text
  seq TEXT NOT NULL DEFAULT '0',
  origin TEXT,                       -- of the last message applied; NULL: none said
  ack_through TEXT,                  -- the last seq the server must hear was applied
  applied_sent TEXT                  -- "applied" of the last upload the server took, this gen
);
CREATE TABLE IF NOT EXISTS left_origins (origin TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS scopes (scope TEXT PRIMARY KEY, through TEXT NOT NULL, fp TEXT NOT NULL, n INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS rows (
  tbl TEXT NOT NULL, key TEXT NOT NULL, scope TEXT NOT NULL,
  kh TEXT NOT NULL, h TEXT NOT NULL, body TEXT NOT NULL,
  PRIMARY KEY (tbl, key)
);
CREATE INDEX IF NOT EXISTS rows_by_scope_kh ON rows (scope, kh);
CREATE TABLE IF NOT EXISTS table_keys (tbl TEXT PRIMARY KEY, columns TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS local_writes (
  id INTEGER PRIMARY KEY AUTOINCREMENT, tbl TEXT NOT NULL, key TEXT NOT NULL, body TEXT NOT NULL, upload TEXT
);
CREATE TABLE IF NOT EXISTS kept (
  id INTEGER PRIMARY KEY AUTOINCREMENT, tbl TEXT NOT NULL, key TEXT, kh TEXT NOT NULL, body TEXT,
  why TEXT NOT NULL, upload TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS kept_named (upload TEXT NOT NULL, kept INTEGER NOT NULL, PRIMARY KEY (upload, kept));
CREATE TABLE IF NOT EXISTS uploads (
  number INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, sent INTEGER NOT NULL DEFAULT 0,
  rows INTEGER NOT NULL, body TEXT, said TEXT
);
CREATE TABLE IF NOT EXISTS advertised (scope TEXT PRIMARY KEY, through TEXT NOT NULL, fp TEXT NOT NULL, n INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS untaken (seq TEXT NOT NULL, tbl TEXT NOT NULL, key TEXT NOT NULL, why TEXT NOT NULL, PRIMARY KEY (seq, tbl, key));
CREATE TABLE IF NOT EXISTS range_requests (position INTEGER PRIMARY KEY AUTOINCREMENT, scope TEXT NOT NULL, lo TEXT NOT NULL, hi TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS notices (id INTEGER PRIMARY KEY AUTOINCREMENT, text TEXT NOT NULL);
`;

/** What became of a message (§6, §10). */
export type Outcome =
  | "applied"
  | "already applied" // this generation's seq was applied before: nothing changed
  | "older generation" // from before the server last provisioned this replica: ignored
  | "left history" // of an origin this replica left: ignored
  | "unknown version" // a protocol version above this replica's: refused, to come again
  | "malformed"; // can never be applied

export interface ApplyResult {
  outcome: Outcome;
  kind?: string;
  detail?: string;
}

/** The transport may drop the message: applied now or before, or ignored for good. */
export function taken(outcome: Outcome): boolean {
  return outcome === "applied" || outcome === "already applied" || outcome === "older generation" || outcome === "left history";
}

/** The local database failed: nothing was applied; delivering the message again may help. */
export class StorageError extends Error {}

export interface HeldRow {
  t: string;
  k: string;
  r: string;
  h: string;
  scope: string;
}

export interface Holding {
  through: string;
  fp: Fingerprint;
}

export interface PreparedUpload {
  id: string;
  body: string;
}

/** What an upload said, to take as heard when the route takes it (§7). */
interface Said {
  position: string; // gen/seq/origin when it was built
  applied: string | null;
  holds: Record<string, [string, string, number]>;
  untaken: [string, string, string][];
  ranges: number[];
}

type Params = SqlValue[];

function newUuid(): string {
  const c = globalThis.crypto;
  if (typeof c?.randomUUID === "function") return c.randomUUID();
  const bytes = new Uint8Array(16);
  c.getRandomValues(bytes);
  bytes[6] = (bytes[6] & 0x0f) | 0x40;
  bytes[8] = (bytes[8] & 0x3f) | 0x80;
  const hex = [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

export class Replica {
  /** Something changed since the last call of takeChanged(): the file must be saved. */
  private changed = false;
  // Per message: the scopes it touched, written back at its end.
  private scopes = new Map<string, Holding | null>();
  private untakenCount = 0;

  /** Opens the replica `id` in `db` (an empty database is made one); another's is refused. */
  constructor(
    private readonly db: Database,
    readonly id: string,
  ) {
    if (!isUuid(id)) throw new Error(`--id wants a lowercase UUID, got ${id}`);
    this.transaction(() => {
      db.exec(kSchema);
      const owner = this.one("SELECT replica FROM state");
      if (owner === undefined) {
        this.run("INSERT INTO state (only, replica) VALUES (1, ?)", [id]);
      } else if (owner.replica !== id) {
        throw new Error(`this database belongs to replica ${owner.replica}, not ${id}`);
      }
    });
  }

  /** Whether anything changed since it was last asked (then: save the database). */
  takeChanged(): boolean {
    const changed = this.changed;
    this.changed = false;
    return changed;
  }

  // ---- SQL ----------------------------------------------------------------------------------

  private all(sql: string, params: Params = []): Record<string, SqlValue>[] {
    const statement = this.db.prepare(sql);
    try {
      statement.bind(params);
      const rows: Record<string, SqlValue>[] = [];
      while (statement.step()) rows.push(statement.getAsObject());
      return rows;
    } finally {
      statement.free();
    }
  }

  private one(sql: string, params: Params = []): Record<string, SqlValue> | undefined {
    return this.all(sql, params)[0];
  }

  private run(sql: string, params: Params = []): void {
    this.db.run(sql, params);
  }

  private transaction<T>(body: () => T): T {
    this.db.exec("BEGIN");
    let result: T;
    try {
      result = body();
    } catch (error) {
      this.db.exec("ROLLBACK");
      this.scopes.clear();
      throw error;
    }
    try {
      this.db.exec("COMMIT");
    } catch (error) {
      throw new StorageError(`commit failed: ${error}`);
    }
    this.changed = true;
    return result;
  }

  private notice(text: string): void {
    this.run("INSERT INTO notices (text) VALUES (?)", [text]);
    this.run("DELETE FROM notices WHERE id <= (SELECT max(id) - 100 FROM notices)");
  }

  // ---- applying -----------------------------------------------------------------------------

  /** Applies one down message (§6). Throws StorageError when the database failed. */
  apply(bytes: Uint8Array): ApplyResult {
    let message: DownMessage;
    try {
      message = decodeDown(bytes);
    } catch (error) {
      if (error instanceof VersionTooNew) {
        this.transaction(() => this.notice(`ignored a message: ${error.message}`));
        return { outcome: "unknown version", detail: error.message };
      }
      if (error instanceof Malformed) return { outcome: "malformed", detail: error.message };
      throw error;
    }
    if (message.replica !== this.id)
      return { outcome: "malformed", kind: message.kind, detail: `addressed to replica ${message.replica}, this is ${this.id}` };
    try {
      return this.transaction(() => this.applyDecoded(message));
    } catch (error) {
      if (error instanceof StorageError) throw error;
      if (error instanceof Malformed) return { outcome: "malformed", kind: message.kind, detail: error.message };
      throw new StorageError(`${error}`);
    }
  }

  private applyDecoded(message: DownMessage): ApplyResult {
    const state = this.one("SELECT gen, seq, origin FROM state")!;
    const gen = BigInt(state.gen as string);
    const seq = BigInt(state.seq as string);
    const held = state.origin as string | null;
    const result = { kind: message.kind };
    const newHistory = message.origin !== null && held !== null && message.origin !== held;
    if (newHistory && this.one("SELECT 1 AS x FROM left_origins WHERE origin = ?", [message.origin]))
      return { ...result, outcome: "left history", detail: `of origin ${message.origin}, which this replica left` };
    if (!newHistory && message.gen < gen)
      return { ...result, outcome: "older generation", detail: `generation ${message.gen}, this replica is at ${gen}` };
    if (!newHistory && message.gen === gen && message.seq <= seq)
      return { ...result, outcome: "already applied", detail: `seq ${message.seq}, applied through ${seq}` };

    this.scopes.clear();
    this.untakenCount = 0;
    if (newHistory) {
      this.run("INSERT OR IGNORE INTO left_origins (origin) VALUES (?)", [held]);
      this.notice(`the server's history changed (origin ${held} to ${message.origin}): what this replica holds is proven again`);
    }
    if (message.gen > gen || newHistory) {
      if (message.gen > gen) this.resetEverything();
      this.db.exec(
        "DELETE FROM advertised; DELETE FROM untaken; UPDATE uploads SET sent = 0; UPDATE state SET applied_sent = NULL, ack_through = NULL;",
      );
    }
    let wantsAcknowledgement = true;
    switch (message.kind) {
      case "rows":
        this.applyRows(message);
        break;
      case "filed":
        wantsAcknowledgement = this.applyFiled(message);
        break;
      case "ranges":
        this.run("DELETE FROM range_requests WHERE scope = ?", [message.scope]);
        for (const [lo, hi] of message.ranges)
          this.run("INSERT INTO range_requests (scope, lo, hi) VALUES (?, ?, ?)", [message.scope, lo, hi]);
        break;
      case "repair":
        this.applyRepair(message);
        break;
    }
    this.flushScopes();
    this.run(
      "UPDATE state SET gen = ?, seq = ?, origin = coalesce(?, origin), ack_through = CASE WHEN ? THEN ? ELSE ack_through END",
      [message.gen.toString(), message.seq.toString(), message.origin, wantsAcknowledgement ? 1 : 0, message.seq.toString()],
    );
    return { ...result, outcome: "applied", detail: this.untakenCount ? `${this.untakenCount} rows untaken` : undefined };
  }

  // The scopes a message touches, read once and written back at its end.
  private scope(name: string, create: boolean): Holding | null {
    let holding = this.scopes.get(name);
    if (holding === undefined) {
      const row = this.one("SELECT through, fp, n FROM scopes WHERE scope = ?", [name]);
      holding = row ? { through: row.through as string, fp: Fingerprint.fromHex(row.fp as string, row.n as number) } : null;
      this.scopes.set(name, holding);
    }
    if (holding === null && create) {
      holding = { through: "0", fp: new Fingerprint() };
      this.scopes.set(name, holding);
    }
    return holding;
  }

  private flushScopes(): void {
    for (const [name, holding] of this.scopes) {
      if (holding === null) this.run("DELETE FROM scopes WHERE scope = ?", [name]);
      else
        this.run("INSERT OR REPLACE INTO scopes (scope, through, fp, n) VALUES (?, ?, ?, ?)", [
          name,
          holding.through,
          holding.fp.hex(),
          holding.fp.count,
        ]);
    }
    this.scopes.clear();
  }

  private resetEverything(): void {
    this.db.exec("DELETE FROM rows; DELETE FROM scopes; DELETE FROM range_requests; DELETE FROM advertised;");
    this.scopes.clear();
  }

  // Deletes a scope's rows and range requests; holds it again empty (reset) or not at all (drop).
  private emptyScope(name: string, holdAgain: boolean): void {
    this.run("DELETE FROM rows WHERE scope = ?", [name]);
    this.run("DELETE FROM range_requests WHERE scope = ?", [name]);
    this.run("DELETE FROM advertised WHERE scope = ?", [name]);
    this.scopes.set(name, holdAgain ? { through: "0", fp: new Fingerprint() } : null);
  }

  // Takes a held row out of its scope's fingerprint and out of the table.
  private unhold(row: Record<string, SqlValue>): void {
    this.scope(row.scope as string, false)?.fp.remove(element(row.kh as string, row.h as string));
    this.run("DELETE FROM rows WHERE tbl = ? AND key = ?", [row.tbl, row.key]);
  }

  // Stores a row with a body in `scope`, moving it from the scope it was held in.
  private hold(row: Row, scope: string, kh: string): void {
    const before = this.one("SELECT tbl, key, scope, kh, h FROM rows WHERE tbl = ? AND key = ?", [row.t, row.k]);
    if (before) this.scope(before.scope as string, false)?.fp.remove(element(before.kh as string, before.h as string));
    this.run("INSERT OR REPLACE INTO rows (tbl, key, scope, kh, h, body) VALUES (?, ?, ?, ?, ?, ?)", [
      row.t,
      row.k,
      scope,
      kh,
      row.h,
      row.r,
    ]);
    this.scope(scope, true)!.fp.add(element(kh, row.h!));
  }

  private applyRows(message: RowsMessage): void {
    for (const scope of message.reset) {
      if (scope === "*") this.resetEverything();
      else this.emptyScope(scope, true);
    }
    for (const scope of message.drop) this.emptyScope(scope, false);
    for (const table of message.dropTables)
      for (const row of this.all("SELECT tbl, key, scope, kh, h FROM rows WHERE tbl = ?", [table])) this.unhold(row);
    for (const chunk of message.chunks) this.applyChunk(chunk);
    for (const note of message.withheld) {
      const row = this.heldByNote(note);
      if (row) this.unhold(row);
      this.notice(`withheld by the server: ${note.t} ${note.k ?? `(key hash ${note.kh})`}: ${note.why}`);
    }
  }

  private heldByNote(note: KeyNote): Record<string, SqlValue> | undefined {
    if (note.k !== null) return this.one("SELECT tbl, key, scope, kh, h FROM rows WHERE tbl = ? AND key = ?", [note.t, note.k]);
    return this.one("SELECT tbl, key, scope, kh, h FROM rows WHERE tbl = ? AND kh = ?", [note.t, note.kh]);
  }

  private applyChunk(chunk: Chunk): void {
    const holding = this.scope(chunk.scope, true)!;
    for (const row of chunk.rows) {
      if (row.r !== null) {
        this.hold(row, chunk.scope, keyHash(row.t, row.k));
        continue;
      }
      const held = this.one("SELECT tbl, key, scope, kh, h FROM rows WHERE tbl = ? AND key = ? AND scope = ?", [
        row.t,
        row.k,
        chunk.scope,
      ]);
      if (held) this.unhold(held);
    }
    holding.through = chunk.to.toString();
  }

  private applyRepair(message: RepairMessage): void {
    const inRange = (kh: string) => kh >= message.lo && (message.hi === "" || kh < message.hi);
    for (const row of this.all(
      "SELECT tbl, key, scope, kh, h FROM rows WHERE scope = ? AND kh >= ? AND (? = '' OR kh < ?)",
      [message.scope, message.lo, message.hi, message.hi],
    ))
      this.unhold(row);
    this.scope(message.scope, true);
    for (const row of message.rows) {
      if (row.r === null) continue;
      const kh = keyHash(row.t, row.k);
      if (!inRange(kh)) {
        this.run("INSERT OR REPLACE INTO untaken (seq, tbl, key, why) VALUES (?, ?, ?, ?)", [
          message.seq.toString(),
          row.t,
          row.k,
          "outside the repaired range",
        ]);
        ++this.untakenCount;
        continue;
      }
      this.hold(row, message.scope, kh);
    }
  }

  // A filed answer (§7, Answers). Returns whether the server must hear it was applied.
  private applyFiled(message: FiledMessage): boolean {
    const upload = this.one("SELECT rows FROM uploads WHERE id = ?", [message.upload]);
    if (upload === undefined) {
      this.laterAnswer(message);
      return true;
    }
    const writes = () =>
      this.all("SELECT id, tbl, key, body FROM local_writes WHERE upload = ? ORDER BY id", [message.upload]);
    const keep = (write: Record<string, SqlValue>, why: string) => {
      this.run("INSERT INTO kept (tbl, key, kh, body, why, upload) VALUES (?, ?, ?, ?, ?, ?)", [
        write.tbl,
        write.key,
        keyHash(write.tbl as string, write.key as string),
        write.body,
        why,
        message.upload,
      ]);
      this.run("DELETE FROM local_writes WHERE id = ?", [write.id]);
    };
    for (const note of message.kept) {
      if (note.t === "") {
        for (const write of writes()) keep(write, note.why);
        continue;
      }
      const named = writes().filter(
        (write) => write.tbl === note.t && (note.k !== null ? write.key === note.k : keyHash(note.t, write.key as string) === note.kh),
      );
      for (const write of named) keep(write, note.why);
      if (named.length === 0)
        this.run("INSERT INTO kept (tbl, key, kh, body, why, upload) VALUES (?, ?, ?, NULL, ?, ?)", [
          note.t,
          note.k,
          note.kh ?? keyHash(note.t, note.k!),
          note.why,
          message.upload,
        ]);
    }
    if (message.more) return true;
    // The last part: every write not named was filed; it is held over the row it was written on.
    for (const write of writes()) {
      this.run("DELETE FROM local_writes WHERE id = ?", [write.id]);
      const held = this.one("SELECT tbl, key, scope, kh, h, body FROM rows WHERE tbl = ? AND key = ?", [write.tbl, write.key]);
      if (!held) continue; // the server's row comes down
      const merged = parseJson(held.body as string);
      const over = parseJson(write.body as string);
      if (!isObject(merged) || !isObject(over)) continue;
      for (const [name, value] of over) merged.set(name, value);
      const body = canonical(merged);
      this.hold({ t: write.tbl as string, k: write.key as string, r: body, h: rowVersion(body) }, held.scope as string, held.kh as string);
    }
    this.run("DELETE FROM uploads WHERE id = ?", [message.upload]);
    return (upload.rows as number) > 0;
  }

  private laterAnswer(message: FiledMessage): void {
    const keptRows = () => this.all("SELECT id, tbl, key, kh FROM kept WHERE upload = ?", [message.upload]);
    const name = (id: SqlValue, why: string) => {
      this.run("UPDATE kept SET why = ? WHERE id = ?", [why, id]);
      this.run("INSERT OR IGNORE INTO kept_named (upload, kept) VALUES (?, ?)", [message.upload, id]);
    };
    for (const note of message.kept) {
      const named = keptRows().filter(
        (row) => note.t === "" || (row.tbl === note.t && (note.k !== null ? row.key === note.k : row.kh === note.kh)),
      );
      for (const row of named) name(row.id, note.why);
      if (named.length === 0 && note.t !== "") {
        this.run("INSERT INTO kept (tbl, key, kh, body, why, upload) VALUES (?, ?, ?, NULL, ?, ?)", [
          note.t,
          note.k,
          note.kh ?? keyHash(note.t, note.k!),
          note.why,
          message.upload,
        ]);
        const id = this.one("SELECT last_insert_rowid() AS id")!.id;
        this.run("INSERT OR IGNORE INTO kept_named (upload, kept) VALUES (?, ?)", [message.upload, id]);
      }
    }
    if (message.more) return;
    for (const row of keptRows()) {
      if (this.one("SELECT 1 AS x FROM kept_named WHERE upload = ? AND kept = ?", [message.upload, row.id])) continue;
      this.run("DELETE FROM kept WHERE id = ?", [row.id]);
      this.notice(`filed by the server after it was kept: ${row.tbl} ${row.key}`);
    }
    this.run("DELETE FROM kept_named WHERE upload = ?", [message.upload]);
  }

  // ---- local writes -------------------------------------------------------------------------

  /**
   * Queues a row the app wrote to a `record` or `both` table, keyed by `keyColumns` (else the
   * key columns its rows came with, else "id"). A newer write to a row whose write is not yet in
   * an upload replaces it.
   */
  write(table: string, rowJson: string, keyColumns: string[] = []): { id: number; key: string } {
    let row;
    try {
      row = parseJson(rowJson);
    } catch (error) {
      if (error instanceof JsonError) throw new Error(`the row is not JSON: ${error.message}`);
      throw error;
    }
    if (!isObject(row)) throw new Error("the row is not a JSON object");
    return this.transaction(() => {
      let columns = keyColumns;
      if (columns.length === 0) {
        const known = this.one("SELECT columns FROM table_keys WHERE tbl = ?", [table]);
        const heldKey = this.one("SELECT key FROM rows WHERE tbl = ? LIMIT 1", [table]);
        if (known) columns = JSON.parse(known.columns as string);
        else if (heldKey) columns = [...(parseJson(heldKey.key as string) as Map<string, unknown>).keys()];
        else columns = ["id"];
      }
      const key = new Map();
      for (const column of columns) {
        if (!row.has(column)) throw new Error(`the row has no key column ${column}`);
        key.set(column, row.get(column)!);
      }
      this.run("INSERT OR REPLACE INTO table_keys (tbl, columns) VALUES (?, ?)", [table, JSON.stringify(columns)]);
      const keyText = canonical(key);
      const body = canonical(row);
      const pending = this.one("SELECT id FROM local_writes WHERE tbl = ? AND key = ? AND upload IS NULL", [table, keyText]);
      if (pending) {
        this.run("UPDATE local_writes SET body = ? WHERE id = ?", [body, pending.id]);
        return { id: pending.id as number, key: keyText };
      }
      this.run("INSERT INTO local_writes (tbl, key, body) VALUES (?, ?, ?)", [table, keyText, body]);
      return { id: this.one("SELECT last_insert_rowid() AS id")!.id as number, key: keyText };
    });
  }

  // ---- uploads ------------------------------------------------------------------------------

  /**
   * The next upload (§7), or null when there is nothing new to say. Until markSent() is called
   * for it, the same upload (same id, same rows) is offered again, brought up to date.
   */
  prepareUpload(maxRows = 1000): PreparedUpload | null {
    return this.transaction(() => {
      let upload = this.one("SELECT id FROM uploads WHERE sent = 0 ORDER BY number LIMIT 1")?.id as string | undefined;
      if (upload === undefined) {
        const pending = this.all("SELECT id FROM local_writes WHERE upload IS NULL ORDER BY id LIMIT ?", [maxRows]);
        if (pending.length === 0 && !this.hasNews()) return null;
        upload = newUuid();
        this.run("INSERT INTO uploads (id, rows) VALUES (?, ?)", [upload, pending.length]);
        for (const write of pending) this.run("UPDATE local_writes SET upload = ? WHERE id = ?", [upload, write.id]);
      }
      const body = this.encodeUpload(upload);
      return { id: upload, body };
    });
  }

  private hasNews(): boolean {
    const state = this.one("SELECT ack_through, applied_sent FROM state")!;
    if (state.ack_through !== null && (state.applied_sent === null || BigInt(state.ack_through as string) > BigInt(state.applied_sent as string)))
      return true;
    if (this.one("SELECT 1 AS x FROM untaken LIMIT 1")) return true;
    if (this.one("SELECT 1 AS x FROM range_requests LIMIT 1")) return true;
    return this.changedHoldings().length > 0;
  }

  private changedHoldings(): Record<string, SqlValue>[] {
    return this.all(
      `SELECT s.scope, s.through, s.fp, s.n FROM scopes s LEFT JOIN advertised a ON a.scope = s.scope
       WHERE a.scope IS NULL OR a.through <> s.through OR a.fp <> s.fp OR a.n <> s.n
          OR s.scope IN (SELECT scope FROM range_requests) ORDER BY s.scope`,
    );
  }

  private position(): string {
    const state = this.one("SELECT gen, seq, origin FROM state")!;
    return `${state.gen}/${state.seq}/${state.origin ?? ""}`;
  }

  // The upload's body: v and id first, then the members in the order of §7's example.
  private encodeUpload(upload: string): string {
    const state = this.one("SELECT gen, seq, origin FROM state")!;
    const said: Said = { position: this.position(), applied: null, holds: {}, untaken: [], ranges: [] };
    const rows = this.all("SELECT tbl, body FROM local_writes WHERE upload = ? ORDER BY id", [upload]).map(
      (write) => `{"t":${canonicalString(write.tbl as string)},"r":${write.body}}`,
    );
    let body = `{"v":1,"id":"${upload}","rows":[${rows.join(",")}]`;
    if (state.gen !== "0") {
      said.applied = state.seq as string;
      body += `,"applied":${state.seq}`;
    }
    if (state.origin !== null) body += `,"origin":${canonicalString(state.origin as string)}`;
    const untaken = this.all("SELECT seq, tbl, key, why FROM untaken ORDER BY CAST(seq AS INTEGER), tbl, key");
    if (untaken.length > 0) {
      body += `,"untaken":[${untaken
        .map((row) => `{"seq":${row.seq},"t":${canonicalString(row.tbl as string)},"k":${row.key},"why":${canonicalString(row.why as string)}}`)
        .join(",")}]`;
      said.untaken = untaken.map((row) => [row.seq as string, row.tbl as string, row.key as string]);
    }
    const holdings = this.changedHoldings();
    if (holdings.length > 0) {
      const scopes = holdings.map((holding) => {
        const scope = holding.scope as string;
        said.holds[scope] = [holding.through as string, holding.fp as string, holding.n as number];
        let text = `${canonicalString(scope)}:{"through":${holding.through},"fp":"${holding.fp}","n":${holding.n}`;
        const requests = this.all("SELECT position, lo, hi FROM range_requests WHERE scope = ? ORDER BY position", [scope]);
        if (requests.length > 0) {
          const answers = requests.map((request) => {
            said.ranges.push(request.position as number);
            const fp = this.rangeFingerprint(scope, request.lo as string, request.hi as string);
            return `["${request.lo}","${request.hi}","${fp.hex()}",${fp.count}]`;
          });
          text += `,"ranges":[${answers.join(",")}]`;
        }
        return text + "}";
      });
      body += `,"holds":{${scopes.join(",")}}`;
    }
    body += "}";
    this.run("UPDATE uploads SET body = ?, said = ? WHERE id = ?", [body, JSON.stringify(said), upload]);
    return body;
  }

  /** The fingerprint of the scope's rows whose key hash is in [lo, hi). */
  rangeFingerprint(scope: string, lo: string, hi: string): Fingerprint {
    const fp = new Fingerprint();
    for (const row of this.all("SELECT kh, h FROM rows WHERE scope = ? AND kh >= ? AND (? = '' OR kh < ?)", [scope, lo, hi, hi]))
      fp.add(element(row.kh as string, row.h as string));
    return fp;
  }

  /** The up route took upload `id`: what it said is what the server heard (§7). */
  markSent(id: string): void {
    this.transaction(() => {
      const upload = this.one("SELECT rows, said FROM uploads WHERE id = ?", [id]);
      if (upload === undefined) {
        this.notice(`upload ${id} confirmed sent, but it is not one waiting to be sent`);
        return;
      }
      const said: Said | null = upload.said ? JSON.parse(upload.said as string) : null;
      if (said !== null && said.position === this.position()) {
        // Unless a message was applied since it was built (a scope it reported may have gone).
        for (const [scope, [through, fp, n]] of Object.entries(said.holds))
          this.run("INSERT OR REPLACE INTO advertised (scope, through, fp, n) VALUES (?, ?, ?, ?)", [scope, through, fp, n]);
      }
      if (said !== null && said.applied !== null && said.position.split("/")[0] === this.position().split("/")[0])
        this.run("UPDATE state SET applied_sent = ?", [said.applied]);
      for (const [seq, tbl, key] of said?.untaken ?? [])
        this.run("DELETE FROM untaken WHERE seq = ? AND tbl = ? AND key = ?", [seq, tbl, key]);
      for (const position of said?.ranges ?? []) this.run("DELETE FROM range_requests WHERE position = ?", [position]);
      // An upload without rows is not answered; one with rows waits for its filed answer.
      if ((upload.rows as number) === 0) this.run("DELETE FROM uploads WHERE id = ?", [id]);
      else this.run("UPDATE uploads SET sent = 1 WHERE id = ?", [id]);
    });
  }

  // ---- what it holds ------------------------------------------------------------------------

  heldRows(): HeldRow[] {
    return this.all("SELECT tbl, key, body, h, scope FROM rows ORDER BY tbl, key").map((row) => ({
      t: row.tbl as string,
      k: row.key as string,
      r: row.body as string,
      h: row.h as string,
      scope: row.scope as string,
    }));
  }

  /** Per scope: through and the running fingerprint. */
  holdings(): Map<string, Holding> {
    const holdings = new Map<string, Holding>();
    for (const row of this.all("SELECT scope, through, fp, n FROM scopes ORDER BY scope"))
      holdings.set(row.scope as string, { through: row.through as string, fp: Fingerprint.fromHex(row.fp as string, row.n as number) });
    return holdings;
  }

  state(): { gen: string; seq: string; origin: string | null } {
    const state = this.one("SELECT gen, seq, origin FROM state")!;
    return { gen: state.gen as string, seq: state.seq as string, origin: state.origin as string | null };
  }

  /**
   * What it holds as one JSON text: "held" (per table, the server's rows as stored), "local_writes",
   * "kept", "holds" (per scope), "position" and "notices".
   */
  showJson(): string {
    const held = new Map<string, string[]>();
    for (const row of this.heldRows()) {
      const rows = held.get(row.t) ?? [];
      rows.push(`{"k":${row.k},"r":${row.r},"h":"${row.h}","scope":${canonicalString(row.scope)}}`);
      held.set(row.t, rows);
    }
    const heldText = [...held].map(([table, rows]) => `${canonicalString(table)}:[${rows.join(",")}]`).join(",");
    const writes = this.all("SELECT id, tbl, key, body, upload FROM local_writes ORDER BY id").map(
      (w) =>
        `{"id":${w.id},"t":${canonicalString(w.tbl as string)},"k":${w.key},"r":${w.body},"upload":${
          w.upload === null ? "null" : canonicalString(w.upload as string)
        }}`,
    );
    const kept = this.all("SELECT tbl, key, kh, body, why, upload FROM kept ORDER BY id").map(
      (k) =>
        `{"t":${canonicalString(k.tbl as string)},"k":${k.key ?? "null"},"kh":"${k.kh}","r":${k.body ?? "null"},"why":${canonicalString(
          k.why as string,
        )},"upload":${canonicalString(k.upload as string)}}`,
    );
    const holds = [...this.holdings()].map(
      ([scope, h]) => `${canonicalString(scope)}:{"through":${h.through},"fp":"${h.fp.hex()}","n":${h.fp.count}}`,
    );
    const state = this.state();
    const notices = this.all("SELECT text FROM notices ORDER BY id").map((n) => canonicalString(n.text as string));
    return (
      `{"held":{${heldText}},"local_writes":[${writes.join(",")}],"kept":[${kept.join(",")}],` +
      `"holds":{${holds.join(",")}},"position":{"gen":${state.gen},"seq":${state.seq},"origin":${
        state.origin === null ? "null" : canonicalString(state.origin)
      }},"notices":[${notices.join(",")}]}`
    );
  }
}

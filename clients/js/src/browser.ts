// The replica in a browser: its sql.js database kept in IndexedDB (saved whole after every change,
// before a message is acknowledged), so that it survives a reload; the pull transport over fetch.
// Load sql.js's sql-wasm.js first (it defines initSqlJs), then import this module.
import type { Database, SqlJsStatic } from "sql.js";

import { PullClient } from "./pull.js";
import { Replica } from "./replica.js";

declare const initSqlJs: (config?: { locateFile?: (file: string) => string }) => Promise<SqlJsStatic>;

const kStore = "databases";

function openIndexedDb(name: string): Promise<IDBDatabase> {
  return new Promise((resolve, reject) => {
    const request = indexedDB.open(name, 1);
    request.onupgradeneeded = () => request.result.createObjectStore(kStore);
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
}

function idbRequest<T>(request: IDBRequest<T>): Promise<T> {
  return new Promise((resolve, reject) => {
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
}

export interface BrowserReplicaOptions {
  /** The replica's id (its row in the server's replicas relation). */
  id: string;
  /** Where sql.js finds sql-wasm.wasm: its directory's URL. */
  sqlJsDirectory: string;
  /** The IndexedDB database the replica is kept in (default magic-sync). */
  storage?: string;
}

export class BrowserReplica {
  private client: PullClient | null = null;
  private stopping: AbortController | null = null;
  private running: Promise<void> | null = null;
  private saving: Promise<void> = Promise.resolve();

  private constructor(
    readonly replica: Replica,
    private readonly db: Database,
    private readonly idb: IDBDatabase,
    private readonly key: string,
  ) {}

  /** Opens the replica kept in IndexedDB (a new one when there is none). */
  static async open(options: BrowserReplicaOptions): Promise<BrowserReplica> {
    const SQL = await initSqlJs({ locateFile: (file) => `${options.sqlJsDirectory.replace(/\/$/, "")}/${file}` });
    const idb = await openIndexedDb(options.storage ?? "magic-sync");
    const saved = await idbRequest(idb.transaction(kStore).objectStore(kStore).get(options.id));
    const db = saved instanceof Uint8Array ? new SQL.Database(saved) : new SQL.Database();
    const replica = new BrowserReplica(new Replica(db, options.id), db, idb, options.id);
    await replica.save();
    return replica;
  }

  /** Writes the database to IndexedDB when it changed; resolves once it is stored. */
  save(): Promise<void> {
    // In order: a later save carries every change an earlier one did.
    this.saving = this.saving.then(async () => {
      if (!this.replica.takeChanged()) return;
      const bytes = this.db.export();
      const transaction = this.idb.transaction(kStore, "readwrite");
      transaction.objectStore(kStore).put(bytes, this.key);
      await new Promise<void>((resolve, reject) => {
        transaction.oncomplete = () => resolve();
        transaction.onerror = () => reject(transaction.error);
        transaction.onabort = () => reject(transaction.error);
      });
    });
    return this.saving;
  }

  /**
   * Starts pulling from the gateway at `url` with `token`, uploading through its up route (gzip
   * with `gzipUploads`).
   */
  start(url: string, token: string, log?: (line: string) => void, uploadEvery = 1000, gzipUploads = false): void {
    if (this.running) return;
    this.client = new PullClient(this.replica, { url, token, save: () => this.save(), log, gzipUploads });
    this.stopping = new AbortController();
    this.running = this.client.run(this.stopping.signal, uploadEvery);
  }

  async stop(): Promise<void> {
    this.stopping?.abort();
    await this.running;
    this.running = null;
  }

  /** A local write, saved; it goes up with the next upload. */
  async write(table: string, row: string, keyColumns: string[] = []): Promise<void> {
    this.replica.write(table, row, keyColumns);
    await this.save();
    if (this.client) void this.client.upload();
  }
}

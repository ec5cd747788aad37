// The replica under Node: its sql.js database kept in a file, written whole (to a temporary file,
// synced, then renamed over the old one) after every change, so a crash leaves the old or the new.
import { closeSync, existsSync, fsyncSync, openSync, readFileSync, renameSync, writeSync } from "node:fs";

import initSqlJs from "sql.js";

import { Replica } from "./replica.js";

export class FileReplica {
  private constructor(
    readonly replica: Replica,
    private readonly path: string,
    private readonly db: import("sql.js").Database,
  ) {}

  /** Opens the replica `id` kept in `path` (made when missing). */
  static async open(path: string, id: string): Promise<FileReplica> {
    const SQL = await initSqlJs();
    const db = existsSync(path) ? new SQL.Database(readFileSync(path)) : new SQL.Database();
    const file = new FileReplica(new Replica(db, id), path, db);
    file.save();
    return file;
  }

  /** Writes the database to its file when it changed; throws when it could not. */
  save(): void {
    if (!this.replica.takeChanged()) return;
    const bytes = this.db.export();
    const temporary = `${this.path}.tmp`;
    const fd = openSync(temporary, "w", 0o600);
    try {
      let at = 0;
      while (at < bytes.length) at += writeSync(fd, bytes, at, bytes.length - at);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    renameSync(temporary, this.path);
  }

  close(): void {
    this.db.close();
  }
}

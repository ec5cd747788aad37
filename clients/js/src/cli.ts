#!/usr/bin/env node
// The replica's command line under Node: the conformance interface of docs/PROTOCOL.md §14 (the
// reference replica's), and `pull`, the device's loop against a pull gateway.
import { readFileSync, realpathSync } from "node:fs";
import { pathToFileURL } from "node:url";
import { gunzipSync } from "node:zlib";

import { FileReplica } from "./node.js";
import { PullClient } from "./pull.js";
import { StorageError, taken } from "./replica.js";

const kUsage = `usage: magic-sync-replica-js --id UUID --db FILE OPERATION

A magic_sync device replica (docs/PROTOCOL.md) in TypeScript on sql.js, its database in FILE.
Operations (the conformance interface, docs/PROTOCOL.md §14):
  apply -                          apply the down message on standard input (as it is, or
                                   gzip: a sender's --gzip); exit 0 taken,
                                   65 never applicable (malformed, another replica's),
                                   75 try again (storage failed, or a newer v: after an upgrade)
  show --json                      what it holds: held, local_writes, kept, holds, position
  write TABLE JSON [--key COL,...] queue a local row of a record or both table
  upload                           print the next upload, or nothing when there is none
  upload --sent ID                 the up route took upload ID
  pull --url BASE --token TOKEN [--up-via-pull [--gzip-up]] [--upload-every SECONDS]
                                   ask a pull gateway for messages until stopped (SIGINT,
                                   SIGTERM), uploading through its up route with --up-via-pull
                                   (gzip-compressed with --gzip-up)
Run it as node --liftoff-only dist/cli.js: sql.js's WebAssembly is then compiled once, quickly
(a process per operation spends most of its time there otherwise).
`;

class UsageError extends Error {}

interface Arguments {
  id?: string;
  db?: string;
  positional: string[];
  flags: Map<string, string | true>;
}

// The most a message may inflate to, as the reference replica bounds it (docs/PROTOCOL.md §11).
const kMaxMessageBytes = 16 * 1024 * 1024;

/** A message sent gzip (docs/PROTOCOL.md §10: it begins 1f 8b, where JSON begins with "{"),
 * inflated; other bytes as they are; why not, for gzip that does not inflate within the bound. */
function inflated(bytes: Uint8Array): Uint8Array | string {
  if (bytes.length < 2 || bytes[0] !== 0x1f || bytes[1] !== 0x8b) return bytes;
  try {
    return new Uint8Array(gunzipSync(bytes, { maxOutputLength: kMaxMessageBytes }));
  } catch (error) {
    return `gzip: ${error instanceof Error ? error.message : String(error)}`;
  }
}

const kValueFlags = new Set(["id", "db", "key", "sent", "url", "token", "upload-every"]);

function parse(argv: string[]): Arguments {
  const parsed: Arguments = { positional: [], flags: new Map() };
  for (let i = 0; i < argv.length; ++i) {
    const argument = argv[i];
    if (argument.startsWith("--")) {
      const name = argument.slice(2);
      if (kValueFlags.has(name)) {
        if (i + 1 >= argv.length) throw new UsageError(`${argument} needs a value`);
        parsed.flags.set(name, argv[++i]);
      } else if (name === "json" || name === "up-via-pull" || name === "gzip-up" || name === "help") {
        parsed.flags.set(name, true);
      } else {
        throw new UsageError(`unknown option ${argument}`);
      }
    } else {
      parsed.positional.push(argument);
    }
  }
  parsed.id = parsed.flags.get("id") as string | undefined;
  parsed.db = parsed.flags.get("db") as string | undefined;
  return parsed;
}

/** Where an operation reads its input and writes its output: a process's, or a connection's. */
export interface Io {
  stdin: () => Uint8Array;
  out: (text: string) => void;
  err: (text: string) => void;
}

const kProcessIo: Io = {
  stdin: () => new Uint8Array(readFileSync(0)),
  out: (text) => process.stdout.write(text),
  err: (text) => process.stderr.write(text),
};

/** Runs one operation of the command line; returns its exit status. */
export async function operation(argv: string[], io: Io = kProcessIo): Promise<number> {
  try {
    return await main(argv, io);
  } catch (error) {
    if (error instanceof UsageError) {
      io.err(`magic-sync-replica-js: ${error.message}\n${kUsage}`);
      return 2;
    }
    io.err(`magic-sync-replica-js: ${error instanceof Error ? error.message : error}\n`);
    return 1;
  }
}

async function main(argv: string[], io: Io): Promise<number> {
  if (argv.includes("--help") || argv.includes("-h")) {
    io.out(kUsage);
    return 0;
  }
  const args = parse(argv);
  if (!args.id || !args.db) throw new UsageError("--id UUID and --db FILE are required");
  const [operation, ...rest] = args.positional;
  const file = await FileReplica.open(args.db, args.id);
  const replica = file.replica;
  try {
    switch (operation) {
      case "apply": {
        if (rest[0] !== "-") throw new UsageError("apply reads the message from standard input: apply -");
        const message = inflated(io.stdin());
        if (typeof message === "string") {
          io.err(`message: malformed (${message})\n`);
          return 65;
        }
        let result;
        try {
          result = replica.apply(message);
          file.save();
        } catch (error) {
          if (error instanceof StorageError || error instanceof Error) {
            io.err(`storage failed: ${error.message}\n`);
            return 75;
          }
          throw error;
        }
        const line = `${result.kind ?? "message"}: ${result.outcome}${result.detail ? ` (${result.detail})` : ""}`;
        if (taken(result.outcome)) {
          io.out(line + "\n");
          return 0;
        }
        io.err(line + "\n");
        // A newer protocol version is taken after this replica's upgrade: not now, not never.
        return result.outcome === "unknown version" ? 75 : 65;
      }
      case "show":
        io.out(replica.showJson() + "\n");
        return 0;
      case "write": {
        if (rest.length !== 2) throw new UsageError("write TABLE JSON [--key COL,...]");
        const key = args.flags.get("key");
        const columns = typeof key === "string" ? key.split(",") : [];
        if (columns.some((column) => column === "")) throw new UsageError("--key has an empty column name");
        const written = replica.write(rest[0], rest[1], columns);
        file.save();
        io.out(`queued ${rest[0]} ${written.key} (local write #${written.id})\n`);
        return 0;
      }
      case "upload": {
        const sent = args.flags.get("sent");
        if (typeof sent === "string") {
          replica.markSent(sent);
          file.save();
          return 0;
        }
        const prepared = replica.prepareUpload();
        file.save();
        if (prepared === null) io.err("nothing to upload\n");
        else io.out(prepared.body + "\n");
        return 0;
      }
      case "pull": {
        const url = args.flags.get("url");
        const token = args.flags.get("token");
        if (typeof url !== "string" || typeof token !== "string") throw new UsageError("pull needs --url BASE --token TOKEN");
        const every = Number(args.flags.get("upload-every") ?? "1");
        if (!(every > 0)) throw new UsageError("--upload-every wants a positive number of seconds");
        const client = new PullClient(replica, {
          url,
          token,
          save: () => file.save(),
          log: (line) => io.err(line + "\n"),
          gzipUploads: args.flags.get("gzip-up") === true,
        });
        const stop = new AbortController();
        process.on("SIGINT", () => stop.abort());
        process.on("SIGTERM", () => stop.abort());
        if (args.flags.get("up-via-pull") === true) await client.run(stop.signal, every * 1000);
        else while (!stop.signal.aborted) await client.step(stop.signal);
        return 0;
      }
      default:
        throw new UsageError(operation ? `unknown operation ${operation}` : "no operation");
    }
  } finally {
    file.close();
  }
}

// Run as a program (not imported by the operations server).
if (process.argv[1] && import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href)
  operation(process.argv.slice(2)).then((status) => process.exit(status));

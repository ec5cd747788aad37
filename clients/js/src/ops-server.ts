#!/usr/bin/env node
// The command line's operations served to bin/conformance-replica, for the conformance suite,
// which runs an operation per process: about 120 of them, and a Node process that loads sql.js
// costs some 0.25 s of CPU, against a few ms for each operation itself. This process runs each
// operation exactly as dist/cli.js would (the replica's file read, the operation, the file
// written), one at a time, and ends once nothing asked for 10 s, or at once when its port file
// goes (the suite removes its directory when it ends).
//
//   node dist/ops-server.js --port-file FILE
//
// It listens on a free port of 127.0.0.1, says it in FILE, and greets each connection with
// "magic-sync-replica-js ops\n". A request: the number of arguments and a newline, each argument
// and a NUL, the standard input's length in bytes and a newline, the standard input. The answer:
// the exit status and a newline, the standard error in base64 and a newline, then the standard
// output until the connection closes.
import { existsSync, renameSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";

import { operation } from "./cli.js";

export const kGreeting = "magic-sync-replica-js ops\n";
const kIdle = 10000;

const portFileAt = process.argv.indexOf("--port-file");
if (process.argv.includes("--help") || portFileAt < 0 || !process.argv[portFileAt + 1]) {
  process.stdout.write("usage: node dist/ops-server.js --port-file FILE (see bin/conformance-replica)\n");
  process.exit(process.argv.includes("--help") ? 0 : 2);
}
const portFile = process.argv[portFileAt + 1];

// Parses a whole request from `buffer`; null while it is incomplete.
function request(buffer: Buffer): { argv: string[]; stdin: Uint8Array } | null {
  let at = buffer.indexOf(0x0a);
  if (at < 0) return null;
  const count = Number(buffer.subarray(0, at).toString());
  const argv: string[] = [];
  let from = at + 1;
  for (let i = 0; i < count; ++i) {
    at = buffer.indexOf(0, from);
    if (at < 0) return null;
    argv.push(buffer.subarray(from, at).toString());
    from = at + 1;
  }
  at = buffer.indexOf(0x0a, from);
  if (at < 0) return null;
  const length = Number(buffer.subarray(from, at).toString());
  if (buffer.length < at + 1 + length) return null;
  return { argv, stdin: new Uint8Array(buffer.subarray(at + 1, at + 1 + length)) };
}

let idle: NodeJS.Timeout;
let queue: Promise<void> = Promise.resolve();
const server = createServer((socket) => {
  clearTimeout(idle);
  socket.write(kGreeting);
  let buffer = Buffer.alloc(0);
  socket.on("data", (data) => {
    buffer = Buffer.concat([buffer, data]);
    const asked = request(buffer);
    if (asked === null) return;
    socket.pause();
    if (asked.argv.includes("pull")) {
      socket.end(`2\n${Buffer.from("pull runs as node dist/cli.js\n").toString("base64")}\n`);
      return;
    }
    // One operation at a time, as processes of the suite would run.
    queue = queue.then(async () => {
      let out = "";
      let err = "";
      const status = await operation(asked.argv, {
        stdin: () => asked.stdin,
        out: (text) => void (out += text),
        err: (text) => void (err += text),
      });
      socket.end(`${status}\n${Buffer.from(err).toString("base64")}\n${out}`);
      idle = setTimeout(() => process.exit(0), kIdle);
    });
  });
  socket.on("error", () => socket.destroy());
});
server.listen(0, "127.0.0.1", () => {
  const address = server.address();
  if (address === null || typeof address === "string") process.exit(1);
  writeFileSync(`${portFile}.tmp`, `${address.port}\n`);
  renameSync(`${portFile}.tmp`, portFile);
  idle = setTimeout(() => process.exit(0), kIdle);
  setInterval(() => existsSync(portFile) || process.exit(0), 50);
});

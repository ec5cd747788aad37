#!/usr/bin/env node
// Drives the replica's page (page/index.html) in a real browser, Debian's chromium through
// puppeteer-core, for the browser test (tests/server/browser_test.cpp), which plays the server
// and says what to do: one JSON command a line on standard input, one JSON answer a line on
// standard output. It serves the page, the compiled library and sql.js itself, on a port of its
// own: another origin than the gateway's, as an app's page would be.
//
//   node test/browser.js [--chromium PATH]
//
// First line out: {"origin": "http://127.0.0.1:PORT"}. Then, per command:
//   {"do": "open", "gateway": URL, "token": T, "replica": UUID, "gzipUp": true?}  opens the page
//                         (its uploads gzip with gzipUp), waits for it
//   {"do": "held"}        the page's held rows, "table key h" lines
//   {"do": "show"}        what the replica shows (held, local_writes, kept, holds, position)
//   {"do": "write", "table": T, "row": JSON, "key": [COLUMNS]}   a local write
//   {"do": "reload"}      reloads the page and waits for it
//   {"do": "screenshot", "file": PATH}
//   {"do": "quit"}
// Each answer is {"ok": true, ...} or {"ok": false, "error": ...}.
import { readFile } from "node:fs/promises";
import { createServer } from "node:http";
import { dirname, extname, join, normalize } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

import puppeteer from "puppeteer-core";

if (process.argv.includes("--help")) {
  process.stdout.write(
    "usage: node test/browser.js [--chromium PATH]\n" +
      "Drives clients/js/page in chromium for tests/server/browser_test.cpp: JSON commands on\n" +
      "stdin, JSON answers on stdout (see the comment at the top of this file).\n",
  );
  process.exit(0);
}
const chromiumAt = process.argv.indexOf("--chromium");
const chromium = chromiumAt > 0 ? process.argv[chromiumAt + 1] : "/usr/bin/chromium";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
// What the page may load: itself, the compiled library, sql.js.
const served = ["page/", "dist/", "node_modules/sql.js/dist/"];
const types = { ".html": "text/html", ".js": "text/javascript", ".wasm": "application/wasm" };
const server = createServer(async (request, response) => {
  const path = normalize(decodeURIComponent(new URL(request.url, "http://x").pathname)).replace(/^\/+/, "");
  if (!served.some((prefix) => path.startsWith(prefix))) {
    response.writeHead(404).end();
    return;
  }
  try {
    const body = await readFile(join(root, path));
    response.writeHead(200, { "Content-Type": types[extname(path)] ?? "application/octet-stream" }).end(body);
  } catch {
    response.writeHead(404).end();
  }
});
await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
const origin = `http://127.0.0.1:${server.address().port}`;
const say = (object) => process.stdout.write(JSON.stringify(object) + "\n");
say({ origin });

const browser = await puppeteer.launch({
  executablePath: chromium,
  headless: true,
  // As root (CI) chromium needs --no-sandbox; the page is our own.
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"],
});
const page = await browser.newPage();
await page.setViewport({ width: 1000, height: 900 });
page.on("console", (message) => process.stderr.write(`page: ${message.text()}\n`));
page.on("pageerror", (error) => process.stderr.write(`page error: ${error}\n`));

// The page is ready when window.app resolved (its replica opened from IndexedDB and pulling).
async function ready() {
  await page.waitForFunction(() => window.app !== undefined, { timeout: 30000 });
  await page.evaluate(() => window.app.then(() => true));
}

const commands = {
  async open(command) {
    const url = new URL(`${origin}/page/index.html`);
    url.searchParams.set("gateway", command.gateway);
    url.searchParams.set("token", command.token);
    url.searchParams.set("replica", command.replica);
    if (command.gzipUp) url.searchParams.set("gzip-up", "1");
    await page.goto(url.href, { waitUntil: "load" });
    await ready();
    return {};
  },
  async held() {
    return { lines: await page.evaluate(() => window.app.then((app) => app.held())) };
  },
  async show() {
    return { shown: await page.evaluate(() => window.app.then((app) => app.show())) };
  },
  async write(command) {
    await page.evaluate(
      (table, row, key) => window.app.then((app) => app.write(table, row, key)),
      command.table,
      command.row,
      command.key ?? [],
    );
    return {};
  },
  async reload() {
    await page.reload({ waitUntil: "load" });
    await ready();
    return {};
  },
  async screenshot(command) {
    await page.screenshot({ path: command.file, fullPage: true });
    return {};
  },
};

for await (const line of createInterface({ input: process.stdin })) {
  if (line.trim() === "") continue;
  let command;
  try {
    command = JSON.parse(line);
  } catch (error) {
    say({ ok: false, error: `not JSON: ${error.message}` });
    continue;
  }
  if (command.do === "quit") break;
  try {
    const run = commands[command.do];
    if (!run) throw new Error(`no command ${command.do}`);
    say({ ok: true, ...(await run(command)) });
  } catch (error) {
    say({ ok: false, error: `${error}` });
  }
}
await browser.close();
server.close();
say({ ok: true });
process.exit(0);

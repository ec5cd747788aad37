// The pull transport over fetch (docs/PROTOCOL.md §10, pull): ask the gateway for the head, apply
// it in one transaction with the position, save, then acknowledge; uploads go up the gateway's up
// route. The same code runs in a browser and under Node.
import { Replica, StorageError, taken } from "./replica.js";

export interface PullOptions {
  /** The gateway's base URL, e.g. http://127.0.0.1:8300 */
  url: string;
  /** The device's bearer token. */
  token: string;
  /** Makes what the replica changed durable (a file, IndexedDB); a message is acknowledged after it. */
  save: () => Promise<void> | void;
  /** Called with what happened, for a log or a page. */
  log?: (line: string) => void;
  fetch?: typeof fetch;
  /**
   * Sends each upload gzip-compressed, saying Content-Encoding: gzip (§7): the server reads it by
   * its first bytes. Only for a server that reads it; an older one keeps it whole until updated.
   */
  gzipUploads?: boolean;
}

/** `text` as one gzip member (CompressionStream: a browser's, and Node's since 18). */
export function gzip(text: string): Promise<ArrayBuffer> {
  const stream = new Blob([text]).stream().pipeThrough(new CompressionStream("gzip"));
  return new Response(stream).arrayBuffer();
}

/** What one ask for the head came to. */
export type Step = "none" | "taken" | "refused" | "failed";

export class PullClient {
  private readonly fetch: typeof fetch;
  private readonly base: string;

  constructor(
    private readonly replica: Replica,
    private readonly options: PullOptions,
  ) {
    this.fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
    this.base = `${options.url.replace(/\/+$/, "")}/replicas/${replica.id}`;
  }

  private request(path: string, init: RequestInit = {}): Promise<Response> {
    return this.fetch(`${this.base}/${path}`, {
      ...init,
      headers: { Authorization: `Bearer ${this.options.token}`, ...(init.headers ?? {}) },
    });
  }

  private log(line: string): void {
    this.options.log?.(line);
  }

  /** GET next, apply, save, ack (or refuse). 204: "none". */
  async step(signal?: AbortSignal): Promise<Step> {
    let response: Response;
    try {
      response = await this.request("next", { signal });
    } catch (error) {
      this.log(`next: ${error}`);
      return "failed";
    }
    if (response.status === 204) return "none";
    if (response.status !== 200) {
      this.log(`next: ${response.status} ${(await response.text()).split("\n")[0]}`);
      return "failed";
    }
    const messageId = response.headers.get("message-id") ?? "";
    const bytes = new Uint8Array(await response.arrayBuffer());
    let outcome;
    try {
      const result = this.replica.apply(bytes);
      await this.options.save();
      outcome = result;
    } catch (error) {
      if (!(error instanceof StorageError)) throw error;
      this.log(`${messageId}: storage failed: ${error.message}`);
      return "failed"; // no ack: asked again after a wait
    }
    this.log(`${messageId}: ${outcome.kind ?? "message"} ${outcome.outcome}${outcome.detail ? ` (${outcome.detail})` : ""}`);
    if (taken(outcome.outcome)) {
      try {
        await this.request(`ack/${messageId}`, { method: "POST" });
      } catch (error) {
        this.log(`ack ${messageId}: ${error}`); // served again and recognised as applied
      }
      return "taken";
    }
    try {
      await this.request(`refused/${messageId}`, {
        method: "POST",
        body: `${outcome.outcome}: ${outcome.detail ?? ""}`.replace(/[^\x20-\x7e]/g, "?"),
      });
    } catch (error) {
      this.log(`refused ${messageId}: ${error}`);
    }
    return "refused";
  }

  private uploading: Promise<boolean> = Promise.resolve(true);

  /** Sends every upload there is now through the up route; false when one was not taken. */
  upload(): Promise<boolean> {
    // One at a time: the loop's timer and a message applied may both ask.
    this.uploading = this.uploading.then(() => this.uploadNow());
    return this.uploading;
  }

  private async uploadNow(): Promise<boolean> {
    for (;;) {
      const prepared = this.replica.prepareUpload();
      await this.options.save();
      if (prepared === null) return true;
      let response: Response;
      let answer: string;
      try {
        response = await this.request(
          "up",
          this.options.gzipUploads
            ? {
                method: "POST",
                headers: { "Content-Type": "application/json", "Content-Encoding": "gzip" },
                body: await gzip(prepared.body),
              }
            : { method: "POST", headers: { "Content-Type": "application/json" }, body: prepared.body },
        );
        answer = (await response.text()).trim();
      } catch (error) {
        this.log(`up ${prepared.id}: ${error}`);
        return false;
      }
      // filed, answered again and kept: the route took it; dropped, refused (507), an error: later.
      if (response.status !== 200 || answer === "dropped") {
        this.log(`up ${prepared.id}: ${response.status} ${answer.split("\n")[0]}`);
        return false;
      }
      this.replica.markSent(prepared.id);
      await this.options.save();
      this.log(`up ${prepared.id}${this.options.gzipUploads ? " (gzip)" : ""}: ${answer}`);
    }
  }

  /**
   * The device's loop (§10): ask, apply, acknowledge; upload after each message applied and every
   * `uploadEvery` ms; back off from 0.5 s to 30 s on failures. Ends when `signal` aborts.
   */
  async run(signal: AbortSignal, uploadEvery = 1000): Promise<void> {
    let backoff = 500;
    let lastUpload = 0;
    const sleep = (ms: number) =>
      new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, ms);
        signal.addEventListener("abort", () => (clearTimeout(timer), resolve()), { once: true });
      });
    const uploader = (async () => {
      while (!signal.aborted) {
        if (Date.now() - lastUpload >= uploadEvery) {
          lastUpload = Date.now();
          await this.upload();
        }
        await sleep(uploadEvery);
      }
    })();
    while (!signal.aborted) {
      const step = await this.step(signal);
      if (signal.aborted) break;
      if (step === "taken") {
        backoff = 500;
        lastUpload = Date.now();
        await this.upload();
      } else if (step === "failed" || step === "refused") {
        await sleep(backoff);
        backoff = Math.min(backoff * 2, 30000);
      }
    }
    await uploader;
  }
}

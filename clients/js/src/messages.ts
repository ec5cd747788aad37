// Down messages as docs/PROTOCOL.md §4 and §5 write them, read and checked: a message that does
// not decode here is malformed and nothing of it is applied.
import { JsonError, JsonNumber, JsonObject, JsonValue, canonical, isObject, parseJsonBytes } from "./json.js";
import { isDigestHex } from "./sha256.js";

/** The newest protocol version this replica speaks (§4). */
export const kProtocolVersion = 2;

/** Can never be applied: not JSON, not an object, a missing or mistyped member. */
export class Malformed extends Error {}
/** Written for a protocol version above kProtocolVersion: refused, to be delivered again. */
export class VersionTooNew extends Error {}

export interface Header {
  v: number;
  kind: "rows" | "filed" | "ranges" | "repair";
  replica: string;
  gen: bigint;
  seq: bigint;
  origin: string | null;
}

/** A row of a rows or repair message; `r` and `h` are null for a tombstone. */
export interface Row {
  t: string;
  k: string; // canonical JSON of the key
  r: string | null; // canonical JSON of the row
  h: string | null;
}

export interface Chunk {
  scope: string;
  from: bigint;
  to: bigint;
  rows: Row[];
}

/** A row named by a withheld or kept note: by its key, or (version 2) by its key hash. */
export interface KeyNote {
  t: string;
  k: string | null;
  kh: string | null;
  why: string;
}

export interface RowsMessage extends Header {
  kind: "rows";
  reset: string[];
  drop: string[];
  dropTables: string[];
  chunks: Chunk[];
  withheld: KeyNote[];
}
export interface FiledMessage extends Header {
  kind: "filed";
  upload: string;
  kept: KeyNote[];
  more: boolean;
}
export interface RangesMessage extends Header {
  kind: "ranges";
  scope: string;
  ranges: [string, string][];
}
export interface RepairMessage extends Header {
  kind: "repair";
  scope: string;
  lo: string;
  hi: string;
  rows: Row[];
}
export type DownMessage = RowsMessage | FiledMessage | RangesMessage | RepairMessage;

const kUuid = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
const kTwoTo63 = 1n << 63n;

export function isUuid(text: unknown): text is string {
  return typeof text === "string" && kUuid.test(text);
}

function fail(what: string): never {
  throw new Malformed(what);
}

function member(object: JsonObject, name: string, where: string): JsonValue {
  const value = object.get(name);
  if (value === undefined) fail(`${where} has no "${name}"`);
  return value;
}

function str(value: JsonValue | undefined, what: string): string {
  if (typeof value !== "string") fail(`${what} is not a string`);
  return value;
}

/** An integer written as one (no fraction, no exponent) in [0, 2^63). */
function counter(value: JsonValue | undefined, what: string): bigint {
  if (!(value instanceof JsonNumber) || !/^(0|[1-9]\d*)$/.test(value.text))
    fail(`${what} is not an integer in [0, 2^63)`);
  const number = BigInt(value.text);
  if (number >= kTwoTo63) fail(`${what} is not an integer in [0, 2^63)`);
  return number;
}

function array(value: JsonValue | undefined, what: string): JsonValue[] {
  if (!Array.isArray(value)) fail(`${what} is not an array`);
  return value;
}

function object(value: JsonValue | undefined, what: string): JsonObject {
  if (!isObject(value)) fail(`${what} is not an object`);
  return value;
}

function strings(object: JsonObject, name: string): string[] {
  const value = object.get(name);
  if (value === undefined) return [];
  return array(value, `"${name}"`).map((item) => str(item, `an item of "${name}"`));
}

function row(value: JsonValue, what: string): Row {
  const o = object(value, what);
  const t = str(member(o, "t", what), `${what}'s "t"`);
  const k = object(member(o, "k", what), `${what}'s "k"`);
  const r = member(o, "r", what);
  if (r === null) return { t, k: canonical(k), r: null, h: null };
  const body = object(r, `${what}'s "r"`);
  const h = member(o, "h", what);
  if (!isDigestHex(h)) fail(`${what}'s "h" is not 64 lowercase hex digits`);
  return { t, k: canonical(k), r: canonical(body), h };
}

function note(value: JsonValue, what: string): KeyNote {
  const o = object(value, what);
  const t = str(member(o, "t", what), `${what}'s "t"`);
  const why = str(member(o, "why", what), `${what}'s "why"`);
  const k = o.get("k");
  const kh = o.get("kh");
  if (k !== undefined && kh !== undefined) fail(`${what} names its key twice ("k" and "kh")`);
  if (kh !== undefined) {
    if (!isDigestHex(kh)) fail(`${what}'s "kh" is not 64 lowercase hex digits`);
    return { t, k: null, kh, why };
  }
  return { t, k: canonical(object(k, `${what}'s "k"`)), kh: null, why };
}

function range(lo: JsonValue | undefined, hi: JsonValue | undefined, what: string): [string, string] {
  if (!isDigestHex(lo)) fail(`${what}: lo is not 64 lowercase hex digits`);
  if (hi !== "" && !isDigestHex(hi)) fail(`${what}: hi is not 64 lowercase hex digits or ""`);
  if (hi !== "" && hi <= lo) fail(`${what}: hi is not above lo`);
  return [lo, hi];
}

/** Decodes a down message; throws Malformed or VersionTooNew. */
export function decodeDown(bytes: Uint8Array): DownMessage {
  let json: JsonValue;
  try {
    json = parseJsonBytes(bytes);
  } catch (error) {
    if (error instanceof JsonError) fail(`not JSON: ${error.message}`);
    throw error;
  }
  const o = object(json, "the message");
  // v first: a later version may change every other member.
  const v = o.get("v");
  if (!(v instanceof JsonNumber) || !/^[1-9]\d*$/.test(v.text)) fail(`"v" is not an integer ≥ 1`);
  if (BigInt(v.text) > BigInt(kProtocolVersion))
    throw new VersionTooNew(`protocol version ${v.text}; this replica speaks up to ${kProtocolVersion}`);
  const kind = str(member(o, "kind", "the message"), `"kind"`);
  const replica = member(o, "replica", "the message");
  if (!isUuid(replica)) fail(`"replica" is not a lowercase UUID`);
  const originValue = o.get("origin");
  let origin: string | null = null;
  if (originValue !== undefined) {
    origin = str(originValue, `"origin"`);
    const bytes = new TextEncoder().encode(origin).length;
    if (bytes < 1 || bytes > 68) fail(`"origin" is not 1 to 68 bytes`);
  }
  const header = {
    v: Number(v.text),
    replica,
    gen: counter(member(o, "gen", "the message"), `"gen"`),
    seq: counter(member(o, "seq", "the message"), `"seq"`),
    origin,
  };
  switch (kind) {
    case "rows": {
      const chunks = array(member(o, "chunks", "a rows message"), `"chunks"`).map((value, i) => {
        const c = object(value, `chunk ${i}`);
        const from = counter(member(c, "from", `chunk ${i}`), `chunk ${i}'s "from"`);
        const to = counter(member(c, "to", `chunk ${i}`), `chunk ${i}'s "to"`);
        if (from > to) fail(`chunk ${i}: "from" is above "to"`);
        return {
          scope: str(member(c, "scope", `chunk ${i}`), `chunk ${i}'s "scope"`),
          from,
          to,
          rows: array(member(c, "rows", `chunk ${i}`), `chunk ${i}'s "rows"`).map((r, j) =>
            row(r, `row ${j} of chunk ${i}`),
          ),
        };
      });
      const withheld = o.get("withheld");
      return {
        ...header,
        kind,
        reset: strings(o, "reset"),
        drop: strings(o, "drop"),
        dropTables: strings(o, "drop_tables"),
        chunks,
        withheld:
          withheld === undefined ? [] : array(withheld, `"withheld"`).map((n, i) => note(n, `withheld note ${i}`)),
      };
    }
    case "filed": {
      const upload = member(o, "upload", "a filed message");
      if (!isUuid(upload)) fail(`"upload" is not a lowercase UUID`);
      const more = o.get("more");
      if (more !== undefined && typeof more !== "boolean") fail(`"more" is not a boolean`);
      return {
        ...header,
        kind,
        upload,
        kept: array(member(o, "kept", "a filed message"), `"kept"`).map((n, i) => note(n, `kept note ${i}`)),
        more: more === true,
      };
    }
    case "ranges":
      return {
        ...header,
        kind,
        scope: str(member(o, "scope", "a ranges message"), `"scope"`),
        ranges: array(member(o, "ranges", "a ranges message"), `"ranges"`).map((value, i) => {
          const pair = array(value, `range ${i}`);
          if (pair.length !== 2) fail(`range ${i} is not [lo, hi]`);
          return range(pair[0], pair[1], `range ${i}`);
        }),
      };
    case "repair": {
      const [lo, hi] = range(o.get("lo"), o.get("hi"), "the repair's range");
      return {
        ...header,
        kind,
        scope: str(member(o, "scope", "a repair message"), `"scope"`),
        lo,
        hi,
        rows: array(member(o, "rows", "a repair message"), `"rows"`).map((r, j) => row(r, `row ${j}`)),
      };
    }
    default:
      return fail(`unknown kind ${JSON.stringify(kind)}`);
  }
}

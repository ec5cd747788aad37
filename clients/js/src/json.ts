// JSON as the protocol reads and writes it (docs/PROTOCOL.md §2): a parser that keeps each
// number's text and each object's members in order and refuses duplicate keys, and the canonical
// form every key and row travels in (byte-wise sorted keys, numbers as written, minimal escapes).

/** A JSON number, kept as the text it was written with. */
export class JsonNumber {
  constructor(readonly text: string) {}
}

export type JsonValue = null | boolean | string | JsonNumber | JsonValue[] | JsonObject;
/** A JSON object: its members in the order they came (keys are unique). */
export type JsonObject = Map<string, JsonValue>;

export class JsonError extends Error {}

/** Nesting a message may have (§11); a row within it may nest 5 levels less. */
export const kMaxDepth = 64;

const kDecoder = new TextDecoder("utf-8", { fatal: true });
const kEncoder = new TextEncoder();

export function utf8(text: string): Uint8Array {
  return kEncoder.encode(text);
}

/** Bytes to text; invalid UTF-8 is refused. A leading byte order mark is skipped. */
export function decodeUtf8(bytes: Uint8Array): string {
  try {
    return kDecoder.decode(bytes);
  } catch {
    throw new JsonError("invalid UTF-8");
  }
}

// The largest value an 80-bit long double holds, 1.18973149535723176502e4932: a number past it is
// refused (§2), one within it kept as written.
const kLongDoubleMaxDigits = "118973149535723176502";
const kLongDoubleMaxExponent = 4932;

function pastLongDouble(text: string): boolean {
  const match = /^-?(\d+)(?:\.(\d+))?(?:[eE]([+-]?\d+))?$/.exec(text);
  if (!match) return false;
  const digits = (match[1] + (match[2] ?? "")).replace(/^0+/, "");
  if (digits === "") return false; // zero
  const leadingZeros = (match[1] + (match[2] ?? "")).length - digits.length;
  // The value is 0.DIGITS × 10^(exponent + integer digits - leading zeros).
  const exponent = BigInt(match[3] ?? "0") + BigInt(match[1].length - leadingZeros) - 1n;
  if (exponent > BigInt(kLongDoubleMaxExponent)) return true;
  if (exponent < BigInt(kLongDoubleMaxExponent)) return false;
  const significant = digits.replace(/0+$/, "");
  return significant > kLongDoubleMaxDigits;
}

class Parser {
  private at = 0;
  constructor(private readonly text: string) {}

  parse(): JsonValue {
    this.space();
    const value = this.value(1);
    this.space();
    if (this.at !== this.text.length) this.fail("text after the value");
    return value;
  }

  private fail(what: string): never {
    throw new JsonError(`${what} at ${this.at}`);
  }

  private space(): void {
    const text = this.text;
    while (this.at < text.length) {
      const c = text.charCodeAt(this.at);
      if (c !== 0x20 && c !== 0x09 && c !== 0x0a && c !== 0x0d) break;
      ++this.at;
    }
  }

  private value(depth: number): JsonValue {
    if (depth > kMaxDepth) this.fail(`nested deeper than ${kMaxDepth} levels`);
    const c = this.text[this.at];
    if (c === "{") return this.object(depth);
    if (c === "[") return this.array(depth);
    if (c === '"') return this.string();
    if (c === "-" || (c !== undefined && c >= "0" && c <= "9")) return this.number();
    for (const [word, value] of [
      ["true", true],
      ["false", false],
      ["null", null],
    ] as const) {
      if (this.text.startsWith(word, this.at)) {
        this.at += word.length;
        return value;
      }
    }
    return this.fail(c === undefined ? "unexpected end" : "unexpected character");
  }

  private object(depth: number): JsonObject {
    ++this.at;
    const object: JsonObject = new Map();
    this.space();
    if (this.text[this.at] === "}") {
      ++this.at;
      return object;
    }
    for (;;) {
      this.space();
      if (this.text[this.at] !== '"') this.fail("expected a key");
      const key = this.string();
      if (object.has(key)) this.fail(`duplicate key ${JSON.stringify(key)}`);
      this.space();
      if (this.text[this.at] !== ":") this.fail("expected ':'");
      ++this.at;
      this.space();
      object.set(key, this.value(depth + 1));
      this.space();
      const c = this.text[this.at++];
      if (c === "}") return object;
      if (c !== ",") this.fail("expected ',' or '}'");
    }
  }

  private array(depth: number): JsonValue[] {
    ++this.at;
    const array: JsonValue[] = [];
    this.space();
    if (this.text[this.at] === "]") {
      ++this.at;
      return array;
    }
    for (;;) {
      this.space();
      array.push(this.value(depth + 1));
      this.space();
      const c = this.text[this.at++];
      if (c === "]") return array;
      if (c !== ",") this.fail("expected ',' or ']'");
    }
  }

  private string(): string {
    const text = this.text;
    ++this.at;
    let out = "";
    let run = this.at;
    for (;;) {
      if (this.at >= text.length) this.fail("unterminated string");
      const c = text.charCodeAt(this.at);
      if (c === 0x22) {
        out += text.slice(run, this.at);
        ++this.at;
        return out;
      }
      if (c < 0x20) this.fail("a control character in a string");
      if (c !== 0x5c) {
        ++this.at;
        continue;
      }
      out += text.slice(run, this.at);
      const e = text[this.at + 1];
      this.at += 2;
      switch (e) {
        case '"':
          out += '"';
          break;
        case "\\":
          out += "\\";
          break;
        case "/":
          out += "/";
          break;
        case "b":
          out += "\b";
          break;
        case "f":
          out += "\f";
          break;
        case "n":
          out += "\n";
          break;
        case "r":
          out += "\r";
          break;
        case "t":
          out += "\t";
          break;
        case "u": {
          let unit = this.hex4();
          if (unit >= 0xdc00 && unit <= 0xdfff) this.fail("a lone surrogate");
          if (unit >= 0xd800 && unit <= 0xdbff) {
            if (text[this.at] !== "\\" || text[this.at + 1] !== "u") this.fail("a lone surrogate");
            this.at += 2;
            const low = this.hex4();
            if (low < 0xdc00 || low > 0xdfff) this.fail("a lone surrogate");
            out += String.fromCharCode(unit, low);
            unit = -1;
          }
          if (unit >= 0) out += String.fromCharCode(unit);
          break;
        }
        default:
          this.fail("a bad escape");
      }
      run = this.at;
    }
  }

  private hex4(): number {
    const digits = this.text.slice(this.at, this.at + 4);
    if (!/^[0-9a-fA-F]{4}$/.test(digits)) this.fail("a bad \\u escape");
    this.at += 4;
    return parseInt(digits, 16);
  }

  private number(): JsonNumber {
    const match = /-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?/y;
    match.lastIndex = this.at;
    const found = match.exec(this.text);
    if (!found) this.fail("a bad number");
    this.at += found[0].length;
    let text = found[0];
    if (text === "-0") text = "0"; // the one integer whose shortest form differs (§2)
    if (pastLongDouble(text)) this.fail(`a number past any long double: ${text}`);
    return new JsonNumber(text);
  }
}

/** Parses one JSON value (RFC 8259) as §2 reads it; throws JsonError. */
export function parseJson(text: string): JsonValue {
  if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
  if (text.includes("\u0000")) throw new JsonError("a NUL byte");
  return new Parser(text).parse();
}

/** Parses UTF-8 bytes; invalid UTF-8 is refused. */
export function parseJsonBytes(bytes: Uint8Array): JsonValue {
  return parseJson(decodeUtf8(bytes));
}

/** Compares two strings as their UTF-8 bytes compare (code point order). */
export function compareUtf8(a: string, b: string): number {
  const length = Math.min(a.length, b.length);
  for (let i = 0; i < length; ++i) {
    const x = a.charCodeAt(i);
    const y = b.charCodeAt(i);
    if (x === y) continue;
    // UTF-16 order differs from code point order only between a surrogate (a character past
    // U+FFFF) and a unit at or above U+E000.
    const xs = x >= 0xd800 && x <= 0xdfff;
    const ys = y >= 0xd800 && y <= 0xdfff;
    if (xs && !ys && y >= 0xe000) return 1;
    if (ys && !xs && x >= 0xe000) return -1;
    return x < y ? -1 : 1;
  }
  return a.length - b.length;
}

/** A string in canonical form: only `"`, `\` and the controls are escaped. */
export function canonicalString(text: string): string {
  let out = '"';
  let run = 0;
  for (let i = 0; i < text.length; ++i) {
    const c = text.charCodeAt(i);
    if (c >= 0x20 && c !== 0x22 && c !== 0x5c) continue;
    out += text.slice(run, i);
    run = i + 1;
    switch (c) {
      case 0x22:
        out += '\\"';
        break;
      case 0x5c:
        out += "\\\\";
        break;
      case 0x08:
        out += "\\b";
        break;
      case 0x09:
        out += "\\t";
        break;
      case 0x0a:
        out += "\\n";
        break;
      case 0x0c:
        out += "\\f";
        break;
      case 0x0d:
        out += "\\r";
        break;
      default:
        out += "\\u00" + c.toString(16).padStart(2, "0");
    }
  }
  return out + text.slice(run) + '"';
}

/** The canonical form of a value (§2). */
export function canonical(value: JsonValue): string {
  if (value === null) return "null";
  if (value === true) return "true";
  if (value === false) return "false";
  if (typeof value === "string") return canonicalString(value);
  if (value instanceof JsonNumber) return value.text;
  if (Array.isArray(value)) return "[" + value.map(canonical).join(",") + "]";
  const keys = [...value.keys()].sort(compareUtf8);
  return "{" + keys.map((key) => canonicalString(key) + ":" + canonical(value.get(key)!)).join(",") + "}";
}

/** The canonical form of a JSON text; throws JsonError. */
export function canonicalize(text: string): string {
  return canonical(parseJson(text));
}

export function isObject(value: JsonValue | undefined): value is JsonObject {
  return value instanceof Map;
}

// Identities, versions and fingerprints (docs/PROTOCOL.md §3).
import { utf8 } from "./json.js";
import { fromHex, sha256, toHex } from "./sha256.js";

const kModulus = 1n << 256n;

/** k = SHA-256(table ‖ 0x00 ‖ canonical key), as 64 hex digits. */
export function keyHash(table: string, canonicalKey: string): string {
  const t = utf8(table);
  const k = utf8(canonicalKey);
  const bytes = new Uint8Array(t.length + 1 + k.length);
  bytes.set(t);
  bytes.set(k, t.length + 1);
  return toHex(sha256(bytes));
}

/** v = SHA-256 of the row's canonical bytes, as 64 hex digits. */
export function rowVersion(canonicalRow: string): string {
  return toHex(sha256(utf8(canonicalRow)));
}

/** The element of a row: SHA-256(k ‖ v), as a 256-bit integer. */
export function element(keyHashHex: string, versionHex: string): bigint {
  const bytes = new Uint8Array(64);
  bytes.set(fromHex(keyHashHex));
  bytes.set(fromHex(versionHex), 32);
  return BigInt("0x" + toHex(sha256(bytes)));
}

/** (Σ elements mod 2^256, count): independent of order. */
export class Fingerprint {
  constructor(
    public sum = 0n,
    public count = 0,
  ) {}

  static fromHex(hex: string, count: number): Fingerprint {
    return new Fingerprint(BigInt("0x" + hex), count);
  }

  add(e: bigint): void {
    this.sum = (this.sum + e) % kModulus;
    this.count += 1;
  }

  remove(e: bigint): void {
    this.sum = (this.sum - e + kModulus) % kModulus;
    this.count -= 1;
  }

  /** The sum as it travels: 64 lowercase hex digits. */
  hex(): string {
    return this.sum.toString(16).padStart(64, "0");
  }
}

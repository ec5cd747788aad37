// @magic-sync/replica: a magic_sync device replica (docs/PROTOCOL.md) on sql.js.
export { Replica, StorageError, taken } from "./replica.js";
export type { ApplyResult, HeldRow, Holding, Outcome, PreparedUpload } from "./replica.js";
export { PullClient } from "./pull.js";
export type { PullOptions, Step } from "./pull.js";
export { Fingerprint, element, keyHash, rowVersion } from "./fingerprint.js";
export { JsonNumber, canonical, canonicalize, parseJson } from "./json.js";
export { sha256, toHex } from "./sha256.js";
export { kProtocolVersion } from "./messages.js";

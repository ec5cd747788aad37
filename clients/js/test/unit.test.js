// Unit tests of the library's protocol parts against docs/PROTOCOL.md's own examples and test
// vectors (§2, §3): node --test test/unit.test.js, on the compiled dist/.
import assert from "node:assert/strict";
import { test } from "node:test";

import { Fingerprint, canonicalize, element, keyHash, rowVersion, sha256, toHex } from "../dist/index.js";

test("SHA-256 of the empty input and of 'abc'", () => {
  assert.equal(toHex(sha256(new Uint8Array())), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  assert.equal(toHex(sha256(new TextEncoder().encode("abc"))), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // 56 bytes: the length no longer fits the first block.
  const long = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  assert.equal(toHex(sha256(new TextEncoder().encode(long))), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
});

test("§3 test vectors: k, v, element and fingerprint", () => {
  const k7 = keyHash("shop.products", '{"id":7}');
  assert.equal(k7, "4a6535ac79f86625cbbcb53568e1c95baf45bc994bd9fe9f0baf442494c634db");
  const v7 = rowVersion('{"id":7,"name":"tea"}');
  assert.equal(v7, "e004ba5bf791939d8650ab3b9d28af5d8bf9cfc279bf5870d448ff35b445276c");
  const e7 = element(k7, v7);
  assert.equal(e7.toString(16).padStart(64, "0"), "51c35b3f054b537c8fdc13264a346535f6404d9a6b5d7f8d5203d99e4a618dd7");
  const fp = new Fingerprint();
  fp.add(e7);
  fp.add(element(keyHash("shop.products", '{"id":8}'), rowVersion('{"id":8,"name":"jam"}')));
  assert.equal(fp.hex(), "3ed701e068b9384fd4c6e38afe17c74dd59139a2ba1ae9bdcb45daf9e99cc3ab");
  assert.equal(fp.count, 2);
  fp.remove(e7);
  fp.remove(element(keyHash("shop.products", '{"id":8}'), rowVersion('{"id":8,"name":"jam"}')));
  assert.equal(fp.hex(), "0".repeat(64));
  assert.equal(fp.count, 0);
});

test("§2 canonical JSON: the example", () => {
  assert.equal(
    canonicalize('{ "b" : [1, 2.50, -0, -0.0, 1E+3, "\\u00e9\\/\\t"], "a": {"z": null, "y": true}, "é": 1 }'),
    '{"a":{"y":true,"z":null},"b":[1,2.50,0,-0.0,1E+3,"é/\\t"],"é":1}',
  );
});

test("§2 canonical JSON: keys by UTF-8 bytes, escapes, numbers as written", () => {
  assert.equal(canonicalize('{"a":1,"B":2,"":3,"é":4,"z":5}'), '{"":3,"B":2,"a":1,"z":5,"é":4}');
  // U+FF5E sorts before U+1F600 in UTF-8 although its UTF-16 unit is above the surrogates.
  assert.equal(canonicalize('{"\\ud83d\\ude00":1,"～":2}'), '{"～":2,"😀":1}');
  assert.equal(canonicalize('"\\u0001\\u001f\\b\\f\\n\\r\\t\\"\\\\/\\u007f"'), '"\\u0001\\u001f\\b\\f\\n\\r\\t\\"\\\\/\u007f"');
  for (const n of ["12.50", "1E+3", "-0.0", "1e-7", "123456789012345678901234567890.123", "1e400", "18446744073709551615"])
    assert.equal(canonicalize(n), n);
  assert.equal(canonicalize("-0"), "0");
  assert.equal(canonicalize("\ufeff[true,false,null]"), "[true,false,null]");
});

test("§2 canonical JSON: what is refused", () => {
  for (const bad of [
    '{"a":1,"\\u0061":2}', // a duplicate key after unescaping
    '"\\ud800"', // a lone surrogate
    "1e99999", // past a long double
    "[1] x", // trailing text
    "NaN",
    "[1,]",
    "// c\n1",
    '"a\u0000"',
    "01",
    "[".repeat(65) + "]".repeat(65), // deeper than 64 levels
  ])
    assert.throws(() => canonicalize(bad), undefined, bad);
  assert.equal(canonicalize("[".repeat(64) + "]".repeat(64)), "[".repeat(64) + "]".repeat(64));
  assert.equal(canonicalize("1.18e4932"), "1.18e4932");
  assert.throws(() => canonicalize("1.19e4932"));
});

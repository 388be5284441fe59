// Decode-only timing of the npm package pg-logical-replication's pgoutput parser over a spockwire frame file.
//
//     NODE_PATH=out/node/node_modules node benchmarks/node_peer.js out/bench-cache/.../narrow.text.spwf 3
//
// The file's frame records are split into per-message Buffers first (what the package's replication stream hands
// to the parser), then every message goes through PgoutputPlugin.parse() once per round. Prints one JSON object:
// best and all round times in seconds (process.hrtime), the row changes seen and the package version.
'use strict';

const fs = require('fs');
const path = require('path');
const { PgoutputPlugin } = require('pg-logical-replication');

function payloads(file) {
  const data = fs.readFileSync(file);
  if (data.subarray(0, 8).toString('latin1') !== 'SPWFRAME') throw new Error(`${file} is not a frame file`);
  let pos = 14 + data.readUInt32BE(10); // magic, u16 version, u32 header length, header
  const out = [];
  while (pos < data.length) {
    const length = data.readUInt32BE(pos);
    out.push(data.subarray(pos + 12, pos + 12 + length)); // u32 length, u64 lsn, payload
    pos += 12 + length;
  }
  return { out, bytes: data.length };
}

function decodeAll(messages) {
  const plugin = new PgoutputPlugin({ protoVersion: 1, publicationNames: ['bench_pub'] });
  let rows = 0;
  for (const buf of messages) {
    const msg = plugin.parse(buf);
    if (msg.tag === 'insert' || msg.tag === 'update' || msg.tag === 'delete') rows += 1;
  }
  return rows;
}

function main() {
  const [file, roundsArg] = process.argv.slice(2);
  const rounds = Number(roundsArg || 3);
  const { out: messages } = payloads(file);
  decodeAll(messages); // warm-up: lets the JIT compile the parser
  const times = [];
  let rows = 0;
  for (let i = 0; i < rounds; i++) {
    const t0 = process.hrtime.bigint();
    rows = decodeAll(messages);
    times.push(Number(process.hrtime.bigint() - t0) / 1e9);
  }
  const pkgFile = require.resolve('pg-logical-replication/package.json');
  const version = JSON.parse(fs.readFileSync(pkgFile, 'utf8')).version;
  process.stdout.write(JSON.stringify({
    best_seconds: Math.min(...times), times, rows, messages: messages.length,
    payload_bytes: messages.reduce((n, b) => n + b.length, 0), node: process.version,
    package: `pg-logical-replication ${version}`, file: path.basename(file),
  }) + '\n');
}

main();

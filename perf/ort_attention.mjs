#!/usr/bin/env node
// Exact attention O = softmax(Q K^T / sqrt(D)) V on ONNX Runtime's CPU execution provider
// (npm package onnxruntime-node), single-threaded: the CPU peer of kfa that has a flash
// attention of its own (docs/performance.md). perf/compare_attention.py runs it as the
// impls `ort` (--variant flash) and `ort-unfused` (--variant unfused), forward, float32.
//
// The ONNX model is built in this file (hand-encoded protobuf), so it needs no python and no
// npm package besides onnxruntime-node. Variants:
//   flash    (default) ORT's fused MLAS flash-attention kernels, which never hold an
//            N x N score matrix: com.microsoft MultiHeadAttention for non-causal
//            (onnxruntime-node >= 1.19.0), com.microsoft GroupQueryAttention (always
//            causal, num_heads = kv_num_heads = H) for causal (>= 1.29.0).
//   mha      com.microsoft MultiHeadAttention; with --causal 1 it sets unidirectional=1,
//            which makes ORT leave the flash path and materialise B*H*N*N probabilities.
//   gqa      com.microsoft GroupQueryAttention (causal only).
//   onnx     ONNX-standard Attention (opset 23), 4-D inputs, is_causal attribute
//            (materialises the scores on CPU as of 1.30.0).
//   unfused  plain graph: Transpose, MatMul, Mul(scale), [Add(causal mask)], Softmax, MatMul.
// Session: CPU EP, intraOpNumThreads = interOpNumThreads = 1, sequential, so it compares with
// kfa, the unfused baseline and PyTorch on one core. For an A/B check of the fused path,
// ORT_DISABLE_FLASH_ATTENTION=1 (MultiHeadAttention) and ORT_GQA_DISABLE_FLASH_ATTENTION=1
// (GroupQueryAttention) turn it off: peak RSS then grows by about B*H*N*N*4 bytes.
//
// Install onnxruntime-node outside the repository (--ignore-scripts: its postinstall step
// fetches CUDA libraries; the CPU libraries ship in the package):
//   npm install --prefix ~/.cache/kfa-peers/onnxruntime --ignore-scripts --no-audit --no-fund \
//       onnxruntime-node@1.30.0
// Usage:
//   node perf/ort_attention.mjs [--ort-prefix DIR] [--variant flash|mha|gqa|onnx|unfused]
//        [--B 1] [--H 4] [--N 4096] [--D 64] [--causal 0|1] [--warmup 1] [--repeat 3]
//        [--min-time 0] [--check-rows 8] [--opt all|extended|basic|disabled] [--seed 1]
// DIR is the --prefix given to npm install: default $ORT_PREFIX, else
// ~/.cache/kfa-peers/onnxruntime where onnxruntime-node is installed there, else
// onnxruntime-node is resolved from this file as usual.
// Prints one JSON line on stdout: timings over the timed runs (at least --repeat, and until
// --min-time seconds have been timed, after --warmup untimed runs): min, median and mean
// seconds and GFLOP/s at each; the max abs error of --check-rows output rows against a float64
// JS reference; and the process's peak RSS. FLOPs as kfa counts them (docs/performance.md):
// 4*B*H*D per visible (query, key) pair, N*N pairs, N*(N+1)/2 when causal.
// Exit status 1 if the check fails (max abs error >= 1e-3), 2 on errors, 3 when
// onnxruntime-node cannot be loaded.

import { createRequire } from 'node:module';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';

// ---------------------------------------------------------------- arguments
const USAGE = `usage: node ort_attention.mjs [--ort-prefix DIR] [--variant flash|mha|gqa|onnx|unfused]
  [--B 1] [--H 4] [--N 4096] [--D 64] [--causal 0|1] [--warmup 1] [--repeat 3]
  [--min-time 0] [--check-rows 8] [--opt all|extended|basic|disabled] [--seed 1]
`;
const DEFAULT_PREFIX = path.join(os.homedir(), '.cache', 'kfa-peers', 'onnxruntime');
const INSTALL = 'npm install --prefix DIR --ignore-scripts --no-audit --no-fund onnxruntime-node@1.30.0';
function parseArgs(argv) {
  const a = {
    'ort-prefix': process.env.ORT_PREFIX || '',
    variant: 'flash', B: 1, H: 4, N: 4096, D: 64, causal: 0,
    warmup: 1, repeat: 3, 'min-time': 0, 'check-rows': 8, opt: 'all', seed: 1,
  };
  for (let i = 0; i < argv.length; i++) {
    let k = argv[i];
    if (k === '--help' || k === '-h') { process.stdout.write(USAGE); process.exit(0); }
    if (!k.startsWith('--')) throw new Error(`unexpected argument ${k}`);
    k = k.slice(2);
    let v;
    const eq = k.indexOf('=');
    if (eq >= 0) { v = k.slice(eq + 1); k = k.slice(0, eq); } else { v = argv[++i]; }
    if (!(k in a)) throw new Error(`unknown option --${k}`);
    if (v === undefined) throw new Error(`--${k} needs a value`);
    a[k] = typeof a[k] === 'number' ? Number(v) : v;
  }
  for (const k of ['B', 'H', 'N', 'D', 'warmup', 'repeat', 'check-rows', 'seed']) {
    if (!Number.isInteger(a[k]) || a[k] < 0) throw new Error(`--${k} must be a non-negative integer`);
  }
  if (a.B < 1 || a.H < 1 || a.N < 1 || a.D < 1 || a.repeat < 1) throw new Error('B, H, N, D, repeat must be >= 1');
  if (!(a['min-time'] >= 0)) throw new Error('--min-time must be a number >= 0');
  a.causal = a.causal ? 1 : 0;
  return a;
}

// ---------------------------------------------------------------- protobuf writer
// Just enough of the protobuf wire format to emit an ONNX ModelProto.
function varint(v) {
  let x = BigInt.asUintN(64, BigInt(v));
  const out = [];
  do {
    let b = Number(x & 0x7fn);
    x >>= 7n;
    if (x !== 0n) b |= 0x80;
    out.push(b);
  } while (x !== 0n);
  return Buffer.from(out);
}
const key = (field, wire) => varint(field * 8 + wire);
const pInt = (field, v) => Buffer.concat([key(field, 0), varint(v)]);
const pBytes = (field, buf) => Buffer.concat([key(field, 2), varint(buf.length), buf]);
const pStr = (field, s) => pBytes(field, Buffer.from(s, 'utf8'));
const pF32 = (field, x) => { const b = Buffer.alloc(4); b.writeFloatLE(x); return Buffer.concat([key(field, 5), b]); };
const msg = (...parts) => Buffer.concat(parts.flat());

const FLOAT = 1, INT32 = 6, INT64 = 7;

// TensorProto: dims=1, data_type=2, name=8, raw_data=9
function tensorProto(name, elemType, dims, raw) {
  return msg(dims.map((d) => pInt(1, d)), pInt(2, elemType), pStr(8, name), pBytes(9, Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength)));
}
// ValueInfoProto{name=1, type=2: TypeProto{tensor_type=1: {elem_type=1, shape=2: {dim=1: {dim_value=1}}}}}
function valueInfo(name, elemType, dims) {
  const shape = msg(dims.map((d) => pBytes(1, pInt(1, d))));
  const tensorType = msg(pInt(1, elemType), pBytes(2, shape));
  return msg(pStr(1, name), pBytes(2, pBytes(1, tensorType)));
}
// AttributeProto: name=1, f=2, i=3, t=5, ints=8, type=20 (FLOAT=1, INT=2, TENSOR=4, INTS=7)
const attrInt = (name, v) => msg(pStr(1, name), pInt(3, v), pInt(20, 2));
const attrFloat = (name, v) => msg(pStr(1, name), pF32(2, v), pInt(20, 1));
const attrInts = (name, vs) => msg(pStr(1, name), vs.map((v) => pInt(8, v)), pInt(20, 7));
const attrTensor = (name, t) => msg(pStr(1, name), pBytes(5, t), pInt(20, 4));
// NodeProto: input=1, output=2, name=3, op_type=4, attribute=5, domain=7
function node(opType, inputs, outputs, attrs = [], domain = '') {
  return msg(inputs.map((s) => pStr(1, s)), outputs.map((s) => pStr(2, s)), pStr(3, `${opType}_${outputs[0]}`),
    pStr(4, opType), attrs.map((x) => pBytes(5, x)), domain ? pStr(7, domain) : []);
}
// GraphProto: node=1, name=2, initializer=5, input=11, output=12
// ModelProto: ir_version=1, producer_name=2, graph=7, opset_import=8 {domain=1, version=2}
function model({ nodes, inits = [], inputs, outputs, opsets, irVersion }) {
  const graph = msg(nodes.map((n) => pBytes(1, n)), pStr(2, 'attention'), inits.map((t) => pBytes(5, t)),
    inputs.map((v) => pBytes(11, v)), outputs.map((v) => pBytes(12, v)));
  return msg(pInt(1, irVersion), pStr(2, 'kfa-cpu-peer'), pBytes(7, graph),
    opsets.map(([domain, version]) => pBytes(8, msg(domain ? pStr(1, domain) : [], pInt(2, version)))));
}

// ---------------------------------------------------------------- graphs
// Returns { bytes, layout: 'bhnd' | 'bnhd', feeds(q,k,v) -> names, outName, op }
function buildModel(variant, B, H, N, D, causal) {
  const HD = H * D;
  const scale = 1 / Math.sqrt(D);
  if (variant === 'mha') {
    const attrs = [attrInt('num_heads', H)];
    if (causal) attrs.push(attrInt('unidirectional', 1));
    return {
      op: 'com.microsoft.MultiHeadAttention' + (causal ? ' (unidirectional=1)' : ''),
      layout: 'bnhd',
      bytes: model({
        nodes: [node('MultiHeadAttention', ['Q', 'K', 'V'], ['O'], attrs, 'com.microsoft')],
        inputs: ['Q', 'K', 'V'].map((n) => valueInfo(n, FLOAT, [B, N, HD])),
        outputs: [valueInfo('O', FLOAT, [B, N, HD])],
        opsets: [['', 17], ['com.microsoft', 1]], irVersion: 8,
      }),
    };
  }
  if (variant === 'gqa') {
    if (!causal) throw new Error('GroupQueryAttention is always causal: use --causal 1 (or --variant mha for non-causal)');
    // Prompt without past: seqlens_k[b] = total_len - 1, total_sequence_length = N.
    const seqlens = tensorProto('seqlens_k', INT32, [B], new Int32Array(B).fill(N - 1));
    const total = tensorProto('total_seq', INT32, [], new Int32Array([N]));
    return {
      op: 'com.microsoft.GroupQueryAttention (num_heads=kv_num_heads)',
      layout: 'bnhd',
      bytes: model({
        nodes: [node('GroupQueryAttention', ['Q', 'K', 'V', '', '', 'seqlens_k', 'total_seq'], ['O', 'present_k', 'present_v'],
          [attrInt('num_heads', H), attrInt('kv_num_heads', H)], 'com.microsoft')],
        inits: [seqlens, total],
        inputs: ['Q', 'K', 'V'].map((n) => valueInfo(n, FLOAT, [B, N, HD])),
        outputs: [valueInfo('O', FLOAT, [B, N, HD]), valueInfo('present_k', FLOAT, [B, H, N, D]), valueInfo('present_v', FLOAT, [B, H, N, D])],
        opsets: [['', 17], ['com.microsoft', 1]], irVersion: 8,
      }),
    };
  }
  if (variant === 'onnx') {
    return {
      op: 'ai.onnx.Attention (opset 23)' + (causal ? ' (is_causal=1)' : ''),
      layout: 'bhnd',
      bytes: model({
        nodes: [node('Attention', ['Q', 'K', 'V'], ['O'], [attrInt('is_causal', causal)])],
        inputs: ['Q', 'K', 'V'].map((n) => valueInfo(n, FLOAT, [B, H, N, D])),
        outputs: [valueInfo('O', FLOAT, [B, H, N, D])],
        opsets: [['', 23]], irVersion: 11,
      }),
    };
  }
  if (variant === 'unfused') {
    const nodes = [
      node('Transpose', ['K'], ['Kt'], [attrInts('perm', [0, 1, 3, 2])]),
      node('MatMul', ['Q', 'Kt'], ['S']),
      node('Mul', ['S', 'scale'], ['Ss']),
    ];
    const inits = [tensorProto('scale', FLOAT, [], new Float32Array([scale]))];
    let logits = 'Ss';
    if (causal) {
      // mask = Trilu(full(N, N, -inf), upper=1, k=1): -inf strictly above the diagonal, 0 elsewhere.
      inits.push(tensorProto('mask_shape', INT64, [2], new BigInt64Array([BigInt(N), BigInt(N)])));
      inits.push(tensorProto('one', INT64, [], new BigInt64Array([1n])));
      nodes.push(node('ConstantOfShape', ['mask_shape'], ['neg_inf'],
        [attrTensor('value', tensorProto('value', FLOAT, [1], new Float32Array([-Infinity])))]));
      nodes.push(node('Trilu', ['neg_inf', 'one'], ['mask'], [attrInt('upper', 1)]));
      nodes.push(node('Add', ['Ss', 'mask'], ['Sm']));
      logits = 'Sm';
    }
    nodes.push(node('Softmax', [logits], ['P'], [attrInt('axis', 3)]));
    nodes.push(node('MatMul', ['P', 'V'], ['O']));
    return {
      op: 'MatMul+Softmax+MatMul (unfused)',
      layout: 'bhnd',
      bytes: model({
        nodes, inits,
        inputs: ['Q', 'K', 'V'].map((n) => valueInfo(n, FLOAT, [B, H, N, D])),
        outputs: [valueInfo('O', FLOAT, [B, H, N, D])],
        opsets: [['', 17]], irVersion: 8,
      }),
    };
  }
  throw new Error(`unknown variant ${variant}`);
}

// ---------------------------------------------------------------- data + reference
function mulberry32(seed) {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
function randn(count, rng) {
  const a = new Float32Array(count);
  for (let i = 0; i < count; i += 2) {
    const u = 1 - rng(), v = rng();
    const r = Math.sqrt(-2 * Math.log(u));
    a[i] = r * Math.cos(2 * Math.PI * v);
    if (i + 1 < count) a[i + 1] = r * Math.sin(2 * Math.PI * v);
  }
  return a;
}
// logical layout is [B, H, N, D]; 'bnhd' is [B, N, H*D]
const idx = (layout, B, H, N, D, b, h, i, d) =>
  layout === 'bhnd' ? ((b * H + h) * N + i) * D + d : ((b * N + i) * H + h) * D + d;
function toBNHD(x, B, H, N, D) {
  const y = new Float32Array(x.length);
  for (let b = 0; b < B; b++) for (let h = 0; h < H; h++) for (let i = 0; i < N; i++) {
    const src = ((b * H + h) * N + i) * D, dst = ((b * N + i) * H + h) * D;
    y.set(x.subarray(src, src + D), dst);
  }
  return y;
}
function referenceRow(q, k, v, B, H, N, D, b, h, i, causal) {
  const base = (b * H + h) * N * D, scale = 1 / Math.sqrt(D);
  const L = causal ? i + 1 : N;
  const s = new Float64Array(L);
  let mx = -Infinity;
  for (let j = 0; j < L; j++) {
    let acc = 0;
    for (let d = 0; d < D; d++) acc += q[base + i * D + d] * k[base + j * D + d];
    s[j] = acc * scale;
    if (s[j] > mx) mx = s[j];
  }
  let sum = 0;
  for (let j = 0; j < L; j++) { s[j] = Math.exp(s[j] - mx); sum += s[j]; }
  const o = new Float64Array(D);
  for (let j = 0; j < L; j++) {
    const p = s[j] / sum;
    for (let d = 0; d < D; d++) o[d] += p * v[base + j * D + d];
  }
  return o;
}

// ---------------------------------------------------------------- main
async function main() {
  const a = parseArgs(process.argv.slice(2));
  // Resolve onnxruntime-node as if required from a file in DIR/node_modules.
  let prefix = a['ort-prefix'];
  if (!prefix && fs.existsSync(path.join(DEFAULT_PREFIX, 'node_modules', 'onnxruntime-node'))) prefix = DEFAULT_PREFIX;
  const req = prefix
    ? createRequire(path.join(path.resolve(prefix), 'node_modules', 'noop.js'))
    : createRequire(import.meta.url);
  let ort, ortVersion;
  try {
    ort = req('onnxruntime-node');
    ortVersion = req('onnxruntime-node/package.json').version;
  } catch (e) {
    console.error(`error: cannot load onnxruntime-node${prefix ? ` from ${path.resolve(prefix)}` : ''}: ${e.message.split('\n')[0]}\n` +
      `install it with: ${INSTALL.replace('DIR', prefix || DEFAULT_PREFIX)}`);
    process.exit(3);
  }

  const { B, H, N, D, causal } = a;
  const variant = a.variant === 'flash' ? (causal ? 'gqa' : 'mha') : a.variant;
  const m = buildModel(variant, B, H, N, D, causal);

  const rng = mulberry32(a.seed);
  const count = B * H * N * D;
  const q = randn(count, rng), k = randn(count, rng), v = randn(count, rng);
  const dims = m.layout === 'bhnd' ? [B, H, N, D] : [B, N, H * D];
  const feedData = m.layout === 'bhnd' ? [q, k, v] : [q, k, v].map((x) => toBNHD(x, B, H, N, D));
  const feeds = {
    Q: new ort.Tensor('float32', feedData[0], dims),
    K: new ort.Tensor('float32', feedData[1], dims),
    V: new ort.Tensor('float32', feedData[2], dims),
  };

  const session = await ort.InferenceSession.create(m.bytes, {
    executionProviders: ['cpu'],
    intraOpNumThreads: 1,
    interOpNumThreads: 1,
    executionMode: 'sequential',
    graphOptimizationLevel: a.opt,
  });

  const run = async () => (await session.run(feeds, ['O'])).O.data;

  // warmup (its output is the one checked)
  let out = null;
  for (let w = 0; w < a.warmup; w++) out = await run();
  // At least --repeat timed runs, and more until --min-time seconds have been timed (as Google
  // Benchmark and perf/torch_attention.py do), so short cases are not timed from one or two
  // runs.
  const times = [];
  let timed = 0;
  while (times.length < a.repeat || timed < a['min-time']) {
    const t0 = performance.now();
    const o = await run();
    times.push((performance.now() - t0) / 1e3);
    timed += times[times.length - 1];
    if (out === null) out = o;
  }

  // check a few rows against a float64 reference
  const rows = [];
  const rrng = mulberry32(a.seed + 12345);
  for (let c = 0; c < a['check-rows']; c++) {
    const b = c === 0 ? 0 : c === 1 ? B - 1 : Math.floor(rrng() * B);
    const h = c === 0 ? 0 : c === 1 ? H - 1 : Math.floor(rrng() * H);
    const i = c === 0 ? 0 : c === 1 ? N - 1 : Math.floor(rrng() * N);
    rows.push([b, h, i]);
  }
  let maxAbsErr = 0;
  for (const [b, h, i] of rows) {
    const ref = referenceRow(q, k, v, B, H, N, D, b, h, i, causal);
    for (let d = 0; d < D; d++) {
      const e = Math.abs(out[idx(m.layout, B, H, N, D, b, h, i, d)] - ref[d]);
      if (!(e <= maxAbsErr)) maxAbsErr = e; // NaN propagates
    }
  }

  const sorted = [...times].sort((x, y) => x - y);
  const median = sorted.length % 2 ? sorted[(sorted.length - 1) >> 1]
    : 0.5 * (sorted[sorted.length / 2 - 1] + sorted[sorted.length / 2]);
  const mean = timed / times.length;
  // kfa::forward_flops: 4 * B * H * D per visible (query, key) pair.
  const flops = 4 * B * H * D * (causal ? N * (N + 1) / 2 : N * N);
  // Whether this ORT build should take its fused MLAS flash kernel for this graph (from ORT's
  // source and measured peak RSS): MultiHeadAttention without unidirectional since 1.19.0,
  // GroupQueryAttention fp32 since 1.29.0; ONNX Attention and the unfused graph never.
  const [maj, min] = ortVersion.split('.').map(Number);
  const atLeast = (x) => maj > 1 || (maj === 1 && min >= x);
  const flashExpected = (variant === 'mha' && !causal && atLeast(19)) || (variant === 'gqa' && atLeast(29));
  const result = {
    peer: 'onnxruntime-node', ort_version: ortVersion, variant, op: m.op,
    B, H, N, D, causal, dtype: 'float32', threads: 1,
    node_version: process.versions.node, warmup: a.warmup, repeat: times.length,
    min_s: +sorted[0].toPrecision(6), median_s: +median.toPrecision(6), mean_s: +mean.toPrecision(6),
    flops, gflops_at_min: +(flops / sorted[0] / 1e9).toFixed(3), gflops_at_median: +(flops / median / 1e9).toFixed(3),
    gflops_at_mean: +(flops / mean / 1e9).toFixed(3),
    mlas_flash_expected: flashExpected,
    rows_checked: rows.length, max_abs_err: maxAbsErr,
    max_rss_mib: +(process.resourceUsage().maxRSS / 1024).toFixed(1),
    ok: Number.isFinite(maxAbsErr) && maxAbsErr < 1e-3,
  };
  process.stdout.write(JSON.stringify(result) + '\n');
  if (!result.ok) process.exitCode = 1;
}

main().catch((e) => {
  console.error(process.env.ORT_ATTENTION_DEBUG ? e.stack : `error: ${e && e.message ? e.message : e}\n${USAGE}`);
  process.exit(2);
});

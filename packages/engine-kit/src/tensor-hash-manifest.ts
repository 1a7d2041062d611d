// Remembers a checkpoint's per-tensor sha-256 and its model fingerprint between runs, so a warm
// start and a delta plan need not re-hash every weight. The record lives in the artifact cache
// (never in the model folder, which may be read-only), keyed by the folder's real path, and is
// trusted only while every file it covers keeps its size, mtime and inode (git's index rule);
// otherwise the checkpoint is hashed again by @airm/llama and the record rewritten.

import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, readdirSync, realpathSync, renameSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { CpuCheckpoint } from "./cpu-model.ts";
import type { HashedTensors } from "./delta-plan.ts";

const FORMAT = "airm-tensor-hashes/1";

interface FileStamp {
  file: string;
  size: number;
  mtimeMs: number;
  ino: number;
}

interface HashRecord {
  format: string;
  path: string;
  files: FileStamp[];
  fingerprint: string;
  tensors: Record<string, { dtype: string; shape: number[]; sha256: string }>;
}

/** A checkpoint's identity: its fingerprint and per-tensor hashes, and where they came from. */
export interface CheckpointHashes extends HashedTensors {
  fingerprint: string;
  /** `record`: from a still-valid record (no tensor read); `hashed`: every tensor was hashed now. */
  from: "record" | "hashed";
}

/** The files whose bytes decide the checkpoint: config, safetensors shards, the shard index. */
function stamps(dir: string): FileStamp[] {
  const names = readdirSync(dir)
    .filter((f) => f === "config.json" || f.endsWith(".safetensors") || f === "model.safetensors.index.json" || f.endsWith(".gguf"))
    .sort();
  return names.map((file) => {
    const st = statSync(join(dir, file));
    return { file, size: st.size, mtimeMs: st.mtimeMs, ino: st.ino };
  });
}

function recordFile(cacheDir: string, realDir: string): string {
  return join(cacheDir, "tensor-hashes", `${createHash("sha256").update(realDir).digest("hex")}.json`);
}

function sameTensors(record: HashRecord, ckpt: CpuCheckpoint): boolean {
  const list = ckpt.tensors.list();
  if (list.length !== Object.keys(record.tensors).length) return false;
  return list.every((t) => {
    const r = record.tensors[t.name];
    return r !== undefined && r.dtype === t.dtype && r.shape.join("x") === t.shape.join("x");
  });
}

/**
 * The fingerprint and per-tensor hashes of `ckpt` (a folder checkpoint). Uses the record under
 * `cacheDir` when every covered file is unchanged; otherwise hashes the checkpoint through
 * @airm/llama (`ckpt.fingerprint`, `tensors.sha256`) and stores a fresh record. With
 * `cacheDir` null it always hashes. Never throws for a bad or foreign record (it is ignored).
 */
export function checkpointHashes(ckpt: CpuCheckpoint, cacheDir: string | null): CheckpointHashes {
  const list = () => ckpt.tensors.list();
  let dir: string | null = null;
  try {
    if (statSync(ckpt.path).isDirectory()) dir = realpathSync(ckpt.path);
  } catch {
    dir = null;
  }
  const file = cacheDir && dir ? recordFile(cacheDir, dir) : null;
  const now = dir ? stamps(dir) : [];
  if (file && existsSync(file)) {
    try {
      const record = JSON.parse(readFileSync(file, "utf8")) as HashRecord;
      if (record.format === FORMAT && record.path === dir && JSON.stringify(record.files) === JSON.stringify(now) && sameTensors(record, ckpt)) {
        return { fingerprint: record.fingerprint, list, sha256: (name) => record.tensors[name]?.sha256 ?? ckpt.tensors.sha256(name), from: "record" };
      }
    } catch {
      // unreadable record: hash again and replace it
    }
  }
  const fingerprint = ckpt.fingerprint; // hashes every tensor (cached per tensor by the source)
  if (file && dir) {
    const record: HashRecord = {
      format: FORMAT,
      path: dir,
      files: now,
      fingerprint,
      tensors: Object.fromEntries(list().map((t) => [t.name, { dtype: t.dtype, shape: t.shape, sha256: ckpt.tensors.sha256(t.name) }])),
    };
    try {
      mkdirSync(join(cacheDir!, "tensor-hashes"), { recursive: true });
      const tmp = `${file}.${process.pid}.tmp`;
      writeFileSync(tmp, JSON.stringify(record));
      renameSync(tmp, file);
    } catch {
      // a read-only cache folder: the next start hashes again
    }
  }
  return { fingerprint, list, sha256: (name) => ckpt.tensors.sha256(name), from: "hashed" };
}

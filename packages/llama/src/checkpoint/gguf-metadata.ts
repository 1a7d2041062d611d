// Typed reads of a GGUF file's metadata, shared by the checkpoint loader and the GGUF tokenizer.
import type { GgufFile, GgufValue } from "./gguf-file.ts";
import { ModelLoadError } from "./model-load-error.ts";

/** Reads GGUF metadata with typed accessors that name the file and key on errors. */
export class GgufMetadata {
  constructor(private readonly file: GgufFile) {}
  has(key: string): boolean {
    return this.file.metadata.has(key);
  }
  raw(key: string): GgufValue | undefined {
    return this.file.metadata.get(key);
  }
  private missing(key: string): never {
    throw new ModelLoadError(this.file.path, `metadata key "${key}" is missing`, { item: key });
  }
  int(key: string, fallback?: number): number {
    const v = this.file.metadata.get(key);
    if (v === undefined) return fallback ?? this.missing(key);
    const n = typeof v === "bigint" ? Number(v) : v;
    if (typeof n !== "number" || !Number.isSafeInteger(n) || n < 0)
      throw new ModelLoadError(this.file.path, `metadata key "${key}" must be a non-negative integer, got ${String(v)}`, { item: key });
    return n;
  }
  num(key: string, fallback?: number): number {
    const v = this.file.metadata.get(key);
    if (v === undefined) return fallback ?? this.missing(key);
    const n = typeof v === "bigint" ? Number(v) : v;
    if (typeof n !== "number" || !Number.isFinite(n)) throw new ModelLoadError(this.file.path, `metadata key "${key}" must be a number, got ${String(v)}`, { item: key });
    return n;
  }
  str(key: string, fallback?: string): string {
    const v = this.file.metadata.get(key);
    if (v === undefined) return fallback ?? this.missing(key);
    if (typeof v !== "string") throw new ModelLoadError(this.file.path, `metadata key "${key}" must be a string`, { item: key });
    return v;
  }
  bool(key: string, fallback: boolean): boolean {
    const v = this.file.metadata.get(key);
    return typeof v === "boolean" ? v : fallback;
  }
  strings(key: string): string[] {
    const v = this.file.metadata.get(key);
    if (v === undefined) this.missing(key);
    if (!Array.isArray(v) || !v.every((s) => typeof s === "string")) throw new ModelLoadError(this.file.path, `metadata key "${key}" must be an array of strings`, { item: key });
    return v as string[];
  }
  ints(key: string): number[] | undefined {
    const v = this.file.metadata.get(key);
    if (v === undefined) return undefined;
    if (!Array.isArray(v)) throw new ModelLoadError(this.file.path, `metadata key "${key}" must be an array of integers`, { item: key });
    return v.map((x) => Number(x));
  }
}

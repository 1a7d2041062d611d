// The few WebAssembly JS-API types the kernels use. Node 20's type definitions do not declare
// the WebAssembly global without the DOM lib, so it is typed here and read from globalThis.

export interface WasmModule {
  readonly __wasmModule?: never;
}

export interface WasmMemory {
  readonly buffer: ArrayBuffer | SharedArrayBuffer;
  grow(deltaPages: number): number;
}

export interface WasmInstance {
  readonly exports: Record<string, unknown>;
}

interface WasmApi {
  compile(bytes: Uint8Array): Promise<WasmModule>;
  instantiate(module: WasmModule, imports: Record<string, Record<string, unknown>>): Promise<WasmInstance>;
  Memory: new (descriptor: { initial: number; maximum?: number; shared?: boolean }) => WasmMemory;
}

export const wasmApi = (globalThis as unknown as { WebAssembly: WasmApi }).WebAssembly;

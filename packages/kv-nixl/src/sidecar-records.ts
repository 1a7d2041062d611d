// The NIXL agent sidecar's records and messages (sidecar.ts and its parts): the gRPC messages it
// reads, what it holds of arenas, publications, bound / planned / submitted copies, the descriptor
// it announces in the relay for other hosts, and the error that carries a gRPC status code.

import { status } from "@grpc/grpc-js";
import type { AllocationMsg } from "./protos.ts";

export interface PublishMsg {
  key: string;
  src: AllocationMsg;
  crc32: number;
  instance: string;
}
export interface CopyMsg {
  request_id: string;
  src: AllocationMsg;
  dst: AllocationMsg;
  context: string;
}
export interface SessionIn {
  kind: string;
  watch: { request_id: string; timeout_ms: number } | null;
  request_id: string;
  copy: { id: string; copies: CopyMsg[]; timeout_ms: number } | null;
  want: { key: string; timeout_ms: number } | null;
}
export interface ArenaRec {
  id: number;
  path: string;
  bytes: bigint;
  base: bigint;
  owner: string;
}
export interface Alloc {
  tier: string;
  agent: string;
  arena: number;
  offset: bigint;
  length: bigint;
}
/** What a producer's sidecar announces in the relay for each publication (cross-host). */
export interface Descriptor {
  v: 1;
  /** The producer's agent, its sidecar's instance and metadata generation (+1 per registered arena). */
  agent: string;
  instance: string;
  gen: number;
  /** host:port of the producer's sidecar (Metadata, Consumed). */
  peer: string;
  /** Address of the arena's first byte in the producer's agent. */
  base: string;
  src: AllocationMsg;
  crc32: number;
}

/** The relay key of `key`'s descriptor (same request id, so releasing the request drops it). */
export const descriptorKey = (key: string): string => `${key}/nixl-desc`;

export function parseDescriptor(raw: Uint8Array, key: string): Descriptor {
  const d = JSON.parse(Buffer.from(raw).toString("utf8")) as Descriptor;
  if (d?.v !== 1 || typeof d.agent !== "string" || typeof d.peer !== "string" || typeof d.base !== "string" || typeof d.src !== "object" || typeof d.crc32 !== "number")
    throw new RpcError(status.DATA_LOSS, `the relay's descriptor of ${key} is not a kv-nixl descriptor (v1)`);
  return d;
}

export interface PubRec {
  key: string;
  src: Alloc;
  crc32: number;
  at: number;
  owner: string;
}
export interface BindRec {
  id: bigint;
  src: Alloc;
  dst: Alloc;
  context: string;
  planned: boolean;
}
export interface PlanRec {
  id: bigint;
  requestId: string;
  copies: BindRec[];
  bytes: bigint;
}
export interface HandleRec {
  id: bigint;
  plan: PlanRec;
  state: "PENDING" | "DONE" | "ERROR";
  reason: string;
  waiters: (() => void)[];
}

export class RpcError extends Error {
  constructor(
    readonly code: status,
    message: string,
  ) {
    super(message);
  }
}

export const toAlloc = (m: AllocationMsg | undefined, what: string): Alloc => {
  if (!m) throw new RpcError(status.INVALID_ARGUMENT, `${what}: an allocation is required`);
  return { tier: m.tier, agent: m.agent, arena: Number(m.arena), offset: BigInt(m.offset), length: BigInt(m.length) };
};
export const fromAlloc = (a: Alloc): AllocationMsg => ({ tier: a.tier, agent: a.agent, arena: a.arena, offset: a.offset.toString(), length: a.length.toString() });

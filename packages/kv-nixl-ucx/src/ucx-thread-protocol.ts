// Messages between the main thread (ucx-engine.ts) and the UCX progress thread (ucx-thread.ts).
// Plain structured-clone data; offsets are relative to the thread's registered arena.

import type { MessagePort } from "node:worker_threads";

export interface ThreadInit {
  port: MessagePort;
  /** eventfd the main thread writes to wake the thread from its sleep. */
  wakeFd: number;
  poolBytes: number;
  tls?: string;
  config?: Record<string, string>;
  errMode: "auto" | "peer" | "none";
  /** Keep polling this long after the last activity before sleeping on the event fd (ms). */
  spinMs: number;
}

/** A producer as the thread connects to it; cached by id. */
export interface PeerRef {
  id: string;
  address: Uint8Array;
  rkey: Uint8Array;
}

export type ThreadCommand =
  | { type: "get"; id: number; peer: PeerRef; remoteAddr: number; length: number; localOffset: number }
  | { type: "ack"; id: number; peer: PeerRef; ackAddr: number; localOffset: number }
  | { type: "abort"; id: number }
  | { type: "forget-peer"; peerId: string }
  | { type: "close" };

export type ThreadEvent =
  | {
      type: "ready";
      version: string;
      address: Uint8Array;
      rkey: Uint8Array;
      base: number;
      length: number;
      resources: string[];
      errMode: "peer" | "none";
    }
  | { type: "failed"; message: string }
  /** `crc`: CRC-32 of the destination, for READs the thread could check while copying. */
  | { type: "done"; id: number; status: number; message?: string; stuck?: boolean; crc?: number }
  | { type: "closed" };

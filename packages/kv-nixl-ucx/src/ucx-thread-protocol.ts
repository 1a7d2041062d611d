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
  /**
   * One Int32 the thread sets to 1 while it sleeps on the event fd (0 while it polls): the main
   * thread writes the wake-up eventfd only when it is 1, so commands to a busy thread cost no syscall.
   */
  sleeping: SharedArrayBuffer;
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
  | { type: "closed" }
  /** Several events in one message (one per loop pass of the thread). */
  | { type: "batch"; events: ThreadEvent[] };

/** Commands go to the thread in batches: all those issued in one tick of the main thread. */
export type ThreadMessage = ThreadCommand[];

// Which parts of a cluster on one host have work right now: a small file with one 4-byte slot per
// part. Each part writes its own slot (1 while it has streams or prompts, 0 otherwise) and reads
// the whole file before a forward pass. A decode engine with two kernel threads runs the second
// one only while every other slot reads 0: a stream alone on the host gets both cores, and parts
// busy together never put more kernel threads than cores to work. A read or write is one
// positioned system call of a few bytes (microseconds, against passes of milliseconds).

import { closeSync, constants, openSync, readSync, writeSync } from "node:fs";
import { ConfigError } from "@airm/rm-core";

/** Most parts one board holds. */
export const CORE_BOARD_SLOTS = 64;

export interface CoreBoardSpec {
  path: string;
  slot: number;
}

/** Parses AIRM_CORE_BOARD's `FILE:SLOT`. */
export function parseCoreBoard(value: string): CoreBoardSpec {
  const m = /^(.+):(\d+)$/.exec(value);
  if (!m) throw new ConfigError("coreBoard", `expected FILE:SLOT (a file the parts of one host share, this part's slot), got "${value}"`);
  const slot = Number(m[2]);
  if (slot >= CORE_BOARD_SLOTS) throw new ConfigError("coreBoard", `slot ${slot} is past the board's ${CORE_BOARD_SLOTS} slots`);
  return { path: m[1]!, slot };
}

export class CoreBoard {
  private readonly all: Int32Array;
  private readonly mine = new Int32Array(1);
  private published = -1;

  private constructor(
    private readonly spec: CoreBoardSpec,
    private readonly fd: number,
  ) {
    this.all = new Int32Array(CORE_BOARD_SLOTS);
  }

  /**
   * Opens the board, making the file when no part has yet (a slot past its end reads as idle),
   * and publishes this part as idle.
   */
  static open(spec: CoreBoardSpec): CoreBoard {
    let fd: number;
    try {
      // read-write, made if missing, not O_APPEND (positioned writes must land at the slot)
      fd = openSync(spec.path, constants.O_RDWR | constants.O_CREAT, 0o644);
    } catch (e) {
      throw new ConfigError("coreBoard", `cannot open the core board ${spec.path}: ${(e as Error).message}`);
    }
    const board = new CoreBoard(spec, fd);
    board.publish(false);
    return board;
  }

  /** Writes this part's slot when it changed. */
  publish(busy: boolean): void {
    const v = busy ? 1 : 0;
    if (v === this.published) return;
    this.mine[0] = v;
    writeSync(this.fd, this.mine, 0, 4, this.spec.slot * 4);
    this.published = v;
  }

  /** True when any other slot says its part has work. */
  othersBusy(): boolean {
    const n = readSync(this.fd, this.all, 0, this.all.byteLength, 0);
    for (let i = 0; i < n >> 2; i++) if (i !== this.spec.slot && this.all[i] !== 0) return true;
    return false;
  }

  close(): void {
    try {
      this.publish(false);
    } finally {
      closeSync(this.fd);
    }
  }
}

// Goodput: the highest open-loop request rate whose SLO attainment stays at or above a target
// (90% by default). Doubles the rate from a start until a point misses, then bisects between the
// last rate that passed and the first that missed. Bounded: at most `maxPoints` load points.

export interface GoodputPoint {
  rate: number;
  attainment: number;
  passed: boolean;
}

export interface GoodputOptions {
  /** Measures one open-loop point and returns its attainment (0-1). */
  measure(rate: number): Promise<number>;
  startRate: number;
  target: number;
  /** Most load points to run (doubling and bisection together). */
  maxPoints: number;
  /** Stop bisecting once the bracket is narrower than this share of its upper end (default 0.1). */
  precision?: number;
}

/** The search's points and its answer: the highest rate that passed (0 when even the start missed). */
export async function searchGoodput(o: GoodputOptions): Promise<{ goodput: number; points: GoodputPoint[] }> {
  const points: GoodputPoint[] = [];
  const run = async (rate: number) => {
    const a = await o.measure(rate);
    const p = { rate, attainment: a, passed: a >= o.target };
    points.push(p);
    return p.passed;
  };
  let pass = 0;
  let fail = Number.POSITIVE_INFINITY;
  let rate = o.startRate;
  // Doubling until a miss (or the budget ends).
  while (points.length < o.maxPoints) {
    if (await run(rate)) {
      pass = rate;
      rate *= 2;
    } else {
      fail = rate;
      break;
    }
  }
  // Bisection of [pass, fail]; from 0 when the start rate itself missed.
  const precision = o.precision ?? 0.1;
  while (points.length < o.maxPoints && Number.isFinite(fail) && fail - pass > precision * fail) {
    const mid = (pass + fail) / 2;
    if (await run(mid)) pass = mid;
    else fail = mid;
  }
  return { goodput: pass, points };
}
